/**
 * Client API keys: `orch_<id>_<secret><checksum>`. Only a keyed hash of the
 * secret is stored; the key is returned exactly once, at creation.
 */
import { checksum6, hmac, randomBase62, safeEqual } from "../lib/crypto.ts";
import { addAudit } from "./audit.ts";
import { commitAuthChange } from "./auth_epoch.ts";
import { ConflictError, NotFoundError, ValidationError } from "./errors.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { getTenantLimitsRaw, LIMIT_FIELDS, type Limits } from "./limits.ts";
import { seedLimitCounters } from "./usage_seed.ts";
import { listPage, type Page, type PageOptions } from "./pagination.ts";
import {
  type Principal,
  requireTenantRead,
  requireTenantWrite,
} from "./principal.ts";
import {
  apiKeyCreateSchema,
  apiKeyPatchSchema,
  parse,
  type Scope,
} from "./schemas.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";

/** A stored client API key (never the secret itself). */
export interface ApiKey {
  id: string;
  tenantId: string;
  name: string;
  /** Public prefix, e.g. `orch_01jabc…`, safe to show. */
  prefix: string;
  /** The key's last four characters, safe to show. */
  last4: string;
  /** HMAC-SHA-256 of the secret under the server pepper. */
  hash: string;
  scopes: Scope[];
  /** Model allow-list; null = every model. */
  models: string[] | null;
  /** Per-key limits, tighter than the tenant's; null = tenant's only. */
  limits: Limits | null;
  expiresAt: string | null;
  revokedAt: string | null;
  createdAt: string;
  /**
   * After a rotation with a grace period: the previous secret's hash,
   * accepted until `until` (ISO). Absent or null: only the current one.
   */
  previous?: { hash: string; until: string } | null;
  /** When the secret was last rotated. */
  rotatedAt?: string | null;
}

/** A key as listed (no hashes), with when it was last used and until when its previous secret works. */
export type ApiKeyView = Omit<ApiKey, "hash" | "previous"> & {
  lastUsedAt: string | null;
  /** After a rotation: the previous secret works until then (ISO); null: not at all. */
  previousValidUntil: string | null;
};

/** The grace periods a rotation offers (ms): none, 1 hour, 24 hours, 7 days. */
export const ROTATION_GRACE_MS = [0, 3_600_000, 86_400_000, 7 * 86_400_000];
/** The longest grace period accepted (30 days). */
const MAX_GRACE_MS = 30 * 86_400_000;

const KEY_RE = /^orch_([0-9a-z]{26})_([0-9A-Za-z]{32})([0-9A-Za-z]{6})$/;

/** Builds a key string from its parts (checksum over everything before it). */
function formatKey(id: string, secret: string): string {
  const body = `orch_${id}_${secret}`;
  return body + checksum6(body);
}

/** Splits a presented key; null if malformed or its checksum is wrong (no KV read). */
export function parseApiKey(
  raw: string,
): { id: string; secret: string } | null {
  if (raw.length !== 70) return null;
  const m = KEY_RE.exec(raw);
  if (!m) return null;
  const [, id, secret, sum] = m as unknown as [string, string, string, string];
  if (!safeEqual(checksum6(`orch_${id}_${secret}`), sum)) return null;
  return { id, secret };
}

function view(key: ApiKey, lastUsedAt: string | null): ApiKeyView {
  const { hash: _hash, previous, ...rest } = key;
  return {
    ...rest,
    rotatedAt: key.rotatedAt ?? null,
    lastUsedAt,
    previousValidUntil: previous && Date.parse(previous.until) > Date.now()
      ? previous.until
      : null,
  };
}

const LIMIT_NAMES: Record<keyof Limits, string> = {
  rpm: "Requests per minute",
  tpm: "Tokens per minute",
  concurrency: "Concurrent requests",
  tokensPerDay: "Tokens per day",
  tokensPerMonth: "Tokens per month",
};

/** A key's own limits must fit within its tenant's (a tenant's empty limit: any). */
async function checkWithinTenant(
  store: Store,
  tenantId: string,
  limits: Limits | null,
): Promise<void> {
  if (!limits) return;
  const tenant = await getTenantLimitsRaw(store, tenantId);
  for (const f of LIMIT_FIELDS) {
    const mine = limits[f];
    const cap = tenant[f];
    if (mine !== null && cap !== null && mine > cap) {
      throw new ValidationError(
        `${LIMIT_NAMES[f]} cannot exceed the tenant's limit of ${
          cap.toLocaleString("en-US")
        }`,
        `limits.${f}`,
      );
    }
  }
}

