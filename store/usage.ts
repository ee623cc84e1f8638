/**
 * Usage metering: one record per gateway request (never prompt text) and
 * rollups per hour and day for each tenant, key, tenant × model, model and
 * overall, plus month rollups (store/usage_month.ts reads them; they are
 * written by store/usage_rollups.ts). A rollup
 * group is one packed value per writer (see UsageRollups) holding latency
 * and time to first token as sums plus fixed histogram buckets, so charts
 * read a few hundred keys whatever the traffic, and percentiles come from
 * the buckets. Records are packed too: a tenant's records written together
 * share one value (up to RECORDS_PER_VALUE), so 1,000 tenants' traffic does
 * not cost one B-tree page per request.
 */
import { k, type UsageDimension } from "./kv_keys.ts";
import { ValidationError } from "./errors.ts";
import {
  checkCursor,
  type Page,
  type PageOptions,
  pageSize,
} from "./pagination.ts";
import type { Store } from "./store.ts";

/**
 * One request as metered by the gateway, and its request log entry
 * (store/request_log.ts). `model` is "" for a request refused before its
 * model was known (a bad body, an unknown or forbidden model): it is
 * logged, but added to no rollup.
 */
export interface UsageRecord {
  id: string;
  /** ISO time the request started. */
  at: string;
  requestId: string;
  tenantId: string;
  keyId: string;
  model: string;
  nodeId: string | null;
  endpoint: "chat" | "completions" | "embeddings" | "messages" | "responses";
  promptTokens: number;
  completionTokens: number;
  latencyMs: number;
  /** Time to first token (streams) or to the response (others); null if none came. */
  ttftMs: number | null;
  /** HTTP status given to the client (200 for streams that ended with an error frame: see outcome). */
  status: number;
  outcome: "ok" | "error" | "cancelled";
  /**
   * How the tokens were made when the engine reported none: "counted" by
   * the node with the model's tokenizer, or "estimated". Absent: reported
   * by the engine (records written before this field are so read too).
   */
  usageBasis?: "counted" | "estimated";
  /** The error's `code` and `type` as the client got them (absent when it succeeded). */
  errorCode?: string | null;
  errorType?: string;
  /** How long it waited at the gateway for a node slot, ms (absent: not at all). */
  queueMs?: number;
  /** Its node's slot count when it was routed there (absent: not routed). */
  slots?: number;
  /**
   * The other Orchard nodes of the spanning instance that served it
   * (fleet/instances.ts), at most 32: each counts busy for its time too, in
   * chargeback and capacity, as `nodeId` does. Absent: one node served it.
   */
  members?: string[];
  /**
   * Refused for lack of capacity (503 `server_busy`): every slot busy and
   * the queue full, or its wait for a slot timed out.
   */
  refused?: "queue_full" | "queue_timeout";
  /**
   * How the request's hints were taken, as its `x-orchard-*` response
   * headers said (names without the prefix): `ignored` (accepted, no
   * effect here), `tools-omitted` (built-in tools left out), `tool-grammar`
   * (tools whose argument schemas were loosened), `reasoning-effort`.
   * Absent: none applied. Never prompt text.
   */
  notes?: Record<string, string>;
}

/** Upper bounds (ms) of the latency and TTFT histogram buckets; the last is +Inf. */
export const LATENCY_BUCKETS_MS = [
  25,
  50,
  100,
  250,
  500,
  1000,
  2500,
  5000,
  10_000,
  30_000,
  60_000,
  Infinity,
] as const;

/*
 * Single usage records are the request log: kept as long as
 * `requestLogRetentionMs` says (store/request_log.ts: the tenant's
 * retention period for usage records); rollups are kept.
 */

/** The bucket index of a duration. */
export function bucketOf(ms: number): number {
  let i = 0;
  while (ms > LATENCY_BUCKETS_MS[i]!) i++;
  return i;
}

/** Time buckets: `2026-11-22T10` (hour) or `2026-11-22` (day). */
export function timeBucket(g: "hour" | "day", ms: number): string {
  return new Date(ms).toISOString().slice(0, g === "hour" ? 13 : 10);
}

/**
 * Most records in one KV value: a record is at most ~900 bytes serialized
 * (ids, a model name of at most 256 characters, numbers), so a value stays
 * well under KV's 64 KiB.
 */
export const RECORDS_PER_VALUE = 48;

