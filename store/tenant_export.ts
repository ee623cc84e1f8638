/**
 * A tenant's records as one JSON document, for the client: the tenant,
 * its limits and retention, API keys and admin tokens (never a hash or
 * secret), members and pending invites, usage records, audit entries,
 * stored responses, budgets, alerts and webhook endpoints. Everything is
 * read under the tenant's own key prefixes, so nothing of another tenant
 * can be in it. Tenant admins (their own tenant) and platform admins.
 */
import type { AuditEntry } from "./audit.ts";
import { auditJson } from "./audit_json.ts";
import { alertJson, type BudgetAlert } from "./budget_alerts.ts";
import { type Budget, budgetJson } from "./budgets.ts";
import { getPricing } from "./pricing.ts";
import { NotFoundError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import { type Principal, requireTenantWrite } from "./principal.ts";
import { getTenantRetention } from "./retention.ts";
import { loadResponse } from "./responses.ts";
import type { Store } from "./store.ts";
import type { Tenant } from "./tenants.ts";
import type { UsageRecord } from "./usage.ts";

/** The export's shape and version. */
export const EXPORT_SCHEMA = "orchard.tenant_export/1";

/** Values under a prefix, without the fields named in `drop`. */
async function valuesUnder<T>(
  kv: Deno.Kv,
  prefix: Deno.KvKey,
  drop: string[] = [],
): Promise<T[]> {
  const out: T[] = [];
  for await (const e of kv.list<T>({ prefix })) {
    out.push(strip(e.value, drop));
  }
  return out;
}

/** Records an index (`prefix` → id) points at, from `keyOf(id)`. */
async function indexed<T>(
  kv: Deno.Kv,
  prefix: Deno.KvKey,
  keyOf: (id: string) => Deno.KvKey,
  drop: string[] = [],
): Promise<T[]> {
  const out: T[] = [];
  for await (const e of kv.list({ prefix })) {
    const v = (await kv.get<T>(keyOf(String(e.key.at(-1))))).value;
    if (v) out.push(strip(v, drop));
  }
  return out;
}

function strip<T>(v: T, drop: string[]): T {
  if (!drop.length || typeof v !== "object" || v === null) return v;
  const o = { ...v } as Record<string, unknown>;
  for (const f of drop) delete o[f];
  return o as T;
}

/** Builds the tenant's export (tenant admins of it, platform admins). */
export async function exportTenant(
  store: Store,
  p: Principal,
  tenantId: string,
): Promise<Record<string, unknown>> {
  requireTenantWrite(p, tenantId);
  const kv = store.kv;
  const tenant = (await kv.get<Tenant>(k.tenant(tenantId))).value;
  if (!tenant) throw new NotFoundError("Tenant");
  const usage: UsageRecord[] = [];
  for await (
    const e of kv.list<UsageRecord | UsageRecord[]>({
      prefix: k.usageRecordPrefix(tenantId),
    })
  ) usage.push(...(Array.isArray(e.value) ? e.value : [e.value]));
  const responses: unknown[] = [];
  for await (const e of kv.list({ prefix: k.responsePrefix(tenantId) })) {
    const id = String(e.key[2]);
    const r = await loadResponse(store, tenantId, id);
    if (r) responses.push({ id, ...r });
  }
  const retention = await getTenantRetention(store, p, tenantId);
  const { currency } = await getPricing(store);
  return {
    schema: EXPORT_SCHEMA,
    exportedAt: new Date().toISOString(),
    tenant,
    limits: (await kv.get(k.tenantLimits(tenantId))).value,
    retention: { periods: retention.periods, choice: retention.choice },
    apiKeys: await indexed(
      kv,
      k.tenantApiKeyPrefix(tenantId),
      k.apiKey,
      ["hash"],
    ),
    adminTokens: await indexed(
      kv,
      k.tenantAdminTokenPrefix(tenantId),
      k.adminToken,
      ["hash"],
    ),
    users: await indexed(kv, k.tenantUserPrefix(tenantId), k.user, [
      "passwordHash",
    ]),
    invites: await indexed(kv, k.tenantInvitePrefix(tenantId), k.invite, [
      "hash",
    ]),
    usage,
    audit: (await valuesUnder<AuditEntry>(kv, k.auditByTenantPrefix(tenantId)))
      .map((e) => auditJson(e, currency)),
    responses,
    // money as decimal strings in major units, like the admin API
    budgets: (await valuesUnder<Budget>(kv, k.budgetPrefix(tenantId)))
      .map((b) => budgetJson(b, currency)),
    alerts: (await valuesUnder<BudgetAlert>(kv, k.budgetAlertPrefix(tenantId)))
      .map(alertJson),
    webhooks: await indexed(
      kv,
      k.webhookByOwnerPrefix(tenantId),
      k.webhook,
      ["secretBox"],
    ),
  };
}
