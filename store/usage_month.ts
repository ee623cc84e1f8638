/**
 * Reads of the month rollups written by `writeUsage` (UTC months): tenant
 * totals for the top-tenants table, a tenant's tokens per model, and node
 * busy time (the sum of the latencies of the requests a node served),
 * overall and per tenant, for statements.
 */
import { k } from "./kv_keys.ts";
import { rollupFields } from "./usage.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import type { Store } from "./store.ts";
import type { Tenant } from "./tenants.ts";

/** A tenant's totals in one month. */
export interface TenantMonthTotals {
  tenantId: string;
  requests: number;
  tokens: number;
  errors: number;
}

/** A tenant's use of one model in one month. */
export interface ModelMonthTotals {
  model: string;
  requests: number;
  prompt: number;
  completion: number;
}

/** `YYYY-MM` of a time (UTC). */
export function monthOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 7);
}

/** Every tenant's totals in `month` (one range read, whatever the traffic). */
export async function tenantMonthTotals(
  store: Store,
  month: string,
): Promise<TenantMonthTotals[]> {
  const byTenant = new Map<string, TenantMonthTotals>();
  const prefix = k.usageMonthPrefix(month, "tenant");
  const it = store.kv.list({ prefix }, { batchSize: 1000 });
  for await (const e of it) {
    const id = e.key[prefix.length] as string;
    let t = byTenant.get(id);
    if (!t) {
      t = { tenantId: id, requests: 0, tokens: 0, errors: 0 };
      byTenant.set(id, t);
    }
    for (const [f, v] of rollupFields(e)) {
      if (f === "requests" || f === "tokens" || f === "errors") t[f] += v;
    }
  }
  return [...byTenant.values()];
}

/** A row of the top-tenants table. */
export interface TopTenant extends TenantMonthTotals {
  name: string;
  slug: string;
}

/** The `limit` tenants with the most tokens in `month` (platform admins only). */
export async function topTenants(
  store: Store,
  p: Principal,
  month: string,
  limit = 10,
): Promise<TopTenant[]> {
  requirePlatform(p);
  const all = await tenantMonthTotals(store, month);
  all.sort((a, b) => b.tokens - a.tokens || b.requests - a.requests);
  const top = all.slice(0, limit);
  const out: TopTenant[] = [];
  for (let i = 0; i < top.length; i += 10) {
    const part = top.slice(i, i + 10);
    const ts = await store.kv.getMany<Tenant[]>(
      part.map((t) => k.tenant(t.tenantId)),
    );
    part.forEach((t, j) => {
      const tenant = ts[j]?.value;
      out.push({
        ...t,
        name: tenant?.name ?? "(deleted tenant)",
        slug: tenant?.slug ?? "",
      });
    });
  }
  return out;
}

/** A tenant's tokens per model in `month` (access checks are the caller's). */
export async function tenantModelMonth(
  store: Store,
  tenantId: string,
  month: string,
): Promise<ModelMonthTotals[]> {
  const prefix = k.usageMonthPrefix(month, "tenant_model");
  const byModel = new Map<string, ModelMonthTotals>();
  const it = store.kv.list({
    start: [...prefix, `${tenantId}/`],
    end: [...prefix, `${tenantId}/\uffff`],
  });
  for await (const e of it) {
    const model = (e.key[prefix.length] as string).slice(tenantId.length + 1);
    let m = byModel.get(model);
    if (!m) {
      m = { model, requests: 0, prompt: 0, completion: 0 };
      byModel.set(model, m);
    }
    for (const [f, v] of rollupFields(e)) {
      if (f === "requests" || f === "prompt" || f === "completion") m[f] += v;
    }
  }
  return [...byModel.values()].sort((a, b) => a.model.localeCompare(b.model));
}

/** Busy time and tokens of one node in a month: all tenants, and the given tenant's part. */
export interface NodeBusy {
  nodeId: string;
  busyMs: number;
  tokens: number;
  tenantBusyMs: number;
  tenantTokens: number;
}

/** Sums a node or node × tenant month entry's `busy_ms` and `tokens`. */
function addNodeFields(
  e: Deno.KvEntry<unknown>,
  into: { busyMs: number; tokens: number },
): void {
  for (const [f, v] of rollupFields(e)) {
    if (f === "busy_ms") into.busyMs += v;
    else if (f === "tokens") into.tokens += v;
  }
}

/** Every node's busy time and tokens in `month` with `tenantId`'s part of them. */
export async function nodeBusyMonth(
  store: Store,
  tenantId: string,
  month: string,
): Promise<NodeBusy[]> {
  const byNode = new Map<string, NodeBusy>();
  const prefix = k.usageMonthPrefix(month, "node");
  for await (const e of store.kv.list({ prefix })) {
    const nodeId = e.key[prefix.length] as string;
    let n = byNode.get(nodeId);
    if (!n) {
      n = { nodeId, busyMs: 0, tokens: 0, tenantBusyMs: 0, tenantTokens: 0 };
      byNode.set(nodeId, n);
    }
    addNodeFields(e, n);
  }
  const pt = k.usageMonthPrefix(month, "node_tenant");
  for (const n of byNode.values()) {
    const it = store.kv.list({ prefix: [...pt, `${n.nodeId}/${tenantId}`] });
    const part = { busyMs: 0, tokens: 0 };
    for await (const e of it) addNodeFields(e, part);
    n.tenantBusyMs = part.busyMs;
    n.tenantTokens = part.tokens;
  }
  return [...byNode.values()];
}

/** One node's month: its totals and each tenant's part. */
export interface NodeMonth {
  nodeId: string;
  busyMs: number;
  tokens: number;
  tenants: Map<string, { busyMs: number; tokens: number }>;
}

/** Every node's busy time and tokens in `month`, per tenant (access checks are the caller's). */
export async function nodeMonthAll(
  store: Store,
  month: string,
): Promise<Map<string, NodeMonth>> {
  const byNode = new Map<string, NodeMonth>();
  const node = (nodeId: string) => {
    let n = byNode.get(nodeId);
    if (!n) {
      n = { nodeId, busyMs: 0, tokens: 0, tenants: new Map() };
      byNode.set(nodeId, n);
    }
    return n;
  };
  const prefix = k.usageMonthPrefix(month, "node");
  for await (const e of store.kv.list({ prefix }, { batchSize: 1000 })) {
    addNodeFields(e, node(e.key[prefix.length] as string));
  }
  const pt = k.usageMonthPrefix(month, "node_tenant");
  for await (const e of store.kv.list({ prefix: pt }, { batchSize: 1000 })) {
    const subject = e.key[pt.length] as string;
    const slash = subject.indexOf("/");
    const n = node(subject.slice(0, slash));
    const tenantId = subject.slice(slash + 1);
    let t = n.tenants.get(tenantId);
    if (!t) {
      t = { busyMs: 0, tokens: 0 };
      n.tenants.set(tenantId, t);
    }
    addNodeFields(e, t);
  }
  return byNode;
}
