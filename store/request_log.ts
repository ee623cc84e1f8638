/**
 * The request log: each tenant's recent requests (time, key, model, node,
 * status, tokens, latency, time to first byte, error code and type; never
 * prompt text or secrets), newest first, filterable by key, model, node,
 * status class and time.
 *
 * It is the usage records themselves (store/usage.ts): the gateway meters
 * every request it can tie to a key, refused ones included, and its usage
 * writer (store/usage_rollups.ts) writes each tenant's records as packed
 * values off the request path. In the same commit it writes this module's
 * index: per value, one small entry per key, model, node and status class
 * in it, holding those records (when few: INLINE_MAX) or their positions,
 * so a filtered page reads only small entries and the values that hold
 * matches. Values and index entries expire together after
 * `requestLogRetentionMs`: the tenant's retention period for usage records
 * (store/retention.ts: its choice within the provider's bounds, else the
 * provider's default).
 */
import { decodeTime } from "ulid";
import { idBoundAt } from "./ids.ts";
import { ValidationError } from "./errors.ts";
import { k, type RequestLogDimension } from "./kv_keys.ts";
import { type PageOptions, pageSize } from "./pagination.ts";
import {
  type Principal,
  requirePlatform,
  requireTenantRead,
} from "./principal.ts";
import {
  DAY_MS,
  getRetentionBounds,
  setRetentionBounds,
  tenantRetention,
} from "./retention.ts";
import type { Store } from "./store.ts";
import type { UsageRecord } from "./usage.ts";

/** The request log's platform setting: the default period of usage records. */
export interface RequestLogSettings {
  retentionDays: number;
  /** The bounds a default must stay within. */
  minDays: number;
  maxDays: number;
  updatedAt: string | null;
}

/** Reads the provider's default retention of usage records (the request log). */
export async function getRequestLogSettings(
  store: Store,
): Promise<RequestLogSettings> {
  const b = await getRetentionBounds(store);
  return {
    retentionDays: b.defaults.usage,
    minDays: b.min.usage,
    maxDays: b.max.usage,
    updatedAt: b.updatedAt ?? null,
  };
}

/**
 * Sets how many days requests are kept for tenants that chose no period of
 * their own (platform admins; audited as a change of the retention
 * bounds). It must lie within the provider's bounds for usage records.
 */
export async function setRequestLogSettings(
  store: Store,
  p: Principal,
  input: { retentionDays: unknown },
): Promise<RequestLogSettings> {
  requirePlatform(p);
  const b = await getRetentionBounds(store);
  const days = Number(input.retentionDays);
  if (
    !Number.isInteger(days) || days < b.min.usage || days > b.max.usage
  ) {
    throw new ValidationError(
      `Retention must be a whole number of days from ${b.min.usage} to ${b.max.usage}`,
      "retentionDays",
    );
  }
  const { updatedAt: _, ...bounds } = b;
  await setRetentionBounds(store, p, {
    ...bounds,
    defaults: { ...b.defaults, usage: days },
  });
  cache.clear();
  return await getRequestLogSettings(store);
}

/** How long a tenant's period is reused (it applies to new writes only). */
const SETTING_TTL_MS = 5_000;
const cache = new Map<string, { until: number; days: Promise<number> }>();

/**
 * How long a tenant's requests (its usage records) are kept, in ms: its
 * retention period for usage records. Cached a few seconds per tenant: the
 * usage writer asks per batch.
 */
export function requestLogRetentionMs(
  store: Store,
  tenantId: string,
): Promise<number> {
  const now = Date.now();
  let c = cache.get(tenantId);
  if (!c || now >= c.until) {
    if (cache.size > 10_000) cache.clear();
    c = {
      until: now + SETTING_TTL_MS,
      days: tenantRetention(store, tenantId).then((r) => r.usage),
    };
    const mine = c;
    c.days.catch(() => {
      if (cache.get(tenantId) === mine) cache.delete(tenantId);
    });
    cache.set(tenantId, c);
  }
  return c.days.then((d) => d * DAY_MS);
}

