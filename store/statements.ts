/**
 * Monthly statements per tenant (chargeback), computed from the month
 * rollups and the pricing settings:
 *
 * - **Tokens**: per model, prompt and completion tokens × the model's price
 *   per 1M tokens.
 * - **Node cost**: each node costs, over the statement period (the UTC
 *   month, or the part of it elapsed so far), its hardware amortisation
 *   (price / months, pro rata for a partial month) plus its energy
 *   (idle watts all period long, plus busy − idle watts during busy time,
 *   × tariff). A node's **busy time** is the sum of the latencies of the
 *   requests it served (request-seconds, so concurrent requests add up),
 *   capped at the period for the energy figure. A tenant pays each node's
 *   cost × its share of that node's busy time. Nodes that served nothing
 *   that month are not attributed to anyone (the operator carries them).
 *
 * Amounts are integer micro-units; each line is rounded half-up to the
 * cent and the total is the sum of the rounded lines, so a statement adds
 * up exactly as printed.
 */
import { ValidationError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import { formatMoney, perMillion, toCents } from "./money.ts";
import type { NodeRecord } from "./nodes.ts";
import { getPricing, priceOf, type Pricing } from "./pricing.ts";
import type { Principal } from "./principal.ts";
import type { Store } from "./store.ts";
import { getTenant, type Tenant } from "./tenants.ts";
import { nodeBusyMonth, tenantModelMonth } from "./usage_month.ts";

/** One line of a statement. */
export interface StatementLine {
  kind: "prompt_tokens" | "completion_tokens" | "energy" | "hardware";
  description: string;
  /** Tokens, kWh or node-hours. */
  quantity: number;
  unit: "tokens" | "kWh" | "node-hours";
  /** Price per unit (per 1M tokens for tokens), micro-units; null for shares. */
  unitPriceMicro: number | null;
  /** Rounded to the cent. */
  amountMicro: number;
}

/** A tenant's statement for one month. */
export interface Statement {
  tenant: Pick<Tenant, "id" | "name" | "slug">;
  month: string;
  currency: string;
  period: { from: string; to: string; complete: boolean };
  requests: number;
  promptTokens: number;
  completionTokens: number;
  /** The tenant's busy time over all nodes, ms. */
  busyMs: number;
  lines: StatementLine[];
  totalMicro: number;
  /** Things the reader should know (unpriced models, missing cost model). */
  notes: string[];
  generatedAt: string;
}

const MONTH_RE = /^(\d{4})-(0[1-9]|1[0-2])$/;
const HOUR = 3_600_000;

/** Validates `YYYY-MM` and returns the month's [start, end) in epoch ms. */
export function monthRange(month: string): [number, number] {
  const m = MONTH_RE.exec(month);
  if (!m) {
    throw new ValidationError("month: must be YYYY-MM, like 2026-11", "month");
  }
  const y = Number(m[1]), mo = Number(m[2]) - 1;
  return [Date.UTC(y, mo, 1), Date.UTC(y, mo + 1, 1)];
}

/** Node cost over a period of `periodHours` of a `monthHours` month, micro-units. */
export function nodeCost(
  pricing: Pricing,
  periodHours: number,
  monthHours: number,
  busyMs: number,
): { energyMicro: number; kwh: number; hardwareMicro: number } {
  const c = pricing.cluster;
  const busyHours = Math.min(busyMs / HOUR, periodHours);
  const kwh = (c.idleWatts * periodHours +
    (c.busyWatts - c.idleWatts) * busyHours) / 1000;
  return {
    kwh,
    energyMicro: kwh * c.tariffPerKwh,
    hardwareMicro: c.hardwarePricePerNode / c.amortisationMonths *
      (periodHours / monthHours),
  };
}

/** Builds a tenant's statement for `month` (`YYYY-MM`, UTC). */
export async function buildStatement(
  store: Store,
  p: Principal,
  tenantId: string,
  month: string,
  now = Date.now(),
): Promise<Statement> {
  const tenant = await getTenant(store, p, tenantId);
  const [start, end] = monthRange(month);
  if (start > now) {
    throw new ValidationError(
      `month: ${month} has not started yet`,
      "month",
    );
  }
  const to = Math.min(end, now);
  const periodHours = (to - start) / HOUR;
  const monthHours = (end - start) / HOUR;
  const [pricing, models, nodes] = await Promise.all([
    getPricing(store),
    tenantModelMonth(store, tenant.id, month),
    nodeBusyMonth(store, tenant.id, month),
  ]);
  const lines: StatementLine[] = [];
  const notes: string[] = [];
  let requests = 0, prompt = 0, completion = 0;
  for (const m of models) {
    requests += m.requests;
    prompt += m.prompt;
    completion += m.completion;
    const price = priceOf(pricing, m.model);
    if (!price && m.prompt + m.completion > 0) {
      notes.push(`No price is set for model ${m.model}; its tokens are free.`);
    }
    for (const kind of ["prompt", "completion"] as const) {
      const qty = m[kind];
      if (qty === 0) continue;
      const unit = price
        ? (kind === "prompt"
          ? price.promptPerMillion
          : price.completionPerMillion)
        : 0;
      lines.push({
        kind: `${kind}_tokens`,
        description: `${m.model} ${kind} tokens`,
        quantity: qty,
        unit: "tokens",
        unitPriceMicro: unit,
        amountMicro: toCents(perMillion(qty, unit)),
      });
    }
  }
  const used = nodes.filter((n) => n.tenantBusyMs > 0 && n.busyMs > 0);
  const records = await nodeRecords(store, used.map((n) => n.nodeId));
  let busyMs = 0;
  for (const n of used) {
    busyMs += n.tenantBusyMs;
    const share = n.tenantBusyMs / n.busyMs;
    const cost = nodeCost(pricing, periodHours, monthHours, n.busyMs);
    const name = records.get(n.nodeId)?.name ?? `removed node ${n.nodeId}`;
    const pct = `${(share * 100).toFixed(1)}% of ${
      (n.busyMs / HOUR).toFixed(2)
    } busy h`;
    lines.push({
      kind: "energy",
      description: `Energy, node ${name} (${pct})`,
      quantity: round3(cost.kwh * share),
      unit: "kWh",
      unitPriceMicro: pricing.cluster.tariffPerKwh,
      amountMicro: toCents(cost.energyMicro * share),
    });
    lines.push({
      kind: "hardware",
      description: `Hardware, node ${name} (${pct})`,
      quantity: round3(periodHours * share),
      unit: "node-hours",
      unitPriceMicro: null,
      amountMicro: toCents(cost.hardwareMicro * share),
    });
  }
  if (
    used.length > 0 && pricing.cluster.hardwarePricePerNode === 0 &&
    pricing.cluster.tariffPerKwh === 0
  ) {
    notes.push("No cluster cost model is set; node costs are zero.");
  }
  return {
    tenant: { id: tenant.id, name: tenant.name, slug: tenant.slug },
    month,
    currency: pricing.currency,
    period: {
      from: new Date(start).toISOString(),
      to: new Date(to).toISOString(),
      complete: to === end,
    },
    requests,
    promptTokens: prompt,
    completionTokens: completion,
    busyMs,
    lines,
    totalMicro: lines.reduce((s, l) => s + l.amountMicro, 0),
    notes,
    generatedAt: new Date(now).toISOString(),
  };
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

async function nodeRecords(
  store: Store,
  ids: string[],
): Promise<Map<string, NodeRecord>> {
  const out = new Map<string, NodeRecord>();
  for (let i = 0; i < ids.length; i += 10) {
    const vals = await store.kv.getMany<NodeRecord[]>(
      ids.slice(i, i + 10).map((id) => k.node(id)),
    );
    for (const v of vals) if (v.value) out.set(v.value.id, v.value);
  }
  return out;
}

/** Quotes a CSV field when needed and defuses spreadsheet formulas in text. */
export function csvField(value: string | number | null, text = false): string {
  let s = value === null ? "" : String(value);
  if (text && /^[=+\-@\t\r]/.test(s)) s = `'${s}`;
  return /[",\r\n]/.test(s) ? `"${s.replaceAll('"', '""')}"` : s;
}

/** The statement as CSV (RFC 4180, CRLF), amounts with 2 decimals. */
export function statementCsv(s: Statement): string {
  const head = [
    "tenant",
    "month",
    "currency",
    "kind",
    "description",
    "quantity",
    "unit",
    "unit_price",
    "amount",
  ];
  const rows = [head.join(",")];
  const row = (
    kind: string,
    desc: string,
    qty: number | null,
    unit: string,
    price: number | null,
    amount: number,
  ) =>
    rows.push([
      csvField(s.tenant.name, true),
      s.month,
      s.currency,
      kind,
      csvField(desc, true),
      csvField(qty),
      unit,
      price === null ? "" : formatMoney(price, 6),
      formatMoney(amount),
    ].join(","));
  for (const l of s.lines) {
    row(
      l.kind,
      l.description,
      l.quantity,
      l.unit,
      l.unitPriceMicro,
      l.amountMicro,
    );
  }
  row("total", "Total", null, "", null, s.totalMicro);
  return rows.join("\r\n") + "\r\n";
}
