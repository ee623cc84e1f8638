/**
 * How one node's cost in a period is split (chargeback allocation).
 *
 * A node costs, per hour it was enrolled in the period, its hardware
 * amortisation (price ÷ months ÷ hours of the month) and its power at the
 * tariff: busy power for its busy hours, idle power for the rest. Its busy
 * hours are the sum of its requests' latencies, capped at its enrolled hours
 * (concurrent requests add up to more request-time than wall time).
 *
 * - A **shared** node's busy hours (hardware and busy energy) are split among
 *   the tenants it served by the rule chosen in settings: `busy_time`, each
 *   tenant's share of the node's request-time, or `tokens`, each tenant's
 *   share of the tokens it processed (a node that processed no tokens, e.g.
 *   only failed requests, falls back to busy time). Its idle hours (hardware
 *   and idle energy) are the provider's own cost: the "Idle capacity
 *   (provider)" line, never a tenant's.
 * - A node **dedicated** to a tenant costs that tenant everything: hardware
 *   for every enrolled hour and energy busy or idle; nothing is idle capacity
 *   and other tenants pay nothing for it.
 *
 * Shares are exact fractions of micro-units here; statements round each line
 * to the cent (store/statements.ts), and the cluster summary
 * (store/chargeback.ts) rounds the same lines, so both add up alike.
 */
import type { ClusterCost } from "./pricing.ts";

/** How a shared node's busy cost is split among tenants. */
export type AllocationRule = "busy_time" | "tokens";

/** Every rule, in the order the settings page offers them. */
export const ALLOCATION_RULES: readonly AllocationRule[] = [
  "busy_time",
  "tokens",
];

/** A rule in words, for pages and notes. */
export const RULE_LABEL: Record<AllocationRule, string> = {
  busy_time: "share of busy node-time",
  tokens: "share of tokens",
};

const HOUR = 3_600_000;

/** One node's use in a period. */
export interface NodeUse {
  /** Hours the node was enrolled within the period. */
  enrolledHours: number;
  /** Request-time of all tenants on it, ms. */
  busyMs: number;
  /** Tokens (prompt + completion) of all tenants on it. */
  tokens: number;
  /** The tenant it is dedicated to, or null when shared. */
  dedicatedTo: string | null;
}

/** One tenant's use of a node in the period. */
export interface TenantUse {
  tenantId: string;
  busyMs: number;
  tokens: number;
}

/** A part of a node's cost: micro-units, not rounded yet. */
export interface CostPart {
  /** Node-hours this part stands for. */
  hours: number;
  kwh: number;
  energyMicro: number;
  hardwareMicro: number;
  /** The fraction of the node's busy hours (1 for a dedicated node's tenant). */
  share: number;
}

const ZERO: CostPart = {
  hours: 0,
  kwh: 0,
  energyMicro: 0,
  hardwareMicro: 0,
  share: 0,
};

function busyHours(node: NodeUse): number {
  return Math.min(node.busyMs / HOUR, node.enrolledHours);
}

function hourlyHardware(c: ClusterCost, monthHours: number): number {
  return c.hardwarePricePerNode / c.amortisationMonths / monthHours;
}

/** The fraction of a shared node's busy hours `t` pays under `rule`. */
export function shareOf(
  rule: AllocationRule,
  node: NodeUse,
  t: TenantUse,
): number {
  if (rule === "tokens" && node.tokens > 0) return t.tokens / node.tokens;
  return node.busyMs > 0 ? t.busyMs / node.busyMs : 0;
}

/** What tenant `t` pays for `node` in the period. */
export function tenantPart(
  c: ClusterCost,
  rule: AllocationRule,
  monthHours: number,
  node: NodeUse,
  t: TenantUse,
): CostPart {
  const busy = busyHours(node);
  if (node.dedicatedTo !== null) {
    if (node.dedicatedTo !== t.tenantId) return ZERO;
    const kwh = (busy * c.busyWatts +
      (node.enrolledHours - busy) * c.idleWatts) / 1000;
    return {
      hours: node.enrolledHours,
      kwh,
      energyMicro: kwh * c.tariffPerKwh,
      hardwareMicro: hourlyHardware(c, monthHours) * node.enrolledHours,
      share: 1,
    };
  }
  const share = shareOf(rule, node, t);
  const hours = busy * share;
  const kwh = (hours * c.busyWatts) / 1000;
  return {
    hours,
    kwh,
    energyMicro: kwh * c.tariffPerKwh,
    hardwareMicro: hourlyHardware(c, monthHours) * hours,
    share,
  };
}

/** The provider's own part of `node`: its idle hours when shared, nothing when dedicated. */
export function idlePart(
  c: ClusterCost,
  monthHours: number,
  node: NodeUse,
): CostPart {
  if (node.dedicatedTo !== null) return ZERO;
  const hours = node.enrolledHours - busyHours(node);
  const kwh = (hours * c.idleWatts) / 1000;
  return {
    hours,
    kwh,
    energyMicro: kwh * c.tariffPerKwh,
    hardwareMicro: hourlyHardware(c, monthHours) * hours,
    share: 0,
  };
}
