/**
 * Admin API tokens for automation: `orchadm_<id>_<secret><checksum>`, scoped
 * to a role (and tenant), optionally expiring. Only a keyed hash of the
 * secret is stored; the token is returned once, at creation.
 * `ORCHARD_ADMIN_TOKEN`, when set, is registered at start as a
 * platform-admin token, stored hashed like the others.
 *
 * Who may manage them:
 *
 * | principal      | create                                    | list and revoke          |
 * | -------------- | ----------------------------------------- | ------------------------ |
 * | platform admin | any role; tenant roles for any tenant     | every token              |
 * | tenant admin   | tenant_admin or tenant_viewer, own tenant | its own tenant's tokens  |
 * | tenant viewer  | no (403)                                  | no (403)                 |
 *
 * Another tenant's tokens, and platform tokens for tenant principals,
 * answer 404.
 */
import { checksum6, hmac, randomBase62, safeEqual } from "../lib/crypto.ts";
import { addAudit } from "./audit.ts";
import {
  ConflictError,
  ForbiddenError,
  NotFoundError,
  ValidationError,
} from "./errors.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { listPage, type Page, type PageOptions } from "./pagination.ts";
import {
  isPlatform,
  type Principal,
  requirePlatform,
  requireTenantRead,
  requireTenantWrite,
  type Role,
} from "./principal.ts";
import { adminTokenCreateSchema, parse } from "./schemas.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";

/** A stored admin token (never the secret). */
export interface AdminToken {
  id: string;
  name: string;
  hash: string;
  role: Role;
  tenantId: string | null;
  createdAt: string;
  revokedAt: string | null;
  /** When it stops working; null (or absent on older records) = never. */
  expiresAt?: string | null;
  /** The principal id that created it; absent for `ORCHARD_ADMIN_TOKEN`. */
  createdBy?: string;
}

/** A token as listed: no hash, with when it was last used. */
export interface AdminTokenView {
  id: string;
  name: string;
  role: Role;
  tenantId: string | null;
  createdAt: string;
  createdBy: string | null;
  expiresAt: string | null;
  revokedAt: string | null;
  lastUsedAt: string | null;
}

const ENV_TOKEN_ID = "env";
const TOKEN_RE = /^orchadm_([0-9a-z]{26})_([0-9A-Za-z]{32})([0-9A-Za-z]{6})$/;
/** "Last used" is written at most this often per token and process. */
export const ADMIN_TOKEN_LAST_USED_EVERY_MS = 60_000;

function view(t: AdminToken, lastUsedAt: string | null): AdminTokenView {
  return {
    id: t.id,
    name: t.name,
    role: t.role,
    tenantId: t.tenantId,
    createdAt: t.createdAt,
    createdBy: t.createdBy ?? null,
    expiresAt: t.expiresAt ?? null,
    revokedAt: t.revokedAt,
    lastUsedAt,
  };
}

/** Throws unless `p` may manage the tokens of `tenantId` (404 other tenant, 403 viewer). */
function requireTokenManager(p: Principal, tenantId: string): void {
  requireTenantRead(p, tenantId, "Admin token");
  if (p.role === "tenant_viewer") {
    throw new ForbiddenError("Viewers cannot manage admin tokens");
  }
}

