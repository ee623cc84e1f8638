/**
 * The cluster's chargeback for a month (platform admins): what each tenant's
 * statement charges, and the provider's own line, "Idle capacity
 * (provider)", so that the cluster's whole node cost is accounted for:
 * every node's enrolled hours in the period are either some tenant's (by the
 * allocation rule, store/allocation.ts) or idle capacity. Read from the same
 * month rollups, node records and pricing as the statements
 * (store/statements.ts), with the same per-line rounding to the cent, so a
 * tenant's row here equals its statement's total.
 */
import {
  type AllocationRule,
  idlePart,
  type NodeUse,
  tenantPart,
} from "./allocation.ts";
import { k } from "./kv_keys.ts";
import { toCents } from "./money.ts";
import type { NodeRecord } from "./nodes.ts";
import { getPricing } from "./pricing.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import {
  enrolledHoursIn,
  type ModelTokens,
  monthRange,
  tokenLines,
} from "./statements.ts";
import type { Store } from "./store.ts";
import type { Tenant } from "./tenants.ts";
import { rollupFields } from "./usage.ts";
import { nodeMonthAll } from "./usage_month.ts";
import { ValidationError } from "./errors.ts";

const HOUR = 3_600_000;

/** One tenant's row: its statement's total, in parts. */
export interface ChargebackTenant {
  tenantId: string;
  name: string;
  slug: string;
  tokens: number;
  /** Token lines (per model and kind), each rounded to the cent. */
  tokensMicro: number;
  /** Node-hours attributed to it (shared nodes' busy share, dedicated nodes' enrolled hours). */
  nodeHours: number;
  /** Energy and hardware lines, each rounded to the cent. */
  nodesMicro: number;
  totalMicro: number;
}

/** The cluster's month: every tenant's charge and the provider's idle capacity. */
export interface Chargeback {
  month: string;
  currency: string;
  rule: AllocationRule;
  period: { from: string; to: string; complete: boolean };
  tenants: ChargebackTenant[];
  /** Idle capacity (provider): shared nodes' enrolled hours nobody kept busy. */
  idle: { hours: number; kwh: number; totalMicro: number };
  /** Nodes counted (enrolled in the period or used in it). */
  nodes: number;
  /** Node-hours enrolled in the period, all nodes. */
  enrolledHours: number;
  /** The cluster's node cost: tenants' node lines + idle capacity. */
  nodeCostMicro: number;
  /** Everything: tenants' totals + idle capacity. */
  totalMicro: number;
}

/** Every tenant's tokens per model in `month` (one range read). */
async function modelTokensByTenant(
  store: Store,
  month: string,
): Promise<Map<string, ModelTokens[]>> {
  const prefix = k.usageMonthPrefix(month, "tenant_model");
  const by = new Map<string, Map<string, ModelTokens>>();
  for await (const e of store.kv.list({ prefix }, { batchSize: 1000 })) {
    const subject = e.key[prefix.length] as string;
    const slash = subject.indexOf("/");
    const tenantId = subject.slice(0, slash);
    const model = subject.slice(slash + 1);
    let models = by.get(tenantId);
    if (!models) by.set(tenantId, models = new Map());
    let m = models.get(model);
    if (!m) models.set(model, m = { model, prompt: 0, completion: 0 });
    for (const [f, v] of rollupFields(e)) {
      if (f === "prompt" || f === "completion") m[f] += v;
    }
  }
  return new Map([...by].map(([t, ms]) => [t, [...ms.values()]]));
}