/**
 * A rollup group's totals, the value stored under each shard key: field
 * name → sum, absent when zero. Hour and day groups: `requests`, `errors`,
 * `limited`, `prompt`, `completion`, `latency_sum`, `ttft_sum`, and
 * `lat_<i>` / `ttft_<i>` (count in LATENCY_BUCKETS_MS bucket i; ttft count
 * is their sum). Month groups: tenant `requests`, `tokens`, `errors`;
 * tenant_model `requests`, `prompt`, `completion`; node and node_tenant
 * `busy_ms` and `tokens` (prompt + completion; written since chargeback
 * could split by tokens).
 * Capacity groups are packed instead (store/capacity_rollup.ts).
 */
export type RollupFields = Record<string, number>;

/** The field of a rollup value saying up to which of its writer's records it holds (store/usage_rollups.ts). */
export const SEQ_FIELD = "_seq";

/**
 * The fields of one rollup entry: a packed group (an object of sums) or a
 * legacy per-field counter (a KvU64 whose key ends with the field name).
 */
export function rollupFields(e: Deno.KvEntry<unknown>): [string, number][] {
  const v = e.value;
  if (v instanceof Deno.KvU64) {
    return [[String(e.key[e.key.length - 1]), Number(v.value)]];
  }
  if (v && typeof v === "object") {
    return Object.entries(v as RollupFields).filter(([f, n]) =>
      typeof n === "number" && f !== SEQ_FIELD
    );
  }
  return [];
}

/** A query over rollups: the narrowest dimension given is used. */
export interface UsageQuery {
  tenantId?: string;
  /** Requires tenantId (keys are scoped to their tenant). */
  keyId?: string;
  model?: string;
  granularity: "hour" | "day";
  /** Inclusive range (epoch ms or Date). */
  from: number | Date;
  to: number | Date;
}

/** Sums of one time bucket. */
export interface UsagePoint {
  /** Bucket start, ISO. */
  bucket: string;
  requests: number;
  errors: number;
  /** Requests refused by a rate limit or quota (429); also counted in errors. */
  limited: number;
  promptTokens: number;
  completionTokens: number;
  latencyMsSum: number;
  ttftMsSum: number;
  ttftCount: number;
  /** Counts per LATENCY_BUCKETS_MS bucket. */
  latencyHistogram: number[];
  ttftHistogram: number[];
}

function dimensionOf(q: UsageQuery): [UsageDimension, string] {
  if (q.keyId) {
    if (!q.tenantId) {
      throw new RangeError("Cannot query usage by key: tenantId is required");
    }
    return ["key", `${q.tenantId}/${q.keyId}`];
  }
  if (q.tenantId && q.model) {
    return ["tenant_model", `${q.tenantId}/${q.model}`];
  }
  if (q.tenantId) return ["tenant", q.tenantId];
  if (q.model) return ["model", q.model];
  return ["all", "*"];
}

function emptyPoint(bucket: string): UsagePoint {
  const zeros = () => LATENCY_BUCKETS_MS.map(() => 0);
  return {
    bucket,
    requests: 0,
    errors: 0,
    limited: 0,
    promptTokens: 0,
    completionTokens: 0,
    latencyMsSum: 0,
    ttftMsSum: 0,
    ttftCount: 0,
    latencyHistogram: zeros(),
    ttftHistogram: zeros(),
  };
}

const FIELD: Record<string, keyof UsagePoint> = {
  requests: "requests",
  errors: "errors",
  limited: "limited",
  prompt: "promptTokens",
  completion: "completionTokens",
  latency_sum: "latencyMsSum",
  ttft_sum: "ttftMsSum",
};

/** One point per hour or day in [from, to] (zeros where nothing happened), read from rollups only. */
export async function usageSeries(
  store: Store,
  q: UsageQuery,
): Promise<UsagePoint[]> {
  const step = q.granularity === "hour" ? 3_600_000 : 86_400_000;
  const from = +q.from - (+q.from % step);
  const to = +q.to;
  if (!(to >= from)) {
    throw new RangeError("Cannot query usage: `to` is before `from`");
  }
  if ((to - from) / step > 2000) {
    throw new RangeError("Cannot query usage: more than 2000 points");
  }
  const [dim, subject] = dimensionOf(q);
  const points = new Map<string, UsagePoint>();
  const out: UsagePoint[] = [];
  for (let t = from; t <= to; t += step) {
    const b = timeBucket(q.granularity, t);
    const p = emptyPoint(new Date(t).toISOString());
    points.set(b, p);
    out.push(p);
  }
  const prefix = k.usageRollupPrefix(q.granularity, dim, subject);
  const iter = store.kv.list({
    start: [...prefix, timeBucket(q.granularity, from)],
    end: [...prefix, timeBucket(q.granularity, to), "\uffff"],
  });
  for await (const e of iter) {
    const p = points.get(e.key[prefix.length] as string);
    if (!p) continue;
    for (const [f, v] of rollupFields(e)) {
      const name = FIELD[f];
      if (name) (p[name] as number) += v;
      else if (f.startsWith("lat_")) {
        p.latencyHistogram[Number(f.slice(4))]! += v;
      } else if (f.startsWith("ttft_")) {
        p.ttftHistogram[Number(f.slice(5))]! += v;
        p.ttftCount += v;
      }
    }
  }
  return out;
}

