/**
 * The capacity report (platform admins): how busy each node and the whole
 * cluster were over the last 4 weeks, by hour, hour of day and day of
 * week (UTC), from the capacity rollups (store/capacity_rollup.ts) alone:
 * one range read, whatever the traffic.
 *
 * Definitions (stated on the page too):
 * - **Capacity** of a node in an hour: the part of the hour it was
 *   enrolled (up to now); a node removed since counts from the first to
 *   the last hour it served in the window.
 * - **Busy share**: the slot-time its requests held (each request's time
 *   on the node, latency less its wait for a slot, ÷ the node's slots)
 *   over its capacity, at most 100%. The cluster's is the sum over nodes
 *   over the sum of their capacity. Requests count in the hour they began.
 * - **Tokens/s delivered**: completion tokens of the hour ÷ its seconds.
 * - **Measured peak**: the highest tokens/s the node (or cluster)
 *   delivered in any whole hour of the window: what it has shown it can
 *   do, a floor on what it could (see its busy share in that hour).
 * - **Queue time**: the mean wait for a node slot at the gateway, per
 *   request; **refused**: requests answered 503 `server_busy` (every slot
 *   busy and the queue full, or the wait timed out).
 * - **Cost per 1M tokens** (per model): the cluster's cost over the window
 *   from the cost model (hardware amortised per enrolled hour, busy power
 *   for busy hours, idle power for the rest) shared out by each model's
 *   slot-time, ÷ its prompt + completion tokens. "Busy only" counts just
 *   the busy node-hours, as statements charge them; the difference is the
 *   cost of idle capacity.
 */
import { CLUSTER_FIELDS, isPacked, NODE_FIELDS } from "./capacity_rollup.ts";
import {
  type CapacityForecast,
  forecastCapacity,
  forecastSentence,
} from "./capacity_forecast.ts";
import { type CapacityCost, capacityCost } from "./capacity_cost.ts";
import { k } from "./kv_keys.ts";
import type { NodeRecord, NodeStatus } from "./nodes.ts";
import { getPricing, type Pricing } from "./pricing.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import type { Store } from "./store.ts";
import { slotUnits } from "../fleet/instances.ts";

/** Days in the window (4 weeks, today included). */
export const WINDOW_DAYS = 28;
export type { CapacityCost, ModelCost } from "./capacity_cost.ts";
/** The share of capacity the forecast looks for. */
export const FORECAST_THRESHOLD = 0.9;

const HOUR = 3_600_000;
const DAY = 86_400_000;
const NF = NODE_FIELDS.length;
const CF = CLUSTER_FIELDS.length;
// NODE_FIELDS slots
const N_REQ = 0, N_PROMPT = 1, N_COMPL = 2, N_SLOT = 4, N_QUEUE = 5;
// CLUSTER_FIELDS slots
const C_ROUTED = 0, C_QUEUED = 1, C_QUEUE = 2, C_REFUSED = 3;

/** Hourly series over the window (index 0 = `window.from`), as columns. */
export interface CapacitySeries {
  /** Busy share 0..1 (null: no capacity that hour). */
  busy: (number | null)[];
  /** Completion tokens per second delivered. */
  tokensPerSecond: number[];
  requests: number[];
  /** Mean wait for a slot per request, ms (null: no requests). */
  queueMs: (number | null)[];
}

/** Means by day of week (0 = Monday … 6 = Sunday) and hour of day (UTC): `[day][hour]`. */
export interface CapacityHeatmap {
  busy: (number | null)[][];
  tokensPerSecond: (number | null)[][];
  queueMs: (number | null)[][];
}

