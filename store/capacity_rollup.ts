/**
 * The layout of the capacity rollups (written by store/usage_rollups.ts
 * with the other groups of each usage record, read by store/capacity.ts).
 * One group per UTC day and subject:
 *
 * - **node**: per hour of the day, the requests the node served, their
 *   prompt and completion tokens, their time on the node (`busy_ms`:
 *   latency less the wait for a slot), that time divided by the node's
 *   slot count when the request was routed (`slot_ms`: the share of the
 *   whole node it held, so a 4-slot node is full at 3,600,000 an hour),
 *   and their wait for a slot (`queue_ms`).
 * - **cluster**: per hour, the requests that reached routing (`routed`:
 *   served, or refused for lack of capacity), those that waited for a slot
 *   (`queued`), their wait (`queue_ms`), and those refused (`refused`:
 *   every slot busy and the queue full, or the wait timed out).
 * - **model**: the day's requests served, tokens and `slot_ms`, which the
 *   cluster's cost is shared out by.
 *
 * Each group is stored packed, `{ _seq, n, v }`: `v` a Float64Array of
 * the sums, hour-major for hourly groups (index = hour × n + field), `n`
 * the fields per hour. A typed array is copied, not walked field by field,
 * when KV reads it: four weeks of 20 nodes read ~4× faster than as
 * objects of named sums.
 */

/** Fields of a node's group, per hour (in this order). */
export const NODE_FIELDS = [
  "requests",
  "prompt",
  "completion",
  "busy_ms",
  "slot_ms",
  "queue_ms",
] as const;

/** Fields of the cluster's group, per hour (in this order). */
export const CLUSTER_FIELDS = [
  "routed",
  "queued",
  "queue_ms",
  "refused",
] as const;

/** Fields of a model's group, for the whole day (in this order). */
export const MODEL_FIELDS = [
  "requests",
  "prompt",
  "completion",
  "slot_ms",
] as const;

/** A capacity group's stored value. */
export interface PackedSums {
  /** Up to which of its writer's records it holds (store/usage_rollups.ts). */
  _seq: number;
  /** Fields per hour (hourly groups) or in all (model groups). */
  n: number;
  v: Float64Array;
}

/** Whether a stored value is a packed capacity group. */
export function isPacked(v: unknown): v is PackedSums {
  return !!v && typeof v === "object" &&
    (v as PackedSums).v instanceof Float64Array &&
    typeof (v as PackedSums).n === "number";
}

/** The names of an hourly layout's slots, hour-major (`requests_00`, …), for a group's sums. */
export function hourlyNames(fields: readonly string[]): string[] {
  const out: string[] = [];
  for (let h = 0; h < 24; h++) {
    const hh = String(h).padStart(2, "0");
    for (const f of fields) out.push(`${f}_${hh}`);
  }
  return out;
}