/** A status class as filtered and indexed. */
export type StatusClass = "2xx" | "4xx" | "5xx";
export const STATUS_CLASSES: readonly StatusClass[] = ["2xx", "4xx", "5xx"];

/** The class of an HTTP status (499, a client gone, is 4xx). */
export function statusClass(status: number): StatusClass {
  return status >= 500 ? "5xx" : status >= 400 ? "4xx" : "2xx";
}

/**
 * The index entries of one packed value of a tenant's records: for each
 * key, model, node and status class in it, the positions of its records.
 */
export function requestLogIndexSets(
  tenantId: string,
  valueId: string,
  records: readonly UsageRecord[],
): [Deno.KvKey, number[] | UsageRecord[]][] {
  const by = new Map<string, [RequestLogDimension, string, number[]]>();
  const add = (dim: RequestLogDimension, value: string, i: number) => {
    const id = `${dim}\u0000${value}`;
    const e = by.get(id);
    if (e) e[2].push(i);
    else by.set(id, [dim, value, [i]]);
  };
  records.forEach((r, i) => {
    add("key", r.keyId, i);
    if (r.model) add("model", r.model, i);
    if (r.nodeId) add("node", r.nodeId, i);
    add("status", statusClass(r.status), i);
  });
  return [...by.values()].map(([dim, value, positions]) => [
    k.requestLogIndex(tenantId, dim, value, valueId),
    positions.length <= INLINE_MAX
      ? positions.map((i) => records[i]!)
      : positions,
  ]);
}

/**
 * An index entry of at most this many records holds the records
 * themselves, not their positions: a selective filter (one key of many, an
 * error class) then reads small entries only, never the 48-record values.
 */
export const INLINE_MAX = 6;

/** Filters of the request log (all optional; times in epoch ms, inclusive). */
export interface RequestLogFilter extends Omit<PageOptions, "reverse"> {
  keyId?: string;
  model?: string;
  nodeId?: string;
  status?: StatusClass;
  from?: number;
  to?: number;
}

/** A page of the request log. */
export interface RequestLogPage {
  items: UsageRecord[];
  /** Where the next page starts; null at the end. */
  cursor: string | null;
  /**
   * The page stopped early: it read as many values as a page may without
   * filling up (a rare filter over many requests); `cursor` searches on,
   * from `searchedTo` back.
   */
  partial: boolean;
  searchedTo: string | null;
}

/** The time a value's id says (null for an id that is not a ULID). */
function timeOfId(id: string): string | null {
  try {
    return new Date(decodeTime(id.toUpperCase())).toISOString();
  } catch {
    return null;
  }
}

/** Most values (each up to RECORDS_PER_VALUE records) one page reads. */
export const MAX_VALUES_PER_PAGE = 200;
/**
 * How far a value's first record may be from a record in it: records wait
 * at most a minute to be written and a request lasts at most its total
 * timeout; an hour of slack either way, then filtered exactly.
 */
const SPAN_MS = 3_600_000;

function checkFilter(f: RequestLogFilter): void {
  for (
    const [name, v] of [["key", f.keyId], ["model", f.model], [
      "node",
      f.nodeId,
    ]] as const
  ) {
    if (v !== undefined && (typeof v !== "string" || v.length > 256)) {
      throw new ValidationError(`${name} is invalid`, name);
    }
  }
  if (f.status !== undefined && !STATUS_CLASSES.includes(f.status)) {
    throw new ValidationError("status must be 2xx, 4xx or 5xx", "status");
  }
  for (const [name, v] of [["from", f.from], ["to", f.to]] as const) {
    if (v !== undefined && !Number.isFinite(v)) {
      throw new ValidationError(`${name} must be a date and time`, name);
    }
  }
  if (f.from !== undefined && f.to !== undefined && f.to < f.from) {
    throw new ValidationError("`to` is before `from`", "to");
  }
}