/** One node, or the cluster (`id` "*"), over the window. */
export interface SubjectCapacity {
  id: string;
  name: string;
  /** Slots now (nodes; null: no heartbeat, or removed; the cluster: their sum, a spanning instance counted once). */
  slots: number | null;
  /** Enrolled hours in the window (the cluster: node-hours). */
  capacityHours: number;
  requests: number;
  promptTokens: number;
  completionTokens: number;
  /** Mean busy share over its capacity (null: none). */
  busyShare: number | null;
  /** The busiest whole hour. */
  peakBusy: { share: number; at: string } | null;
  /** Mean tokens/s delivered over its capacity hours. */
  tokensPerSecond: number;
  /** Measured peak: the highest tokens/s delivered in a whole hour. */
  peakTokensPerSecond: { value: number; at: string } | null;
  /** tokensPerSecond ÷ the measured peak (null: no peak). */
  deliveredVsPeak: number | null;
  /** Mean wait for a slot per request, ms (null: no requests). */
  queueMs: number | null;
  series: CapacitySeries;
  heatmap: CapacityHeatmap;
  /** By hour of day (UTC), weekdays (Monday–Friday) and weekends apart: `[hour]`. */
  byHour: {
    weekdayBusy: (number | null)[];
    weekendBusy: (number | null)[];
    weekdayTokensPerSecond: (number | null)[];
  };
  /** By UTC day of the window: mean and peak busy share, tokens/s, mean wait. */
  daily: {
    busy: (number | null)[];
    peakBusy: (number | null)[];
    tokensPerSecond: number[];
    queueMs: (number | null)[];
  };
}

/** The cluster's figures, with what only it knows. */
export interface ClusterCapacity extends SubjectCapacity {
  /** Nodes with capacity in the window (enrolled now, or served in it). */
  nodes: number;
  /** Requests that reached routing: served, or refused. */
  routed: number;
  /** Requests that waited for a slot. */
  queued: number;
  /** Requests refused for lack of capacity, in all, per hour and per day (`series.requests` counts routed ones). */
  refused: number;
  refusedSeries: number[];
  refusedDaily: number[];
}

/** The capacity report. */
export interface CapacityReport {
  window: { from: string; to: string; days: number; hours: number };
  generatedAt: string;
  cluster: ClusterCapacity;
  nodes: SubjectCapacity[];
  /** Each week's weekday peak busy share (Monday–Friday, UTC), oldest first. */
  weeks: { from: string; to: string; weekdayPeak: number | null }[];
  threshold: number;
  forecast: CapacityForecast;
  forecastText: string;
  cost: CapacityCost;
}

/** What the rollups hold for the window, as arrays by hour. */
interface Sums {
  nodes: Map<string, Float64Array>;
  cluster: Float64Array;
  models: Map<string, Float64Array>;
}

/** Builds the capacity report for the 4 weeks up to `now` (platform admins only). */
export async function capacityReport(
  store: Store,
  p: Principal,
  now = Date.now(),
): Promise<CapacityReport> {
  requirePlatform(p);
  const from = now - (now % DAY) - (WINDOW_DAYS - 1) * DAY;
  const hours = Math.floor((now - from) / HOUR) + 1;
  const [sums, records, statuses, pricing] = await Promise.all([
    readSums(store, from, hours),
    listValues<NodeRecord>(store, k.nodePrefix()),
    listValues<NodeStatus>(store, k.nodeStatusPrefix()),
    getPricing(store),
  ]);
  const slotsOf = new Map<string, number>();
  for (const [id, s] of statuses) slotsOf.set(id, s.stats.slots);
  const live = [...statuses].filter(([id]) => records.has(id));
  const clusterSlots = slotUnits(live.map(([, st]) => st));
  return buildReport(
    sums,
    records,
    slotsOf,
    clusterSlots,
    pricing,
    from,
    hours,
    now,
  );
}

async function listValues<T>(
  store: Store,
  prefix: Deno.KvKey,
): Promise<Map<string, T>> {
  const out = new Map<string, T>();
  for await (const e of store.kv.list<T>({ prefix })) {
    out.set(String(e.key[prefix.length]), e.value);
  }
  return out;
}

/** Reads every capacity group of the window's days (every writer's shard summed). */
async function readSums(
  store: Store,
  from: number,
  hours: number,
): Promise<Sums> {
  const days = Math.ceil(hours / 24);
  const prefix = k.usageCapacityPrefix();
  const day = (i: number) =>
    new Date(from + i * DAY).toISOString().slice(0, 10);
  const sums: Sums = {
    nodes: new Map(),
    cluster: new Float64Array(days * 24 * CF),
    models: new Map(),
  };
  const it = store.kv.list({
    start: [...prefix, day(0)],
    end: [...prefix, day(days - 1), "\uffff"],
  }, { batchSize: 1000 });
  for await (const e of it) {
    const v = e.value;
    if (!isPacked(v)) continue;
    const d = Math.round((Date.parse(String(e.key[1])) - from) / DAY);
    if (!(d >= 0 && d < days)) continue;
    const kind = e.key[2], subject = String(e.key[3]);
    if (kind === "model") {
      let m = sums.models.get(subject);
      if (!m) sums.models.set(subject, m = new Float64Array(v.n));
      for (let i = 0; i < m.length && i < v.v.length; i++) m[i]! += v.v[i]!;
      continue;
    }
    const hourly = kind === "node" ? NF : kind === "cluster" ? CF : 0;
    if (hourly === 0 || v.n !== hourly) continue;
    let a = kind === "cluster" ? sums.cluster : sums.nodes.get(subject);
    if (!a) sums.nodes.set(subject, a = new Float64Array(days * 24 * NF));
    const o = d * 24 * hourly;
    const len = Math.min(v.v.length, 24 * hourly);
    for (let i = 0; i < len; i++) a[o + i]! += v.v[i]!;
  }
  return sums;
}

