/**
 * Removes every record of a tenant (its deletion's grace period over):
 * the tenant and its indexes, limits and retention choices, its members
 * (with their sessions and resets), invites, API keys, admin tokens,
 * audit entries, usage records and its own rollups (tenant, key, tenant ×
 * model, month totals), stored responses, budgets, alerts, webhooks and
 * their deliveries. Kept: rollups across tenants (per model, overall, per
 * node, and node × tenant busy time, which other tenants' statements of
 * those months are scaled by); they hold counts, no content.
 */
import type { AuditEntry } from "./audit.ts";
import { k } from "./kv_keys.ts";
import type { Tenant } from "./tenants.ts";
import type { Store } from "./store.ts";
import type { User } from "./users.ts";
import type { Invite } from "./users.ts";
import { addAudit } from "./audit.ts";
import { SYSTEM } from "./principal.ts";

/** Deletes keys in commits of at most `per` mutations. */
export async function deleteKeys(
  kv: Deno.Kv,
  keys: Deno.KvKey[],
  per = 200,
): Promise<void> {
  for (let i = 0; i < keys.length; i += per) {
    const op = kv.atomic();
    for (const key of keys.slice(i, i + per)) op.delete(key);
    await op.commit();
  }
}

/** An audit entry's three copies. */
export function auditKeys(e: AuditEntry): Deno.KvKey[] {
  const keys: Deno.KvKey[] = [k.audit(e.id), k.auditByActor(e.actor.id, e.id)];
  if (e.tenantId) keys.push(k.auditByTenant(e.tenantId, e.id));
  return keys;
}

async function keysUnder(
  kv: Deno.Kv,
  selector: Deno.KvListSelector,
): Promise<Deno.KvKey[]> {
  const out: Deno.KvKey[] = [];
  for await (const e of kv.list(selector)) out.push(e.key);
  return out;
}

async function idsUnder(kv: Deno.Kv, prefix: Deno.KvKey): Promise<string[]> {
  const out: string[] = [];
  for await (const e of kv.list({ prefix })) out.push(String(e.key.at(-1)));
  return out;
}

/** Subjects `tenantId/…` of a rollup dimension: a range over the subject part. */
function subjectRange(prefix: Deno.KvKey, tenantId: string) {
  return {
    start: [...prefix, `${tenantId}/`],
    end: [...prefix, `${tenantId}/\uffff`],
  };
}

/** Deletes everything of the tenant (idempotent: a second call finds nothing). */
export async function purgeTenant(
  store: Store,
  tenantId: string,
): Promise<void> {
  const kv = store.kv;
  const keys: Deno.KvKey[] = [];
  // members, with their sessions and password resets
  for (const uid of await idsUnder(kv, k.tenantUserPrefix(tenantId))) {
    const u = (await kv.get<User>(k.user(uid))).value;
    keys.push(k.tenantUser(tenantId, uid));
    if (!u || u.tenantId !== tenantId) continue;
    keys.push(k.user(uid), k.userByEmail(u.email), k.userLastSignIn(uid));
    for (const sid of await idsUnder(kv, k.userSessionPrefix(uid))) {
      keys.push(k.session(sid), k.userSession(uid, sid));
    }
    const reset = (await kv.get<string>(k.userPasswordReset(uid))).value;
    if (reset) keys.push(k.passwordReset(reset), k.userPasswordReset(uid));
  }
  for (const id of await idsUnder(kv, k.tenantInvitePrefix(tenantId))) {
    const inv = (await kv.get<Invite>(k.invite(id))).value;
    keys.push(k.tenantInvite(tenantId, id), k.invite(id));
    if (inv) keys.push(k.inviteByEmail(inv.email));
  }
  for (const id of await idsUnder(kv, k.tenantApiKeyPrefix(tenantId))) {
    keys.push(k.tenantApiKey(tenantId, id), k.apiKey(id), k.apiKeyLastUsed(id));
  }
  for (const id of await idsUnder(kv, k.tenantAdminTokenPrefix(tenantId))) {
    keys.push(
      k.tenantAdminToken(tenantId, id),
      k.adminToken(id),
      k.adminTokenLastUsed(id),
    );
  }
  for await (
    const e of kv.list<AuditEntry>({ prefix: k.auditByTenantPrefix(tenantId) })
  ) keys.push(...auditKeys(e.value));
  // usage: records, marks, the tenant's own rollups
  keys.push(...await keysUnder(kv, { prefix: k.usageRecordPrefix(tenantId) }));
  keys.push(
    ...await keysUnder(kv, { prefix: k.requestLogTenantPrefix(tenantId) }),
  );
  keys.push(...await keysUnder(kv, { prefix: ["usage_mark", tenantId] }));
  for (const g of ["hour", "day"] as const) {
    keys.push(
      ...await keysUnder(kv, {
        prefix: k.usageRollupPrefix(g, "tenant", tenantId),
      }),
      ...await keysUnder(
        kv,
        subjectRange(["usage_rollup", g, "key"], tenantId),
      ),
      ...await keysUnder(
        kv,
        subjectRange(["usage_rollup", g, "tenant_model"], tenantId),
      ),
      ...await keysUnder(kv, { prefix: k.usageKeyModelPrefix(g, tenantId) }),
    );
  }
  for await (const e of kv.list({ prefix: ["usage_month"] })) {
    const [, , dim, subject] = e.key;
    if (
      (dim === "tenant" && subject === tenantId) ||
      (dim === "tenant_model" && String(subject).startsWith(`${tenantId}/`))
    ) keys.push(e.key);
  }
  // stored responses, budgets, alerts, webhooks and deliveries
  keys.push(
    ...await keysUnder(kv, { prefix: k.responsePrefix(tenantId) }),
    ...await keysUnder(kv, { prefix: k.responsePartPrefix(tenantId) }),
    ...await keysUnder(kv, { prefix: k.budgetPrefix(tenantId) }),
    ...await keysUnder(kv, { prefix: ["budget_alert_once", tenantId] }),
    k.budgetAlertCount(tenantId, "created"),
    k.budgetAlertCount(tenantId, "acked"),
  );
  for (const id of await idsUnder(kv, k.budgetAlertPrefix(tenantId))) {
    keys.push(k.budgetAlert(tenantId, id), k.budgetAlertAll(id));
  }
  for (const id of await idsUnder(kv, k.webhookByOwnerPrefix(tenantId))) {
    keys.push(k.webhookByOwner(tenantId, id), k.webhook(id));
  }
  for (
    const id of await idsUnder(kv, k.webhookDeliveryByOwnerPrefix(tenantId))
  ) {
    keys.push(k.webhookDeliveryByOwner(tenantId, id), k.webhookDelivery(id));
  }
  // the tenant itself last: until then a sweep finds it and tries again
  const t = (await kv.get<Tenant>(k.tenant(tenantId))).value;
  await deleteKeys(kv, keys);
  const last: Deno.KvKey[] = [
    k.tenantLimits(tenantId),
    k.tenantRetention(tenantId),
    k.tenant(tenantId),
  ];
  if (t) {
    last.push(
      k.tenantBySlug(t.slug),
      k.tenantByName(t.name.toLowerCase().slice(0, 100), tenantId),
    );
  }
  await deleteKeys(kv, last);
  if (t) {
    // the provider's trace that the tenant's data is gone (its own log went with it)
    const op = kv.atomic();
    addAudit(op, SYSTEM, {
      action: "tenant.purge",
      target: { type: "tenant", id: tenantId, label: t.name },
      tenantId: null,
      before: { requestedAt: t.deletion?.requestedAt, by: t.deletion?.by },
    });
    await op.commit();
  }
}