/**
 * Lists a tenant's requests, newest first (a value's records from the last
 * that came, values newest first). Uses the index of the most selective
 * filter given (an error class, then node, key, model), checks the others
 * on each record, and reads at most MAX_VALUES_PER_PAGE values a page. The
 * cursor is `<records of the value already shown>-<KV cursor before it>`.
 */
export async function listRequestLog(
  store: Store,
  p: Principal,
  tenantId: string,
  f: RequestLogFilter = {},
): Promise<RequestLogPage> {
  requireTenantRead(p, tenantId);
  checkFilter(f);
  const limit = pageSize(f.limit);
  const at = /^(\d{1,4})-([A-Za-z0-9_\-+/=]{0,1024})$/.exec(f.cursor ?? "");
  if (f.cursor && !at) throw new ValidationError("cursor is invalid", "cursor");
  const now = Date.now();
  const keepFrom = now - await requestLogRetentionMs(store, tenantId);
  const from = Math.max(f.from ?? 0, keepFrom);
  const to = f.to ?? Infinity;
  const index: [RequestLogDimension, string] | null =
    f.status && f.status !== "2xx"
      ? ["status", f.status]
      : f.nodeId
      ? ["node", f.nodeId]
      : f.keyId
      ? ["key", f.keyId]
      : f.model
      ? ["model", f.model]
      : f.status
      ? ["status", f.status]
      : null;
  const prefix = index
    ? k.requestLogIndexPrefix(tenantId, index[0], index[1])
    : k.usageRecordPrefix(tenantId);

  const matches = (r: UsageRecord) => {
    const t = Date.parse(r.at);
    return t >= from && t <= to &&
      (f.keyId === undefined || r.keyId === f.keyId) &&
      (f.model === undefined || r.model === f.model) &&
      (f.nodeId === undefined || r.nodeId === f.nodeId) &&
      (f.status === undefined || statusClass(r.status) === f.status);
  };
  let skip = at ? Number(at[1]) : 0;
  let before = at?.[2] ?? "";
  const iter = store.kv.list<unknown>(
    {
      // Fixed bounds when open (a cursor is valid for its range only).
      start: [
        ...prefix,
        f.from === undefined ? "" : idBoundAt(f.from - SPAN_MS, false),
      ],
      end: [
        ...prefix,
        f.to === undefined ? "\uffff" : idBoundAt(f.to + SPAN_MS, true),
      ],
    },
    {
      cursor: before || undefined,
      reverse: true,
      batchSize: index ? 20 : Math.min(limit, Math.ceil(limit / 24) + 1),
    },
  );
  const items: UsageRecord[] = [];
  type Pending = {
    valueId: string;
    positions: number[] | null;
    value?: unknown;
    before: string;
  };
  let pending: Pending[] = [];
  let scanned = 0;
  let searchedTo: string | null = null;
  /** Emits the pending values' matches; a full page's answer, or null. */
  const drain = async (): Promise<RequestLogPage | null> => {
    const batch = pending;
    pending = [];
    const fetch = batch.filter((b) => b.value === undefined);
    if (fetch.length > 0) {
      const values = await store.kv.getMany<unknown[]>(
        fetch.map((b) => k.usageRecord(tenantId, b.valueId)),
      );
      values.forEach((v, i) => fetch[i]!.value = v.value);
    }
    for (const b of batch) {
      searchedTo = timeOfId(b.valueId) ?? searchedTo;
      if (!b.value) continue; // expired meanwhile
      const rs =
        (Array.isArray(b.value) ? b.value : [b.value]) as UsageRecord[];
      const picked = (b.positions ?? rs.map((_, i) => i))
        .map((i) => rs[i])
        .filter((r): r is UsageRecord => r !== undefined && matches(r))
        .reverse();
      for (let i = skip; i < picked.length; i++) {
        if (items.length === limit) {
          return {
            items,
            cursor: `${i}-${b.before}`,
            partial: false,
            searchedTo,
          };
        }
        items.push(picked[i]!);
      }
      skip = 0;
    }
    return null;
  };
  try {
    for await (const e of iter) {
      const valueId = e.key[e.key.length - 1];
      if (typeof valueId !== "string") continue;
      const v = e.value;
      const inline = index && Array.isArray(v) && typeof v[0] === "object";
      pending.push({
        valueId,
        positions: index && !inline && Array.isArray(v) ? v as number[] : null,
        ...(!index || inline ? { value: v } : {}),
        before,
      });
      before = iter.cursor;
      scanned++;
      // Values are read ten at a time at most, and only as many as may
      // fill the page (an index entry says how many records it points at).
      const fetches = pending.filter((b) => b.value === undefined);
      const promised = pending.reduce(
        (n, b) =>
          n + (b.positions?.length ??
            (Array.isArray(b.value) ? b.value.length : 1)),
        0,
      );
      if (
        !index || fetches.length >= 10 ||
        promised >= limit - items.length + skip
      ) {
        const done = await drain();
        if (done) return done;
      }
      if (scanned >= MAX_VALUES_PER_PAGE) {
        const done = await drain();
        if (done) return done;
        if (items.length === limit) {
          return { items, cursor: `0-${before}`, partial: false, searchedTo };
        }
        return { items, cursor: `0-${before}`, partial: true, searchedTo };
      }
    }
  } catch (err) {
    if (f.cursor && !(err instanceof ValidationError)) {
      throw new ValidationError("cursor is invalid", "cursor");
    }
    throw err;
  }
  const done = await drain();
  if (done) return done;
  return { items, cursor: null, partial: false, searchedTo };
}

