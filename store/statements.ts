/**
 * Monthly statements per tenant (chargeback), computed from the month
 * rollups and the pricing settings:
 *
 * - **Tokens**: per model, prompt and completion tokens × the model's price
 *   per 1M tokens.
 * - **Node cost, by busy node-hours**: a node costs, per hour it is
 *   enrolled, its hardware amortisation (price / months / hours of the
 *   month) and, per busy hour, its busy power × tariff. A tenant pays for
 *   the node-hours it kept the node busy: the sum of its requests'
 *   latencies on it (request-time; when concurrent requests add up to more
 *   than the node's enrolled hours, every tenant's hours are scaled down to
 *   fit). The rest of the node's time, idle capacity and hours before it
 *   was enrolled, is the provider's own cost: never billed to a tenant.
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

/**
 * A tenant's part of one node's cost, micro-units: the node-hours it kept
 * the node busy (`tenantBusyMs`, scaled down when all tenants' request-time
 * `nodeBusyMs` exceeds the node's `enrolledHours` in the period), at the
 * node's hourly hardware amortisation and its busy power.
 */
export function nodeShare(
  pricing: Pricing,
  enrolledHours: number,
  monthHours: number,
  nodeBusyMs: number,
  tenantBusyMs: number,
): { hours: number; kwh: number; energyMicro: number; hardwareMicro: number } {
  const c = pricing.cluster;
  const busyHours = nodeBusyMs / HOUR;
  const scale = enrolledHours > 0 && busyHours > enrolledHours
    ? enrolledHours / busyHours
    : 1;
  const hours = (tenantBusyMs / HOUR) * scale;
  const kwh = (c.busyWatts * hours) / 1000;
  return {
    hours,
    kwh,
    energyMicro: kwh * c.tariffPerKwh,
    hardwareMicro: c.hardwarePricePerNode / c.amortisationMonths / monthHours *
      hours,
  };
}

/** Tokens of one model: what token lines are priced from. */
export interface ModelTokens {
  model: string;
  prompt: number;
  completion: number;
}

/**
 * The token lines of a statement (one per model and kind with tokens:
 * quantity × the model's price per 1M, rounded half-up to the cent), and
 * a note per unpriced model used. Statements and every spend shown
 * elsewhere (usage pages, budgets: store/spend.ts) are priced by this one
 * function.
 */
export function tokenLines(
  pricing: Pricing,
  models: readonly ModelTokens[],
): { lines: StatementLine[]; notes: string[] } {
  const lines: StatementLine[] = [];
  const notes: string[] = [];
  for (const m of models) {
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
  return { lines, notes };
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
  const monthHours = (end - start) / HOUR;
  const [pricing, models, nodes] = await Promise.all([
    getPricing(store),
    tenantModelMonth(store, tenant.id, month),
    nodeBusyMonth(store, tenant.id, month),
  ]);
  const { lines, notes } = tokenLines(pricing, models);
  let requests = 0, prompt = 0, completion = 0;
  for (const m of models) {
    requests += m.requests;
    prompt += m.prompt;
    completion += m.completion;
  }
  const used = nodes.filter((n) => n.tenantBusyMs > 0 && n.busyMs > 0);
  // Nodes dedicated to the tenant cost it every enrolled hour, busy or not.
  const dedicated = await dedicatedNodes(store, tenant.id);
  for (const rec of dedicated.values()) {
    if (!used.some((n) => n.nodeId === rec.id)) {
      used.push({ nodeId: rec.id, busyMs: 0, tenantBusyMs: 0 });
    }
  }
  const records = await nodeRecords(store, used.map((n) => n.nodeId));
  let busyMs = 0;
  for (const n of used) {
    busyMs += n.tenantBusyMs;
    const rec = records.get(n.nodeId);
    // a node costs only from its enrolment on (a removed node: the period)
    const since = rec ? Math.max(start, Date.parse(rec.enrolledAt)) : start;
    const enrolledHours = Math.max(0, to - since) / HOUR;
    const part = nodeShare(
      pricing,
      enrolledHours,
      monthHours,
      n.busyMs,
      n.tenantBusyMs,
    );
    const own = dedicated.has(n.nodeId);
    if (own) {
      part.hardwareMicro = pricing.cluster.hardwarePricePerNode /
        pricing.cluster.amortisationMonths / monthHours * enrolledHours;
    }
    const name = rec?.name ?? `removed node ${n.nodeId}`;
    const of = own
      ? `dedicated to you: ${enrolledHours.toFixed(0)} enrolled h, ${
        part.hours.toFixed(2)
      } busy`
      : `${part.hours.toFixed(2)} busy h of ${
        enrolledHours.toFixed(0)
      } enrolled`;
    lines.push({
      kind: "energy",
      description: `Energy, node ${name} (${of})`,
      quantity: round3(part.kwh),
      unit: "kWh",
      unitPriceMicro: pricing.cluster.tariffPerKwh,
      amountMicro: toCents(part.energyMicro),
    });
    lines.push({
      kind: "hardware",
      description: `Hardware, node ${name} (${of})`,
      quantity: round3(own ? enrolledHours : part.hours),
      unit: "node-hours",
      unitPriceMicro: null,
      amountMicro: toCents(part.hardwareMicro),
    });
  }
  if (used.length > dedicated.size) {
    notes.push(
      "Node costs are billed by the node-hours your requests kept each node busy; idle capacity is the provider's own cost.",
    );
  }
  if (dedicated.size > 0) {
    notes.push(
      "Nodes dedicated to you are billed for every hour they were enrolled in the period (hardware), and for the energy of their busy hours.",
    );
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

/** The nodes dedicated to a tenant now (store/nodes.ts `dedicatedTo`). */
async function dedicatedNodes(
  store: Store,
  tenantId: string,
): Promise<Map<string, NodeRecord>> {
  const out = new Map<string, NodeRecord>();
  for await (const e of store.kv.list<NodeRecord>({ prefix: k.nodePrefix() })) {
    if (e.value.dedicatedTo === tenantId) out.set(e.value.id, e.value);
  }
  return out;
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