/** Totals over [from, to] with latency and TTFT percentiles (bucket upper bounds). */
export interface UsageTotals extends Omit<UsagePoint, "bucket"> {
  latencyP50Ms: number | null;
  latencyP95Ms: number | null;
  ttftP50Ms: number | null;
  ttftP95Ms: number | null;
}

/** Sums a usage series into totals, read from rollups only. */
export async function usageTotals(
  store: Store,
  q: UsageQuery,
): Promise<UsageTotals> {
  return usageTotalsOf(await usageSeries(store, q));
}

/** Sums the points of a series into totals with percentiles. */
export function usageTotalsOf(series: UsagePoint[]): UsageTotals {
  const t = emptyPoint("");
  for (const p of series) {
    for (const f of Object.values(FIELD)) (t[f] as number) += p[f] as number;
    t.ttftCount += p.ttftCount;
    p.latencyHistogram.forEach((v, i) => t.latencyHistogram[i]! += v);
    p.ttftHistogram.forEach((v, i) => t.ttftHistogram[i]! += v);
  }
  const { bucket: _b, ...rest } = t;
  return {
    ...rest,
    latencyP50Ms: percentile(t.latencyHistogram, 0.5),
    latencyP95Ms: percentile(t.latencyHistogram, 0.95),
    ttftP50Ms: percentile(t.ttftHistogram, 0.5),
    ttftP95Ms: percentile(t.ttftHistogram, 0.95),
  };
}

/** The upper bound of the bucket holding quantile `q` of a histogram (null if empty; Infinity past the last bound). */
export function percentile(hist: number[], q: number): number | null {
  const total = hist.reduce((a, b) => a + b, 0);
  if (total === 0) return null;
  const rank = Math.ceil(q * total);
  let seen = 0;
  for (let i = 0; i < hist.length; i++) {
    seen += hist[i]!;
    if (seen >= rank) return LATENCY_BUCKETS_MS[i] ?? Infinity;
  }
  return Infinity;
}

/**
 * Lists a tenant's usage records, newest first (access checks are the
 * caller's): values newest first, and the records of a value (written
 * together by one gateway) from the last that came. The cursor is an
 * offset into a value and the KV cursor before it: `<offset>-<kv cursor>`.
 */
export async function listUsageRecords(
  store: Store,
  tenantId: string,
  opts: PageOptions = {},
): Promise<Page<UsageRecord>> {
  const limit = pageSize(opts.limit);
  const reverse = opts.reverse ?? true;
  const at = /^(\d{1,4})-(.*)$/.exec(opts.cursor ?? "");
  if (opts.cursor && !at) {
    throw new ValidationError("cursor is invalid", "cursor");
  }
  let skip = at ? Number(at[1]) : 0;
  let before = at?.[2] ?? "";
  const iter = store.kv.list<UsageRecord | UsageRecord[]>(
    { prefix: k.usageRecordPrefix(tenantId) },
    // A value holds one record at least: a page needs `limit` at most.
    { cursor: checkCursor(before), reverse, batchSize: limit },
  );
  const items: UsageRecord[] = [];
  try {
    for await (const e of iter) {
      // A single record: written by an earlier version.
      const rs = Array.isArray(e.value) ? e.value : [e.value];
      if (reverse) rs.reverse();
      for (let i = skip; i < rs.length; i++) {
        if (items.length === limit) return { items, cursor: `${i}-${before}` };
        items.push(rs[i]!);
      }
      skip = 0;
      before = iter.cursor;
    }
  } catch (err) {
    if (opts.cursor) throw new ValidationError("cursor is invalid", "cursor");
    throw err;
  }
  return { items, cursor: null };
}