/** Ms of capacity a node had in each hour of the window. */
function capacityOf(
  record: NodeRecord | undefined,
  a: Float64Array | undefined,
  from: number,
  hours: number,
  now: number,
): Float64Array {
  const cap = new Float64Array(hours);
  let start: number, end: number;
  if (record) {
    start = Date.parse(record.enrolledAt);
    end = now;
  } else {
    // removed: from the first to the end of the last hour it served
    let first = -1, last = -1;
    for (let h = 0; h < hours && a; h++) {
      if (a[h * NF + N_REQ]! > 0) {
        if (first < 0) first = h;
        last = h;
      }
    }
    if (first < 0) return cap;
    start = from + first * HOUR;
    end = Math.min(now, from + (last + 1) * HOUR);
  }
  for (let h = 0; h < hours; h++) {
    const t0 = from + h * HOUR;
    cap[h] = Math.max(0, Math.min(t0 + HOUR, end) - Math.max(t0, start));
  }
  return cap;
}

/** Inputs of one subject's figures: per hour capacity (ms) and sums. */
interface SubjectInput {
  id: string;
  name: string;
  slots: number | null;
  cap: Float64Array;
  slot: Float64Array;
  completion: Float64Array;
  prompt: Float64Array;
  requests: Float64Array;
  queue: Float64Array;
}

function emptyGrid(): (number | null)[][] {
  return Array.from({ length: 7 }, () => new Array(24).fill(null));
}