/** Creates an admin token; the returned `token` is shown once. */
export async function createAdminToken(
  store: Store,
  p: Principal,
  input: unknown,
): Promise<{ token: string; record: AdminTokenView }> {
  const data = parse(adminTokenCreateSchema, input);
  let tenantId: string | null = null;
  if (data.role === "platform_admin") requirePlatform(p);
  else {
    if (!data.tenantId) {
      throw new ValidationError("Choose a tenant", "tenantId");
    }
    requireTenantWrite(p, data.tenantId);
    if (!(await getTenantRaw(store, data.tenantId))) {
      throw new NotFoundError("Tenant");
    }
    tenantId = data.tenantId;
  }
  const id = newId();
  const secret = randomBase62(32);
  const body = `orchadm_${id}_${secret}`;
  const record: AdminToken = {
    id,
    name: data.name,
    hash: await hmac(store.secrets.pepper, secret),
    role: data.role,
    tenantId,
    createdAt: new Date().toISOString(),
    revokedAt: null,
    expiresAt: data.expiresAt ? new Date(data.expiresAt).toISOString() : null,
    createdBy: p.id,
  };
  const shown = view(record, null);
  const op = store.kv.atomic()
    .check({ key: k.adminToken(id), versionstamp: null })
    .set(k.adminToken(id), record);
  if (tenantId) op.set(k.tenantAdminToken(tenantId, id), id);
  addAudit(op, p, {
    action: "admin_token.create",
    target: { type: "admin_token", id, label: record.name },
    tenantId,
    after: shown,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("Could not create the token; try again");
  }
  return { token: body + checksum6(body), record: shown };
}

async function withLastUsed(
  store: Store,
  t: AdminToken | null,
): Promise<AdminTokenView | null> {
  if (!t) return null;
  const used = await store.kv.get<string>(k.adminTokenLastUsed(t.id));
  return view(t, used.value);
}

/**
 * Lists admin tokens, newest first: platform admins every token (or one
 * tenant's with `tenantId`), tenant admins their own tenant's.
 */
export async function listAdminTokens(
  store: Store,
  p: Principal,
  opts: PageOptions & { tenantId?: string | null } = {},
): Promise<Page<AdminTokenView>> {
  const tenantId = opts.tenantId ?? (isPlatform(p) ? null : p.tenantId);
  const pageOpts = { reverse: true, cursor: opts.cursor, limit: opts.limit };
  if (tenantId === null) {
    requirePlatform(p);
    return await listPage<AdminToken, AdminTokenView>(
      store.kv,
      { prefix: k.adminTokenPrefix() },
      pageOpts,
      (t) => withLastUsed(store, t),
    );
  }
  requireTokenManager(p, tenantId);
  return await listPage<string, AdminTokenView>(
    store.kv,
    { prefix: k.tenantAdminTokenPrefix(tenantId) },
    pageOpts,
    async (id) =>
      withLastUsed(
        store,
        (await store.kv.get<AdminToken>(k.adminToken(id))).value,
      ),
  );
}

/** Revokes an admin token; effective on its next use. Idempotent. */
export async function revokeAdminToken(
  store: Store,
  p: Principal,
  id: string,
): Promise<AdminTokenView> {
  const e = id.length <= 64
    ? await store.kv.get<AdminToken>(k.adminToken(id))
    : null;
  const t = e?.value;
  if (!e || !t) throw new NotFoundError("Admin token");
  if (t.tenantId) requireTokenManager(p, t.tenantId);
  else if (!isPlatform(p)) throw new NotFoundError("Admin token");
  const used = (await store.kv.get<string>(k.adminTokenLastUsed(id))).value;
  if (t.revokedAt) return view(t, used);
  const after: AdminToken = { ...t, revokedAt: new Date().toISOString() };
  const op = store.kv.atomic().check(e).set(k.adminToken(id), after);
  addAudit(op, p, {
    action: "admin_token.revoke",
    target: { type: "admin_token", id, label: t.name },
    tenantId: t.tenantId,
    before: view(t, used),
    after: view(after, used),
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The token changed meanwhile; try again");
  }
  return view(after, used);
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
    expiresAt: null,
  };
  await store.kv.set(k.adminToken(ENV_TOKEN_ID), record);
}

/** When this process last wrote each token's "last used", per KV. */
const lastUsedWritten = new WeakMap<Deno.Kv, Map<string, number>>();

/**
 * Records that a token was used, at most once a minute per token in this
 * process (the admin API's reads are not each a KV write).
 */
async function touchLastUsed(
  store: Store,
  id: string,
  now: number,
): Promise<void> {
  let written = lastUsedWritten.get(store.kv);
  if (!written) lastUsedWritten.set(store.kv, written = new Map());
  const last = written.get(id);
  if (last !== undefined && now - last < ADMIN_TOKEN_LAST_USED_EVERY_MS) return;
  if (written.size >= 10_000) written.clear();
  written.set(id, now);
  try {
    await store.kv.set(k.adminTokenLastUsed(id), new Date(now).toISOString());
  } catch { /* best effort: "last used" must not fail a request */ }
}

/** Verifies a bearer admin token; returns its principal or null. */
export async function verifyAdminToken(
  store: Store,
  raw: string,
  ip: string | null,
  now = Date.now(),
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
  if (t.expiresAt && Date.parse(t.expiresAt) <= now) return null;
  await touchLastUsed(store, t.id, now);
  return {
    kind: "token",
    id: t.id,
    label: t.name,
    role: t.role,
    tenantId: t.tenantId,
    ip,
  };
}