/** The cluster's chargeback for `month` (`YYYY-MM`, UTC); platform admins only. */
export async function clusterChargeback(
  store: Store,
  p: Principal,
  month: string,
  now = Date.now(),
): Promise<Chargeback> {
  requirePlatform(p);
  const [start, end] = monthRange(month);
  if (start > now) {
    throw new ValidationError(`month: ${month} has not started yet`, "month");
  }
  const to = Math.min(end, now);
  const monthHours = (end - start) / HOUR;
  const [pricing, usage, tokens] = await Promise.all([
    getPricing(store),
    nodeMonthAll(store, month),
    modelTokensByTenant(store, month),
  ]);
  const records = new Map<string, NodeRecord>();
  for await (const e of store.kv.list<NodeRecord>({ prefix: k.nodePrefix() })) {
    records.set(e.value.id, e.value);
  }
  const c = pricing.cluster;
  const rows = new Map<string, ChargebackTenant>();
  const row = (tenantId: string) => {
    let r = rows.get(tenantId);
    if (!r) {
      r = {
        tenantId,
        name: "",
        slug: "",
        tokens: 0,
        tokensMicro: 0,
        nodeHours: 0,
        nodesMicro: 0,
        totalMicro: 0,
      };
      rows.set(tenantId, r);
    }
    return r;
  };
  for (const [tenantId, models] of tokens) {
    const r = row(tenantId);
    for (const m of models) r.tokens += m.prompt + m.completion;
    r.tokensMicro = tokenLines(pricing, models).lines
      .reduce((s, l) => s + l.amountMicro, 0);
  }
  const idle = { hours: 0, kwh: 0, totalMicro: 0 };
  let nodes = 0, enrolledHours = 0, nodeCostMicro = 0;
  const ids = new Set([...usage.keys(), ...records.keys()]);
  for (const id of ids) {
    const rec = records.get(id);
    const use = usage.get(id);
    const node: NodeUse = {
      enrolledHours: enrolledHoursIn(rec, start, to),
      busyMs: use?.busyMs ?? 0,
      tokens: use?.tokens ?? 0,
      dedicatedTo: rec?.dedicatedTo ?? null,
    };
    if (node.enrolledHours === 0 && !use) continue; // enrolled after the period
    nodes++;
    enrolledHours += node.enrolledHours;
    const tenants = new Map(use?.tenants ?? []);
    if (node.dedicatedTo && !tenants.has(node.dedicatedTo)) {
      tenants.set(node.dedicatedTo, { busyMs: 0, tokens: 0 });
    }
    for (const [tenantId, t] of tenants) {
      // a statement lists a shared node only when the node was busy
      if (!node.dedicatedTo && node.busyMs <= 0) continue;
      const part = tenantPart(c, pricing.cluster.allocation, monthHours, node, {
        tenantId,
        ...t,
      });
      if (part.share === 0) continue;
      const r = row(tenantId);
      const micro = toCents(part.energyMicro) + toCents(part.hardwareMicro);
      r.nodeHours += part.hours;
      r.nodesMicro += micro;
      nodeCostMicro += micro;
    }
    const own = idlePart(c, monthHours, node);
    const micro = toCents(own.energyMicro) + toCents(own.hardwareMicro);
    idle.hours += own.hours;
    idle.kwh += own.kwh;
    idle.totalMicro += micro;
    nodeCostMicro += micro;
  }
  const list = [...rows.values()];
  for (let i = 0; i < list.length; i += 10) {
    const part = list.slice(i, i + 10);
    const ts = await store.kv.getMany<Tenant[]>(
      part.map((r) => k.tenant(r.tenantId)),
    );
    part.forEach((r, j) => {
      r.name = ts[j]?.value?.name ?? "(deleted tenant)";
      r.slug = ts[j]?.value?.slug ?? "";
    });
  }
  for (const r of list) r.totalMicro = r.tokensMicro + r.nodesMicro;
  list.sort((a, b) =>
    b.totalMicro - a.totalMicro || a.name.localeCompare(b.name)
  );
  return {
    month,
    currency: pricing.currency,
    rule: pricing.cluster.allocation,
    period: {
      from: new Date(start).toISOString(),
      to: new Date(to).toISOString(),
      complete: to === end,
    },
    tenants: list,
    idle,
    nodes,
    enrolledHours,
    nodeCostMicro,
    totalMicro: list.reduce((s, r) => s + r.totalMicro, 0) + idle.totalMicro,
  };
}
