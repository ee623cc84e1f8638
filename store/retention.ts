/**
 * Retention per tenant: how long each kind of a tenant's records is kept
 * (usage records, which are the request log; audit entries; stored
 * responses),
 * within the provider's bounds (platform settings: a default, a minimum
 * and a maximum per kind, and the grace period before a deleted tenant's
 * data is removed). A tenant's admins choose within the bounds; only
 * platform admins change the bounds.
 *
 * Enforced twice: each record is written with a KV `expireIn` of its
 * tenant's period (`retentionMs`, synchronous, from a per-process cache:
 * an unknown tenant gets the kind's maximum, so nothing expires early), and
 * the sweeper (store/retention_sweep.ts) deletes what is older than the
 * period now, for records written before a change.
 */
import { z } from "zod";
import { addAudit } from "./audit.ts";
import { commitAuthChange } from "./auth_epoch.ts";
import { ConflictError, NotFoundError, ValidationError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import {
  type Principal,
  requirePlatform,
  requireTenantRead,
  requireTenantWrite,
} from "./principal.ts";
import { parse } from "./schemas.ts";
import type { Store } from "./store.ts";
import type { Tenant } from "./tenants.ts";

/** The kinds of a tenant's records that expire. */
export const RETENTION_KINDS = [
  "usage",
  "audit",
  "responses",
] as const;
/** One kind of record with a retention period. */
export type RetentionKind = typeof RETENTION_KINDS[number];
/** Days per kind. */
export type RetentionDays = Record<RetentionKind, number>;

/** What each kind is called on pages and statements. */
export const RETENTION_LABELS: Record<RetentionKind, string> = {
  usage: "Usage records (the request log)",
  audit: "Audit entries",
  responses: "Stored responses",
};

/** The provider's bounds (platform settings). */
export interface RetentionBounds {
  defaults: RetentionDays;
  min: RetentionDays;
  max: RetentionDays;
  /** Days between deleting a tenant and removing its data. */
  deletionGraceDays: number;
  updatedAt?: string;
}

/** Bounds until a platform admin saves others. */
export const DEFAULT_BOUNDS: RetentionBounds = {
  defaults: { usage: 90, audit: 365, responses: 30 },
  min: { usage: 1, audit: 30, responses: 1 },
  max: { usage: 730, audit: 3650, responses: 365 },
  deletionGraceDays: 30,
};

/** One day in milliseconds. */
export const DAY_MS = 86_400_000;

const days = z.number({ error: "must be a number of days" }).int(
  "must be a whole number of days",
).min(1, "must be at least 1 day").max(36_500, "must be at most 36,500 days");
const perKind = z.object({
  usage: days,
  audit: days,
  responses: days,
}).strict();

/** The body of the provider's retention bounds. */
export const retentionBoundsSchema = z.object({
  defaults: perKind,
  min: perKind,
  max: perKind,
  deletionGraceDays: z.number().int().min(0).max(365),
}).strict();

/** The body of a tenant's retention choices. */
export const tenantRetentionSchema = z.object({
  usage: days.nullable().optional(),
  audit: days.nullable().optional(),
  responses: days.nullable().optional(),
}).strict();

/** A tenant's own choices (absent or null: the provider's default). */
export type TenantRetentionChoice = Partial<
  Record<RetentionKind, number | null>
>;

// The per-process cache behind `retentionMs` (audit entries are added to
// an atomic operation synchronously, with no store in reach).
let cachedBounds: RetentionBounds | null = null;
const cachedTenants = new Map<string, RetentionDays>();
const MAX_CACHED = 100_000;

/** Reads the provider's bounds (defaults when never saved). */
export async function getRetentionBounds(
  store: Store,
): Promise<RetentionBounds> {
  const v = (await store.kv.get<RetentionBounds>(k.settings("retention")))
    .value;
  cachedBounds = v ?? DEFAULT_BOUNDS;
  return cachedBounds;
}

/** Replaces the provider's bounds (platform admins only), audited. */
export async function setRetentionBounds(
  store: Store,
  p: Principal,
  input: unknown,
): Promise<RetentionBounds> {
  requirePlatform(p);
  const data = parse(retentionBoundsSchema, input);
  for (const kind of RETENTION_KINDS) {
    if (data.min[kind] > data.max[kind]) {
      throw new ValidationError(
        `max.${kind}: must be at least the minimum (${data.min[kind]} days)`,
        `max.${kind}`,
      );
    }
    if (
      data.defaults[kind] < data.min[kind] ||
      data.defaults[kind] > data.max[kind]
    ) {
      throw new ValidationError(
        `defaults.${kind}: must be between the minimum and the maximum`,
        `defaults.${kind}`,
      );
    }
  }
  const key = k.settings("retention");
  const before = await store.kv.get<RetentionBounds>(key);
  const next: RetentionBounds = {
    ...data,
    updatedAt: new Date().toISOString(),
  };
  const op = store.kv.atomic().check(before).set(key, next);
  addAudit(op, p, {
    action: "retention.bounds",
    target: { type: "settings", id: "retention" },
    tenantId: null,
    before: before.value ?? DEFAULT_BOUNDS,
    after: data,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The settings changed meanwhile; try again");
  }
  cachedBounds = next;
  cachedTenants.clear();
  return next;
}

/** A tenant's periods from its choices, each clamped to the bounds. */
export function effectiveRetention(
  bounds: RetentionBounds,
  choice: TenantRetentionChoice | null,
): RetentionDays {
  const out = { ...bounds.defaults };
  for (const kind of RETENTION_KINDS) {
    const want = choice?.[kind];
    if (typeof want === "number") {
      out[kind] = Math.min(bounds.max[kind], Math.max(bounds.min[kind], want));
    }
  }
  return out;
}

/**
 * A tenant's retention period per kind, in days: its choices within the
 * provider's bounds, else the defaults. No access check: for writers
 * (usage, responses, the request log) and the sweeper.
 */
export async function tenantRetention(
  store: Store,
  tenantId: string,
): Promise<RetentionDays> {
  const [b, t] = await store.kv.getMany<
    [RetentionBounds, TenantRetentionChoice]
  >([k.settings("retention"), k.tenantRetention(tenantId)]);
  cachedBounds = b.value ?? DEFAULT_BOUNDS;
  const periods = effectiveRetention(cachedBounds, t.value);
  if (cachedTenants.size >= MAX_CACHED) cachedTenants.clear();
  cachedTenants.set(tenantId, periods);
  return periods;
}

/**
 * The `expireIn` for a record of `kind` written now, synchronously: the
 * tenant's period as this process last read it, or (never read yet) the
 * kind's maximum, so a record never expires before its period; the
 * sweeper removes it on time. `tenantId` null: the provider's own records
 * (the default period).
 */
export function retentionMs(
  tenantId: string | null,
  kind: RetentionKind,
): number {
  const bounds = cachedBounds ?? DEFAULT_BOUNDS;
  if (tenantId === null) return bounds.defaults[kind] * DAY_MS;
  const known = cachedTenants.get(tenantId);
  return (known ? known[kind] : bounds.max[kind]) * DAY_MS;
}

/** What the tenant page and `GET …/retention` show. */
export interface TenantRetentionView {
  tenantId: string;
  periods: RetentionDays;
  choice: TenantRetentionChoice;
  bounds: RetentionBounds;
  /** When the tenant's data will be removed, if its deletion is scheduled. */
  deletion: Tenant["deletion"] | null;
}

/** A tenant's retention with its choices and the bounds (tenant members and platform admins). */
export async function getTenantRetention(
  store: Store,
  p: Principal,
  tenantId: string,
): Promise<TenantRetentionView> {
  requireTenantRead(p, tenantId);
  const [tenant, b, t] = await store.kv.getMany<
    [Tenant, RetentionBounds, TenantRetentionChoice]
  >([k.tenant(tenantId), k.settings("retention"), k.tenantRetention(tenantId)]);
  if (!tenant.value) throw new NotFoundError("Tenant");
  const bounds = b.value ?? DEFAULT_BOUNDS;
  return {
    tenantId,
    periods: effectiveRetention(bounds, t.value),
    choice: t.value ?? {},
    bounds,
    deletion: tenant.value.deletion ?? null,
  };
}

/**
 * Sets a tenant's retention choices (a tenant's admins or platform
 * admins), each within the provider's bounds (null: the default). Audited;
 * records already written are swept to the new periods by the sweeper.
 */
export async function setTenantRetention(
  store: Store,
  p: Principal,
  tenantId: string,
  input: unknown,
): Promise<TenantRetentionView> {
  requireTenantWrite(p, tenantId);
  const data = parse(tenantRetentionSchema, input);
  const bounds = await getRetentionBounds(store);
  for (const kind of RETENTION_KINDS) {
    const v = data[kind];
    if (typeof v !== "number") continue;
    if (v < bounds.min[kind] || v > bounds.max[kind]) {
      throw new ValidationError(
        `${kind}: must be between ${bounds.min[kind]} and ${
          bounds.max[kind]
        } days (the provider's bounds)`,
        kind,
      );
    }
  }
  const [tenant, before] = await store.kv.getMany<
    [Tenant, TenantRetentionChoice]
  >([k.tenant(tenantId), k.tenantRetention(tenantId)]);
  if (!tenant.value) throw new NotFoundError("Tenant");
  const next: TenantRetentionChoice = {};
  for (const kind of RETENTION_KINDS) {
    const v = kind in data ? data[kind] : before.value?.[kind];
    if (typeof v === "number") next[kind] = v;
  }
  const op = store.kv.atomic().check(tenant).check(before)
    .set(k.tenantRetention(tenantId), next);
  addAudit(op, p, {
    action: "tenant.retention",
    target: { type: "tenant", id: tenantId, label: tenant.value.name },
    tenantId,
    before: before.value ?? {},
    after: next,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The tenant changed meanwhile; try again");
  }
  cachedTenants.set(tenantId, effectiveRetention(bounds, next));
  return await getTenantRetention(store, p, tenantId);
}

/**
 * Deletes a tenant: disabled at once (suspended: its keys stop working
 * on every gateway within a second), its data removed by the sweeper
 * after the provider's grace period. Platform admins only, audited.
 */
export async function scheduleTenantDeletion(
  store: Store,
  p: Principal,
  tenantId: string,
  now = Date.now(),
): Promise<Tenant> {
  requirePlatform(p);
  const bounds = await getRetentionBounds(store);
  const entry = await store.kv.get<Tenant>(k.tenant(tenantId));
  if (!entry.value) throw new NotFoundError("Tenant");
  if (entry.value.deletion) return entry.value;
  const at = new Date(now).toISOString();
  const after: Tenant = {
    ...entry.value,
    status: "suspended",
    deletion: {
      requestedAt: at,
      purgeAt: new Date(now + bounds.deletionGraceDays * DAY_MS).toISOString(),
      by: p.label,
    },
    updatedAt: at,
  };
  const op = store.kv.atomic().check(entry).set(k.tenant(tenantId), after);
  addAudit(op, p, {
    action: "tenant.delete",
    target: { type: "tenant", id: tenantId, label: after.name },
    tenantId,
    before: entry.value,
    after,
  });
  if (!(await commitAuthChange(store.kv, op)).ok) {
    throw new ConflictError("The tenant changed meanwhile; try again");
  }
  return after;
}

/** Cancels a scheduled deletion within the grace period (the tenant stays suspended until resumed). Platform admins only. */
export async function cancelTenantDeletion(
  store: Store,
  p: Principal,
  tenantId: string,
): Promise<Tenant> {
  requirePlatform(p);
  const entry = await store.kv.get<Tenant>(k.tenant(tenantId));
  if (!entry.value) throw new NotFoundError("Tenant");
  if (!entry.value.deletion) return entry.value;
  const { deletion: _d, ...rest } = entry.value;
  const after: Tenant = { ...rest, updatedAt: new Date().toISOString() };
  const op = store.kv.atomic().check(entry).set(k.tenant(tenantId), after);
  addAudit(op, p, {
    action: "tenant.delete_cancel",
    target: { type: "tenant", id: tenantId, label: after.name },
    tenantId,
    before: entry.value,
    after,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The tenant changed meanwhile; try again");
  }
  return after;
}
