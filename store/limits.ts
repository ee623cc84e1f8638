/** Limits per tenant (and, tighter, per key); enforcement lives in the gateway. */
import { addAudit } from "./audit.ts";
import { commitAuthChange } from "./auth_epoch.ts";
import { ConflictError, NotFoundError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import {
  type Principal,
  requirePlatform,
  requireTenantRead,
} from "./principal.ts";
import { limitsSchema, parse } from "./schemas.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";
import { seedLimitCounters } from "./usage_seed.ts";

/** Each limit; null means unlimited. */
export interface Limits {
  rpm: number | null;
  tpm: number | null;
  concurrency: number | null;
  tokensPerDay: number | null;
  tokensPerMonth: number | null;
}

/** No limits at all. */
export const UNLIMITED: Limits = {
  rpm: null,
  tpm: null,
  concurrency: null,
  tokensPerDay: null,
  tokensPerMonth: null,
};

/** The names of the limit fields, in display order. */
export const LIMIT_FIELDS = [
  "rpm",
  "tpm",
  "concurrency",
  "tokensPerDay",
  "tokensPerMonth",
] as const satisfies readonly (keyof Limits)[];

/** Validates a limits body (fields absent or null = unlimited). */
export function parseLimits(input: unknown): Limits {
  return parse(limitsSchema, input);
}

/** Reads a tenant's limits without access checks (gateway use). */
export async function getTenantLimitsRaw(
  store: Store,
  tenantId: string,
): Promise<Limits> {
  return (await store.kv.get<Limits>(k.tenantLimits(tenantId))).value ??
    UNLIMITED;
}

/** Reads a tenant's limits. */
export async function getTenantLimits(
  store: Store,
  p: Principal,
  tenantId: string,
): Promise<Limits> {
  requireTenantRead(p, tenantId);
  if (!(await getTenantRaw(store, tenantId))) throw new NotFoundError("Tenant");
  return getTenantLimitsRaw(store, tenantId);
}

/** Replaces a tenant's limits. */
export async function setTenantLimits(
  store: Store,
  p: Principal,
  tenantId: string,
  input: unknown,
): Promise<Limits> {
  // the limits a provider sells are the provider's: tenant admins set
  // per-key limits within them, never the tenant's own
  requirePlatform(p);
  const limits = parseLimits(input);
  const tenant = await store.kv.get(k.tenant(tenantId));
  if (!tenant.value) throw new NotFoundError("Tenant");
  const before = await store.kv.get<Limits>(k.tenantLimits(tenantId));
  const op = store.kv.atomic().check(tenant).check(before)
    .set(k.tenantLimits(tenantId), limits);
  addAudit(op, p, {
    action: "limits.set",
    target: { type: "tenant", id: tenantId },
    tenantId,
    before: before.value ?? UNLIMITED,
    after: limits,
  });
  if (!(await commitAuthChange(store.kv, op)).ok) {
    throw new ConflictError("The limits changed meanwhile; try again");
  }
  // a day or month cap set mid-window counts what was used before it
  await seedLimitCounters(store, tenantId, null, limits);
  return limits;
}

/** The tighter of two limits (null = unlimited). */
export function tighter(a: number | null, b: number | null): number | null {
  if (a === null) return b;
  if (b === null) return a;
  return Math.min(a, b);
}
