/**
 * Admin API tokens for automation: `orchadm_<id>_<secret><checksum>`, scoped
 * to a role (and tenant). `ORCHARD_ADMIN_TOKEN`, when set, is registered at
 * start as a platform-admin token, stored hashed like the others.
 */
import { checksum6, hmac, randomBase62, safeEqual } from "../lib/crypto.ts";
import { addAudit } from "./audit.ts";
import { NotFoundError, ValidationError } from "./errors.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { listPage, type Page, type PageOptions } from "./pagination.ts";
import {
  type Principal,
  requirePlatform,
  requireTenantWrite,
  type Role,
} from "./principal.ts";
import type { Store } from "./store.ts";

/** A stored admin token (never the secret). */
export interface AdminToken {
  id: string;
  name: string;
  hash: string;
  role: Role;
  tenantId: string | null;
  createdAt: string;
  revokedAt: string | null;
}

const ENV_TOKEN_ID = "env";
const TOKEN_RE = /^orchadm_([0-9a-z]{26})_([0-9A-Za-z]{32})([0-9A-Za-z]{6})$/;

/** Creates an admin token; the returned `token` is shown once. */
export async function createAdminToken(
  store: Store,
  p: Principal,
  input: { name: string; role: Role; tenantId: string | null },
): Promise<{ token: string; record: Omit<AdminToken, "hash"> }> {
  const name = input.name?.trim();
  if (!name || name.length > 100) {
    throw new ValidationError("Name must be 1–100 characters", "name");
  }
  if (input.role === "platform_admin") requirePlatform(p);
  else if (!input.tenantId) {
    throw new ValidationError("Choose a tenant", "tenantId");
  } else requireTenantWrite(p, input.tenantId);
  const id = newId();
  const secret = randomBase62(32);
  const body = `orchadm_${id}_${secret}`;
  const record: AdminToken = {
    id,
    name,
    hash: await hmac(store.secrets.pepper, secret),
    role: input.role,
    tenantId: input.role === "platform_admin" ? null : input.tenantId,
    createdAt: new Date().toISOString(),
    revokedAt: null,
  };
  const { hash: _h, ...shown } = record;
  const op = store.kv.atomic().set(k.adminToken(id), record);
  addAudit(op, p, {
    action: "admin_token.create",
    target: { type: "admin_token", id, label: name },
    tenantId: record.tenantId,
    after: shown,
  });
  await op.commit();
  return { token: body + checksum6(body), record: shown };
}

/** Lists admin tokens (platform admins only). */
export function listAdminTokens(
  store: Store,
  p: Principal,
  opts: PageOptions = {},
): Promise<Page<Omit<AdminToken, "hash">>> {
  requirePlatform(p);
  return listPage<AdminToken, Omit<AdminToken, "hash">>(
    store.kv,
    { prefix: k.adminTokenPrefix() },
    opts,
    ({ hash: _h, ...rest }) => rest,
  );
}

/** Revokes an admin token. */
export async function revokeAdminToken(
  store: Store,
  p: Principal,
  id: string,
): Promise<void> {
  requirePlatform(p);
  const e = await store.kv.get<AdminToken>(k.adminToken(id));
  if (!e.value) throw new NotFoundError("Admin token");
  const op = store.kv.atomic().check(e).set(k.adminToken(id), {
    ...e.value,
    revokedAt: new Date().toISOString(),
  });
  addAudit(op, p, {
    action: "admin_token.revoke",
    target: { type: "admin_token", id, label: e.value.name },
    tenantId: e.value.tenantId,
  });
  await op.commit();
}

/** Registers (or replaces) the `ORCHARD_ADMIN_TOKEN` from the environment, hashed. */
export async function registerEnvAdminToken(
  store: Store,
  token: string,
): Promise<void> {
  if (token.length < 24) {
    throw new Error(
      "Cannot use ORCHARD_ADMIN_TOKEN: it must be at least 24 characters",
    );
  }
  const record: AdminToken = {
    id: ENV_TOKEN_ID,
    name: "ORCHARD_ADMIN_TOKEN",
    hash: await hmac(store.secrets.pepper, token),
    role: "platform_admin",
    tenantId: null,
    createdAt: new Date().toISOString(),
    revokedAt: null,
  };
  await store.kv.set(k.adminToken(ENV_TOKEN_ID), record);
}

/** Verifies a bearer admin token; returns its principal or null. */
export async function verifyAdminToken(
  store: Store,
  raw: string,
  ip: string | null,
): Promise<Principal | null> {
  if (raw.length > 512) return null;
  let id = ENV_TOKEN_ID;
  let secret = raw;
  const m = TOKEN_RE.exec(raw);
  if (m) {
    const body = `orchadm_${m[1]}_${m[2]}`;
    if (!safeEqual(checksum6(body), m[3]!)) return null;
    id = m[1]!;
    secret = m[2]!;
  }
  const [entry, hash] = await Promise.all([
    store.kv.get<AdminToken>(k.adminToken(id)),
    hmac(store.secrets.pepper, secret),
  ]);
  const t = entry.value;
  if (!t || t.revokedAt || !safeEqual(t.hash, hash)) return null;
  return {
    kind: "token",
    id: t.id,
    label: t.name,
    role: t.role,
    tenantId: t.tenantId,
    ip,
  };
}