/** Creates a key; the result's `key` is the only time the secret is seen. */
export async function createApiKey(
  store: Store,
  p: Principal,
  tenantId: string,
  input: unknown,
): Promise<{ key: string; apiKey: ApiKeyView }> {
  requireTenantWrite(p, tenantId);
  const data = parse(apiKeyCreateSchema, input);
  const tenant = await store.kv.get(k.tenant(tenantId));
  if (!tenant.value) throw new NotFoundError("Tenant");
  await checkWithinTenant(store, tenantId, data.limits);
  const id = newId();
  const secret = randomBase62(32); // 190 bits
  const key = formatKey(id, secret);
  const record: ApiKey = {
    id,
    tenantId,
    name: data.name,
    prefix: `orch_${id.slice(0, 8)}`,
    last4: key.slice(-4),
    hash: await hmac(store.secrets.pepper, secret),
    scopes: [...new Set(data.scopes)],
    models: data.models,
    limits: data.limits,
    expiresAt: data.expiresAt ? new Date(data.expiresAt).toISOString() : null,
    revokedAt: null,
    createdAt: new Date().toISOString(),
  };
  const op = store.kv.atomic().check(tenant)
    .check({ key: k.apiKey(id), versionstamp: null })
    .set(k.apiKey(id), record)
    .set(k.tenantApiKey(tenantId, id), id);
  addAudit(op, p, {
    action: "key.create",
    target: { type: "api_key", id, label: record.name },
    tenantId,
    after: view(record, null),
  });
  if (!(await commitAuthChange(store.kv, op)).ok) {
    throw new ConflictError("The tenant changed meanwhile; try again");
  }
  return { key, apiKey: view(record, null) };
}

/** Lists a tenant's keys, newest first. */
export async function listApiKeys(
  store: Store,
  p: Principal,
  tenantId: string,
  opts: PageOptions = {},
): Promise<Page<ApiKeyView>> {
  requireTenantRead(p, tenantId);
  if (!(await getTenantRaw(store, tenantId))) throw new NotFoundError("Tenant");
  return listPage<string, ApiKeyView>(
    store.kv,
    { prefix: k.tenantApiKeyPrefix(tenantId) },
    { reverse: true, ...opts },
    async (id) => {
      const [key, used] = await store.kv.getMany<[ApiKey, string]>([
        k.apiKey(id),
        k.apiKeyLastUsed(id),
      ]);
      return key.value ? view(key.value, used.value) : null;
    },
  );
}

/** Reads one key the principal may see. */
export async function getApiKey(
  store: Store,
  p: Principal,
  id: string,
): Promise<ApiKeyView> {
  const key = id.length <= 64
    ? (await store.kv.get<ApiKey>(k.apiKey(id))).value
    : null;
  if (!key) throw new NotFoundError("API key");
  requireTenantRead(p, key.tenantId, "API key");
  const used = await store.kv.get<string>(k.apiKeyLastUsed(id));
  return view(key, used.value);
}

/** Revokes a key; effective on the next verification. Idempotent. */
export async function revokeApiKey(
  store: Store,
  p: Principal,
  id: string,
  tenantId?: string,
): Promise<ApiKeyView> {
  const entry = id.length <= 64
    ? await store.kv.get<ApiKey>(k.apiKey(id))
    : null;
  if (!entry?.value || (tenantId && entry.value.tenantId !== tenantId)) {
    throw new NotFoundError("API key");
  }
  requireTenantWrite(p, entry.value.tenantId, "API key");
  if (entry.value.revokedAt) return view(entry.value, null);
  const after = {
    ...entry.value,
    revokedAt: new Date().toISOString(),
    previous: null,
  };
  const op = store.kv.atomic().check(entry).set(
    k.apiKey(id),
    after,
  );
  addAudit(op, p, {
    action: "key.revoke",
    target: { type: "api_key", id, label: after.name },
    tenantId: after.tenantId,
    before: view(entry.value, null),
    after: view(after, null),
  });
  if (!(await commitAuthChange(store.kv, op)).ok) {
    throw new ConflictError("The key changed meanwhile; try again");
  }
  return view(after, null);
}

/** Reads a key of `tenantId` (when given) for a change by `p`: 404 for another tenant's. */
async function keyForWrite(
  store: Store,
  p: Principal,
  id: string,
  tenantId?: string,
): Promise<Deno.KvEntry<ApiKey>> {
  const entry = id.length <= 64
    ? await store.kv.get<ApiKey>(k.apiKey(id))
    : null;
  if (!entry?.value || (tenantId && entry.value.tenantId !== tenantId)) {
    throw new NotFoundError("API key");
  }
  requireTenantWrite(p, entry.value.tenantId, "API key");
  return entry as Deno.KvEntry<ApiKey>;
}

/**
 * Edits a key's name, scopes, model allow-list and own limits (each
 * optional; limits within the tenant's). Takes effect on the next request.
 */
