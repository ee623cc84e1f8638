/**
 * Chargeback settings: per-model prices per 1M prompt and completion tokens
 * and the cluster cost model (hardware price per node and its amortisation,
 * idle and busy power per node, electricity tariff, currency). Stored as
 * one KV record, validated with zod, every change audited. Money is kept
 * in integer micro-units (see money.ts).
 */
import { z } from "zod";
import { addAudit } from "./audit.ts";
import { ConflictError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import { ALLOCATION_RULES, type AllocationRule } from "./allocation.ts";
import { moneyText } from "./money.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import { modelName, moneySchema, parse } from "./schemas.ts";
import type { Store } from "./store.ts";

/** Prices of one model, in micro-units per 1M tokens. */
export interface ModelPrice {
  model: string;
  promptPerMillion: number;
  completionPerMillion: number;
}

/** The cluster cost model, money in micro-units. */
export interface ClusterCost {
  /** Purchase price of one node (Mac). */
  hardwarePricePerNode: number;
  /** Months over which the hardware price is spread. */
  amortisationMonths: number;
  /** Power draw of one node when idle and when serving, in watts. */
  idleWatts: number;
  busyWatts: number;
  /** Electricity price per kWh. */
  tariffPerKwh: number;
  /**
   * How a shared node's busy cost is split among tenants (store/allocation.ts):
   * by share of busy node-time or of tokens. Idle capacity is the provider's
   * under either rule.
   */
  allocation: AllocationRule;
}

/** Everything chargeback needs. */
export interface Pricing {
  /** ISO 4217 code, e.g. EUR. */
  currency: string;
  models: ModelPrice[];
  cluster: ClusterCost;
  updatedAt: string | null;
  updatedBy: string | null;
}

/** Settings before an operator saved any: nothing is charged. */
export const DEFAULT_PRICING: Pricing = {
  currency: "EUR",
  models: [],
  cluster: {
    hardwarePricePerNode: 0,
    amortisationMonths: 36,
    idleWatts: 0,
    busyWatts: 0,
    tariffPerKwh: 0,
    allocation: "busy_time",
  },
  updatedAt: null,
  updatedBy: null,
};

const SETTINGS_NAME = "pricing";

const money = () => moneySchema();

/** Fields a read gives that a write may send back unchanged (and are ignored). */
const readOnly = {
  updatedAt: z.string().nullable().optional().meta({ readOnly: true }),
  updatedBy: z.string().nullable().optional().meta({ readOnly: true }),
};

const watts = z.coerce.number({ error: "must be a number" })
  .min(0, "must be 0 or more").max(100_000, "must be at most 100000 W");

/** The settings as accepted from the portal form and the admin API. */
export const pricingSchema = z.object({
  currency: z.string({ error: "must be a string" }).trim().toUpperCase()
    .regex(/^[A-Z]{3}$/, "must be a 3-letter ISO 4217 code like EUR"),
  models: z.array(
    z.object({
      model: modelName,
      promptPerMillion: money(),
      completionPerMillion: money(),
    }).strict(),
  ).max(200, "at most 200 model prices").default([])
    .refine(
      (rows) => new Set(rows.map((r) => r.model)).size === rows.length,
      "each model may be priced only once",
    ),
  cluster: z.object({
    hardwarePricePerNode: money(),
    amortisationMonths: z.coerce.number({ error: "must be a number" }).int(
      "must be a whole number of months",
    ).min(1, "must be at least 1").max(240, "must be at most 240"),
    idleWatts: watts,
    busyWatts: watts,
    tariffPerKwh: money(),
    allocation: z.enum(ALLOCATION_RULES as [AllocationRule, AllocationRule], {
      error: `must be one of ${ALLOCATION_RULES.join(", ")}`,
    }).default("busy_time"),
  }).strict().refine((c) => c.busyWatts >= c.idleWatts, {
    message: "busy power must be at least the idle power",
    path: ["busyWatts"],
  }),
  ...readOnly,
}).strict().transform(({ updatedAt: _a, updatedBy: _b, ...data }) => data);

/** Reads the chargeback settings (defaults when never saved). */
export async function getPricing(store: Store): Promise<Pricing> {
  const v = (await store.kv.get<Pricing>(k.settings(SETTINGS_NAME))).value;
  if (!v) return DEFAULT_PRICING;
  // settings saved before the allocation rule existed split by busy time
  return { ...v, cluster: { ...DEFAULT_PRICING.cluster, ...v.cluster } };
}

/** Replaces the chargeback settings (platform admins only), audited. */
export async function setPricing(
  store: Store,
  p: Principal,
  input: unknown,
): Promise<Pricing> {
  requirePlatform(p);
  const data = parse(pricingSchema, input);
  const before = await store.kv.get<Pricing>(k.settings(SETTINGS_NAME));
  const next: Pricing = {
    ...data,
    updatedAt: new Date().toISOString(),
    updatedBy: p.label,
  };
  const op = store.kv.atomic().check(before).set(
    k.settings(SETTINGS_NAME),
    next,
  );
  addAudit(op, p, {
    action: "pricing.set",
    target: { type: "settings", id: SETTINGS_NAME },
    tenantId: null,
    before: before.value ?? null,
    after: data,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The settings changed meanwhile; try again");
  }
  return next;
}

/**
 * The settings as the admin API reads and writes them: every amount a
 * decimal string in major units of `currency` (store/money.ts), so a
 * read sent back unchanged is the same settings.
 */
export function pricingJson(p: Pricing) {
  return {
    currency: p.currency,
    models: p.models.map((m) => ({
      model: m.model,
      promptPerMillion: moneyText(m.promptPerMillion),
      completionPerMillion: moneyText(m.completionPerMillion),
    })),
    cluster: {
      ...p.cluster,
      hardwarePricePerNode: moneyText(p.cluster.hardwarePricePerNode),
      tariffPerKwh: moneyText(p.cluster.tariffPerKwh),
    },
    updatedAt: p.updatedAt,
    updatedBy: p.updatedBy,
  };
}

/** The price of `model`, or null when the operator set none. */
export function priceOf(pricing: Pricing, model: string): ModelPrice | null {
  return pricing.models.find((m) => m.model === model) ?? null;
}