function subjectOf(
  s: SubjectInput,
  from: number,
  now: number,
): SubjectCapacity {
  const hours = s.cap.length;
  const series: CapacitySeries = {
    busy: [],
    tokensPerSecond: [],
    requests: [],
    queueMs: [],
  };
  // heatmap cells: sums of slot-time, capacity, tokens, seconds, queue, requests
  const cell = Array.from({ length: 7 * 24 }, () => new Float64Array(6));
  // per day: the same sums, and the peak busy share (-1: none)
  const daily = Array.from(
    { length: Math.ceil(hours / 24) },
    () => new Float64Array([0, 0, 0, 0, 0, 0, -1]),
  );
  let capMs = 0, slotMs = 0, completion = 0, prompt = 0, requests = 0;
  let queue = 0, seconds = 0;
  let peakBusy: SubjectCapacity["peakBusy"] = null;
  let peakTps: SubjectCapacity["peakTokensPerSecond"] = null;
  for (let h = 0; h < hours; h++) {
    const t0 = from + h * HOUR;
    const cap = s.cap[h]!;
    const slot = Math.min(s.slot[h]!, cap);
    const secs = Math.max(0, Math.min(HOUR, now - t0)) / 1000;
    const busy = cap > 0 ? slot / cap : null;
    const tps = secs > 0 ? s.completion[h]! / secs : 0;
    series.busy.push(busy);
    series.tokensPerSecond.push(tps);
    series.requests.push(s.requests[h]!);
    series.queueMs.push(
      s.requests[h]! > 0 ? s.queue[h]! / s.requests[h]! : null,
    );
    if (cap > 0) {
      capMs += cap;
      slotMs += slot;
      seconds += secs;
    }
    completion += s.completion[h]!;
    prompt += s.prompt[h]!;
    requests += s.requests[h]!;
    queue += s.queue[h]!;
    const whole = t0 + HOUR <= now;
    if (whole && busy !== null && (!peakBusy || busy > peakBusy.share)) {
      peakBusy = { share: busy, at: new Date(t0).toISOString() };
    }
    if (whole && tps > 0 && (!peakTps || tps > peakTps.value)) {
      peakTps = { value: tps, at: new Date(t0).toISOString() };
    }
    const day = Math.floor(h / 24);
    const dd = daily[day]!;
    dd[0]! += slot;
    dd[1]! += cap;
    dd[2]! += s.completion[h]!;
    dd[3]! += secs;
    dd[4]! += s.queue[h]!;
    dd[5]! += s.requests[h]!;
    if (whole && busy !== null) dd[6] = Math.max(dd[6]!, busy);
    const d = new Date(t0);
    const c = cell[((d.getUTCDay() + 6) % 7) * 24 + d.getUTCHours()]!;
    c[0]! += slot;
    c[1]! += cap;
    c[2]! += s.completion[h]!;
    c[3]! += secs;
    c[4]! += s.queue[h]!;
    c[5]! += s.requests[h]!;
  }
  const heatmap: CapacityHeatmap = {
    busy: emptyGrid(),
    tokensPerSecond: emptyGrid(),
    queueMs: emptyGrid(),
  };
  for (let i = 0; i < cell.length; i++) {
    const c = cell[i]!, d = Math.floor(i / 24), h = i % 24;
    if (c[1]! > 0) heatmap.busy[d]![h] = c[0]! / c[1]!;
    if (c[3]! > 0) heatmap.tokensPerSecond[d]![h] = c[2]! / c[3]!;
    if (c[5]! > 0) heatmap.queueMs[d]![h] = c[4]! / c[5]!;
  }
  // weekdays (cells 0..4 × 24) and weekends (5..6) by hour of day
  const byHour: SubjectCapacity["byHour"] = {
    weekdayBusy: [],
    weekendBusy: [],
    weekdayTokensPerSecond: [],
  };
  for (let h = 0; h < 24; h++) {
    const sum = (days: number[], a: number, b: number) => {
      let x = 0, y = 0;
      for (const d of days) {
        x += cell[d * 24 + h]![a]!;
        y += cell[d * 24 + h]![b]!;
      }
      return y > 0 ? x / y : null;
    };
    byHour.weekdayBusy.push(sum([0, 1, 2, 3, 4], 0, 1));
    byHour.weekendBusy.push(sum([5, 6], 0, 1));
    byHour.weekdayTokensPerSecond.push(sum([0, 1, 2, 3, 4], 2, 3));
  }
  const tokensPerSecond = seconds > 0 ? completion / seconds : 0;
  return {
    id: s.id,
    name: s.name,
    slots: s.slots,
    capacityHours: capMs / HOUR,
    requests,
    promptTokens: prompt,
    completionTokens: completion,
    busyShare: capMs > 0 ? slotMs / capMs : null,
    peakBusy,
    tokensPerSecond,
    peakTokensPerSecond: peakTps,
    deliveredVsPeak: peakTps ? tokensPerSecond / peakTps.value : null,
    queueMs: requests > 0 ? queue / requests : null,
    series,
    heatmap,
    byHour,
    daily: {
      busy: daily.map((d) => d[1]! > 0 ? d[0]! / d[1]! : null),
      peakBusy: daily.map((d) => d[6]! >= 0 ? d[6]! : null),
      tokensPerSecond: daily.map((d) => d[3]! > 0 ? d[2]! / d[3]! : 0),
      queueMs: daily.map((d) => d[5]! > 0 ? d[4]! / d[5]! : null),
    },
  };
}

/** Column `f` of an hour-major array with `n` fields per hour. */
function column(a: Float64Array, n: number, f: number, hours: number) {
  const out = new Float64Array(hours);
  for (let h = 0; h < hours; h++) out[h] = a[h * n + f]!;
  return out;
}

