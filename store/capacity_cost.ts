/**
 * What the cluster cost over the capacity window, from the cost model in
 * the pricing settings, and each model's cost per 1M tokens delivered
 * (store/capacity.ts states the method): hardware amortised per enrolled
 * node-hour at the hours of its month (as statements do), busy power for
 * busy node-hours and idle power for the rest, shared out by each model's
 * slot-time.
 */
import type { Pricing } from "./pricing.ts";

const HOUR = 3_600_000;

/** One model's cost per 1M tokens delivered. */
export interface ModelCost {
  model: string;
  requests: number;
  promptTokens: number;
  completionTokens: number;
  /** Node-hours its requests held (slot-time). */
  slotHours: number;
  /** Its share of all models' slot-time. */
  share: number;
  /** Its part of the cluster's cost, micro-units. */
  costMicro: number;
  /** Per 1M prompt + completion tokens, micro-units (null: no tokens). */
  per1MMicro: number | null;
  /** The same counting only busy node-hours (no idle capacity). */
  busyPer1MMicro: number | null;
}

/** Hours in the UTC month of `t` (statements amortise hardware per hour of the month). */
function monthHours(t: number): number {
  const d = new Date(t);
  return (Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1) -
    Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1)) / HOUR;
}

/** The cluster's cost over the window and each model's part of it. */
export interface CapacityCost {
  currency: string;
  totalMicro: number;
  hardwareMicro: number;
  energyMicro: number;
  /** The cost of busy node-hours only. */
  busyMicro: number;
  models: ModelCost[];
  notes: string[];
}

/**
 * The cluster's cost over a window from the cost model, and each model's
 * part of it by slot-time: `nodes` give each node's capacity and slot-time
 * (ms) per hour from `from`; `models` each model's MODEL_FIELDS sums.
 */
export function capacityCost(
  pricing: Pricing,
  nodes: readonly { cap: Float64Array; slot: Float64Array }[],
  models: Map<string, Float64Array>,
  from: number,
): CapacityCost {
  const c = pricing.cluster;
  let hardware = 0, energy = 0, busyCost = 0;
  for (const s of nodes) {
    for (let h = 0; h < s.cap.length; h++) {
      const cap = s.cap[h]!;
      if (cap <= 0) continue;
      const hw = c.hardwarePricePerNode / c.amortisationMonths /
        monthHours(from + h * HOUR); // per node-hour
      const busyH = Math.min(s.slot[h]!, cap) / HOUR;
      const idleH = cap / HOUR - busyH;
      hardware += hw * (cap / HOUR);
      const busyEnergy = busyH * c.busyWatts / 1000 * c.tariffPerKwh;
      energy += busyEnergy + idleH * c.idleWatts / 1000 * c.tariffPerKwh;
      busyCost += hw * busyH + busyEnergy;
    }
  }
  const totalMicro = hardware + energy;
  let allSlot = 0;
  for (const m of models.values()) allSlot += m[3] ?? 0;
  const rows: ModelCost[] = [...models].map(([model, m]) => {
    const tokens = m[1]! + m[2]!;
    const share = allSlot > 0 ? (m[3] ?? 0) / allSlot : 0;
    const cost = totalMicro * share;
    return {
      model,
      requests: m[0]!,
      promptTokens: m[1]!,
      completionTokens: m[2]!,
      slotHours: (m[3] ?? 0) / HOUR,
      share,
      costMicro: cost,
      per1MMicro: tokens > 0 ? cost / tokens * 1e6 : null,
      busyPer1MMicro: tokens > 0 ? busyCost * share / tokens * 1e6 : null,
    };
  }).sort((a, b) => b.share - a.share || a.model.localeCompare(b.model));
  const notes: string[] = [];
  if (c.hardwarePricePerNode === 0 && c.tariffPerKwh === 0) {
    notes.push(
      "No cluster cost model is set (Settings): costs are zero.",
    );
  }
  return {
    currency: pricing.currency,
    totalMicro,
    hardwareMicro: hardware,
    energyMicro: energy,
    busyMicro: busyCost,
    models: rows,
    notes,
  };
}