export async function updateApiKey(
  store: Store,
  p: Principal,
  id: string,
  input: unknown,
  tenantId?: string,
): Promise<ApiKeyView> {
  const entry = await keyForWrite(store, p, id, tenantId);
  const data = parse(apiKeyPatchSchema, input);
  const before = entry.value;
  if (before.revokedAt) {
    throw new ValidationError("A revoked key cannot be edited");
  }
  const after: ApiKey = {
    ...before,
    ...(data.name !== undefined ? { name: data.name } : {}),
    ...(data.scopes !== undefined ? { scopes: [...new Set(data.scopes)] } : {}),
    ...(data.models !== undefined
      ? { models: data.models && data.models.length ? data.models : null }
      : {}),
    ...(data.limits !== undefined ? { limits: data.limits } : {}),
  };
  if (data.limits !== undefined) {
    await checkWithinTenant(store, before.tenantId, after.limits);
  }
  const op = store.kv.atomic().check(entry).set(k.apiKey(id), after);
  addAudit(op, p, {
    action: "key.update",
    target: { type: "api_key", id, label: after.name },
    tenantId: after.tenantId,
    before: view(before, null),
    after: view(after, null),
  });
  if (!(await commitAuthChange(store.kv, op)).ok) {
    throw new ConflictError("The key changed meanwhile; try again");
  }
  // a day or month cap set mid-window counts what the key used before it
  if (data.limits) {
    await seedLimitCounters(store, after.tenantId, after.id, data.limits);
  }
  // a day or month cap set mid-window counts what the key used before it
  if (data.limits) {
    await seedLimitCounters(store, after.tenantId, after.id, data.limits);
  }
  return view(after, null);
}

/**
 * Rotates a key's secret: the result's `key` is the new key (same id,
 * limits, budgets and usage), shown once. The previous secret keeps working
 * for `graceMs` (0: stops at once); a previous one still in its grace from
 * an earlier rotation stops at once.
 */
export async function rotateApiKey(
  store: Store,
  p: Principal,
  id: string,
  graceMs: number,
  tenantId?: string,
): Promise<{ key: string; apiKey: ApiKeyView }> {
  const entry = await keyForWrite(store, p, id, tenantId);
  if (!Number.isInteger(graceMs) || graceMs < 0 || graceMs > MAX_GRACE_MS) {
    throw new ValidationError(
      "The grace period must be from 0 to 30 days",
      "graceMs",
    );
  }
  const before = entry.value;
  if (before.revokedAt) {
    throw new ValidationError("A revoked key cannot be rotated");
  }
  if (before.expiresAt && Date.parse(before.expiresAt) <= Date.now()) {
    throw new ValidationError("An expired key cannot be rotated");
  }
  const secret = randomBase62(32);
  const key = formatKey(id, secret);
  const now = Date.now();
  const after: ApiKey = {
    ...before,
    last4: key.slice(-4),
    hash: await hmac(store.secrets.pepper, secret),
    previous: graceMs > 0
      ? { hash: before.hash, until: new Date(now + graceMs).toISOString() }
      : null,
    rotatedAt: new Date(now).toISOString(),
  };
  const op = store.kv.atomic().check(entry).set(k.apiKey(id), after);
  addAudit(op, p, {
    action: "key.rotate",
    target: { type: "api_key", id, label: after.name },
    tenantId: after.tenantId,
    before: view(before, null),
    after: view(after, null),
  });
  if (!(await commitAuthChange(store.kv, op)).ok) {
    throw new ConflictError("The key changed meanwhile; try again");
  }
  return { key, apiKey: view(after, null) };
}

/** Why a presented key was refused. */
export type KeyRejection =
  | "malformed"
  | "unknown"
  | "revoked"
  | "expired"
  | "rotated";

/**
 * Verifies a presented key for the gateway: checksum first (no KV read),
 * then one lookup by id, then a constant-time comparison of keyed hashes.
 * Revocation and expiry are checked on every call. After a rotation the
 * previous secret is accepted until its grace period ends (`graceUntil`,
 * epoch ms: the caller must stop accepting it then).
 */
export async function verifyApiKey(
  store: Store,
  raw: string,
  now = Date.now(),
): Promise<
  | { ok: true; key: ApiKey; graceUntil: number | null }
  | { ok: false; reason: KeyRejection }
> {
  const parts = parseApiKey(raw);
  if (!parts) return { ok: false, reason: "malformed" };
  const [entry, hash] = await Promise.all([
    store.kv.get<ApiKey>(k.apiKey(parts.id)),
    hmac(store.secrets.pepper, parts.secret),
  ]);
  const key = entry.value;
  if (!key) return { ok: false, reason: "unknown" };
  let graceUntil: number | null = null;
  // Both compared whatever the first says: no timing tells which matched.
  const current = safeEqual(key.hash, hash);
  const previous = !!key.previous && safeEqual(key.previous.hash, hash);
  if (!current) {
    if (!previous) return { ok: false, reason: "unknown" };
    graceUntil = Date.parse(key.previous!.until);
    if (!(graceUntil > now)) return { ok: false, reason: "rotated" };
  }
  if (key.revokedAt) return { ok: false, reason: "revoked" };
  if (key.expiresAt && Date.parse(key.expiresAt) <= now) {
    return { ok: false, reason: "expired" };
  }
  return { ok: true, key, graceUntil };
}