/**
 * Parses a time given as ISO 8601, a `datetime-local` value (UTC), or a
 * date (its start; `end`: its last millisecond); undefined when empty.
 */
export function parseLogTime(
  raw: string | undefined,
  name: string,
  end = false,
): number | undefined {
  const v = (raw ?? "").trim();
  if (v === "") return undefined;
  let ms = NaN;
  if (/^\d{4}-\d{2}-\d{2}$/.test(v)) {
    ms = Date.parse(`${v}T00:00:00Z`) + (end ? 86_400_000 - 1 : 0);
  } else if (/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$/.test(v)) {
    ms = Date.parse(`${v}:00Z`) + (end ? 59_999 : 0);
  } else if (/^\d{4}-\d{2}-\d{2}T[\d:.]+(Z|[+-]\d{2}:\d{2})$/.test(v)) {
    ms = Date.parse(v);
  }
  if (!Number.isFinite(ms)) {
    throw new ValidationError(
      `${name} must be a date (2026-11-22) or a date and time (2026-11-22T10:00, UTC)`,
      name,
    );
  }
  return ms;
}

/** A request log filter from query parameters (`key`, `status`, `model`, `node`, `from`, `to`, `cursor`, `limit`). */
export function parseRequestLogQuery(
  q: Record<string, string | undefined>,
): RequestLogFilter {
  const opt = (v: string | undefined) => {
    const t = (v ?? "").trim();
    return t === "" ? undefined : t.slice(0, 300);
  };
  const status = opt(q.status);
  if (status !== undefined && !STATUS_CLASSES.includes(status as StatusClass)) {
    throw new ValidationError("status must be 2xx, 4xx or 5xx", "status");
  }
  const limit = opt(q.limit);
  return {
    keyId: opt(q.key),
    model: opt(q.model),
    nodeId: opt(q.node),
    status: status as StatusClass | undefined,
    from: parseLogTime(q.from, "from"),
    to: parseLogTime(q.to, "to", true),
    cursor: opt(q.cursor) ?? null,
    limit: limit === undefined ? undefined : Number(limit),
  };
}