/** Assembles the report from the window's sums (pure: tested through capacityReport). */
function buildReport(
  sums: Sums,
  records: Map<string, NodeRecord>,
  slotsOf: Map<string, number>,
  /** The cluster's slots, a spanning instance's counted once (fleet/instances.ts). */
  clusterSlots: number | null,
  pricing: Pricing,
  from: number,
  hours: number,
  now: number,
): CapacityReport {
  const ids = new Set([...records.keys(), ...sums.nodes.keys()]);
  const inputs: SubjectInput[] = [];
  for (const id of ids) {
    const a = sums.nodes.get(id) ?? new Float64Array(hours * NF);
    const rec = records.get(id);
    const cap = capacityOf(rec, sums.nodes.get(id), from, hours, now);
    if (!cap.some((c) => c > 0)) continue;
    inputs.push({
      id,
      name: rec?.name ?? `removed node ${id}`,
      slots: rec ? slotsOf.get(id) ?? null : null,
      cap,
      slot: column(a, NF, N_SLOT, hours),
      completion: column(a, NF, N_COMPL, hours),
      prompt: column(a, NF, N_PROMPT, hours),
      requests: column(a, NF, N_REQ, hours),
      queue: column(a, NF, N_QUEUE, hours),
    });
  }
  inputs.sort((a, b) => a.name.localeCompare(b.name) || (a.id < b.id ? -1 : 1));
  const nodes = inputs.map((s) => subjectOf(s, from, now));
  const total = (pick: (s: SubjectInput) => Float64Array) => {
    const out = new Float64Array(hours);
    for (const s of inputs) {
      const a = pick(s);
      for (let h = 0; h < hours; h++) out[h]! += a[h]!;
    }
    return out;
  };
  // the cluster's slot-time is its nodes' (each capped at their capacity)
  const slot = new Float64Array(hours);
  for (const s of inputs) {
    for (let h = 0; h < hours; h++) slot[h]! += Math.min(s.slot[h]!, s.cap[h]!);
  }
  const c = sums.cluster;
  const cluster = subjectOf(
    {
      id: "*",
      name: "Cluster",
      slots: clusterSlots,
      cap: total((s) => s.cap),
      slot,
      completion: total((s) => s.completion),
      prompt: total((s) => s.prompt),
      // the cluster's requests and waits include those refused
      requests: column(c, CF, C_ROUTED, hours),
      queue: column(c, CF, C_QUEUE, hours),
    },
    from,
    now,
  );
  const refusedSeries = Array.from(column(c, CF, C_REFUSED, hours));
  let queued = 0;
  for (let h = 0; h < hours; h++) queued += c[h * CF + C_QUEUED]!;
  const weeks = weeklyPeaks(cluster.series.busy, from, now);
  const forecast = forecastCapacity(
    weeks.map((w) => ({ at: w.at, peak: w.weekdayPeak })),
    now,
    FORECAST_THRESHOLD,
  );
  return {
    window: {
      from: new Date(from).toISOString(),
      to: new Date(now).toISOString(),
      days: WINDOW_DAYS,
      hours,
    },
    generatedAt: new Date(now).toISOString(),
    cluster: {
      ...cluster,
      nodes: nodes.length,
      routed: cluster.requests,
      // served requests are the nodes'; the cluster's `requests` are routed
      requests: nodes.reduce((n, x) => n + x.requests, 0),
      queued,
      refused: refusedSeries.reduce((a, b) => a + b, 0),
      refusedSeries,
      refusedDaily: Array.from(
        { length: Math.ceil(hours / 24) },
        (_, d) =>
          refusedSeries.slice(d * 24, d * 24 + 24).reduce((a, b) => a + b, 0),
      ),
    },
    nodes,
    weeks: weeks.map(({ at: _at, ...w }) => w),
    threshold: FORECAST_THRESHOLD,
    forecast,
    forecastText: forecastSentence(forecast, FORECAST_THRESHOLD),
    cost: capacityCost(pricing, inputs, sums.models, from),
  };
}

/** Each week's highest whole-hour busy share on weekdays (UTC). */
function weeklyPeaks(
  busy: (number | null)[],
  from: number,
  now: number,
): { at: number; from: string; to: string; weekdayPeak: number | null }[] {
  const out = [];
  for (let w = 0; w < WINDOW_DAYS / 7; w++) {
    const start = from + w * 7 * DAY;
    let peak: number | null = null;
    for (let h = w * 168; h < (w + 1) * 168 && h < busy.length; h++) {
      const t0 = from + h * HOUR;
      const wd = new Date(t0).getUTCDay();
      const b = busy[h];
      if (
        wd === 0 || wd === 6 || t0 + HOUR > now || b === null || b === undefined
      ) {
        continue;
      }
      if (peak === null || b > peak) peak = b;
    }
    out.push({
      at: start + 3.5 * DAY,
      weekdayPeak: peak,
      from: new Date(start).toISOString(),
      to: new Date(start + 7 * DAY).toISOString(),
    });
  }
  return out;
}
