/**
 * Monthly statements per tenant (chargeback), computed from the month
 * rollups and the pricing settings:
 *
 * - **Tokens**: per model, prompt and completion tokens × the model's price
 *   per 1M tokens.
 * - **Node cost**: each node's cost from the hours it was enrolled in the
 *   period, split by store/allocation.ts: a shared node's busy hours by the
 *   rule chosen in settings (share of busy node-time or of tokens), a
 *   dedicated node's whole cost to its tenant. Idle capacity and the hours
 *   before a node was enrolled are the provider's own cost, never billed to
 *   a tenant (store/chargeback.ts shows them as the provider's line).
 *
 * Amounts are integer micro-units; each line is rounded half-up to the
 * cent and the total is the sum of the rounded lines, so a statement adds
 * up exactly as printed.
 */
import { type NodeUse, RULE_LABEL, tenantPart } from "./allocation.ts";
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

/** Hours a node (its record, or null when removed) was enrolled in [start, to). */
export function enrolledHoursIn(
  rec: NodeRecord | null | undefined,
  start: number,
  to: number,
): number {
  // a node costs only from its enrolment on (a removed node: the period)
  const since = rec ? Math.max(start, Date.parse(rec.enrolledAt)) : start;
  return Math.max(0, to - since) / HOUR;
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
  // Nodes dedicated to the tenant cost it every enrolled hour, busy or not.
  const dedicated = await dedicatedNodes(store, tenant.id);
  const used = nodes.filter((n) =>
    dedicated.has(n.nodeId) ||
    (n.busyMs > 0 && (n.tenantBusyMs > 0 || n.tenantTokens > 0))
  );
  for (const rec of dedicated.values()) {
    if (!used.some((n) => n.nodeId === rec.id)) {
      used.push({
        nodeId: rec.id,
        busyMs: 0,
        tokens: 0,
        tenantBusyMs: 0,
        tenantTokens: 0,
      });
    }
  }
  const records = await nodeRecords(store, used.map((n) => n.nodeId));
  const rule = pricing.cluster.allocation;
  let busyMs = 0;
  let shared = 0;
  for (const n of used) {
    busyMs += n.tenantBusyMs;
    const rec = records.get(n.nodeId);
    const node: NodeUse = {
      enrolledHours: enrolledHoursIn(rec, start, to),
      busyMs: n.busyMs,
      tokens: n.tokens,
      dedicatedTo: rec?.dedicatedTo ?? null,
    };
    const part = tenantPart(pricing.cluster, rule, monthHours, node, {
      tenantId: tenant.id,
      busyMs: n.tenantBusyMs,
      tokens: n.tenantTokens,
    });
    // another tenant's dedicated node: its whole cost is that tenant's
    if (part.share === 0) continue;
    const own = node.dedicatedTo === tenant.id;
    if (!own) shared++;
    const name = rec?.name ?? `removed node ${n.nodeId}`;
    const hours = node.enrolledHours.toFixed(0);
    const of = own
      ? `dedicated to you: ${hours} enrolled h, ${
        Math.min(n.busyMs / HOUR, node.enrolledHours).toFixed(2)
      } busy`
      : `${(part.share * 100).toFixed(1)}% of its ${
        (part.hours / part.share).toFixed(2)
      } busy h by ${RULE_LABEL[rule]}, of ${hours} enrolled`;
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
      quantity: round3(part.hours),
      unit: "node-hours",
      unitPriceMicro: null,
      amountMicro: toCents(part.hardwareMicro),
    });
  }
  if (shared > 0) {
    notes.push(
      `Shared nodes' busy hours are split by ${
        RULE_LABEL[rule]
      }; idle capacity is the provider's own cost.`,
    );
  }
  if (dedicated.size > 0) {
    notes.push(
      "Nodes dedicated to you are billed for every hour they were enrolled in the period: hardware, and energy busy or idle.",
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
