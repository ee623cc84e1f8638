/**
 * Usage metering: one record per gateway request (never prompt text) and
 * rollups per hour and day for each tenant, key, tenant × model, model and
 * overall, plus month rollups (store/usage_month.ts reads them). A rollup
 * group is one packed value per writer (see UsageRollups) holding latency
 * and time to first token as sums plus fixed histogram buckets, so charts
 * read a few hundred keys whatever the traffic, and percentiles come from
 * the buckets. Records are packed too: a tenant's records written together
 * share one value (up to RECORDS_PER_VALUE), so 1,000 tenants' traffic does
 * not cost one B-tree page per request.
 */
import { k, type UsageDimension, type UsageMonthDimension } from "./kv_keys.ts";
import { ValidationError } from "./errors.ts";
import {
  checkCursor,
  type Page,
  type PageOptions,
  pageSize,
} from "./pagination.ts";
import type { Store } from "./store.ts";

/** One request as metered by the gateway. */
export interface UsageRecord {
  id: string;
  /** ISO time the request started. */
  at: string;
  requestId: string;
  tenantId: string;
  keyId: string;
  model: string;
  nodeId: string | null;
  endpoint: "chat" | "completions" | "embeddings" | "messages";
  promptTokens: number;
  completionTokens: number;
  latencyMs: number;
  /** Time to first token (streams) or to the response (others); null if none came. */
  ttftMs: number | null;
  /** HTTP status given to the client (200 for streams that ended with an error frame: see outcome). */
  status: number;
  outcome: "ok" | "error" | "cancelled";
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

/** How long single usage records are kept (rollups are kept). */
export const USAGE_RECORD_TTL_MS = 90 * 86_400_000;

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

function subjects(r: UsageRecord): [UsageDimension, string][] {
  return [
    ["tenant", r.tenantId],
    ["key", `${r.tenantId}/${r.keyId}`],
    ["tenant_model", `${r.tenantId}/${r.model}`],
    ["model", r.model],
    ["all", "*"],
  ];
}

/**
 * Most mutations in one atomic write (KV allows 1000 and 800 KiB). Kept
 * small: a commit serializes its mutations on the main thread (~10 µs a
 * rollup value), and 100 of them held requests up for up to ~4 ms.
 */
const MAX_MUTATIONS = 50;
/**
 * Most records in one KV value: a record is at most ~900 bytes serialized
 * (ids, a model name of at most 256 characters, numbers), so a value stays
 * well under KV's 64 KiB.
 */
export const RECORDS_PER_VALUE = 48;
/**
 * Most records in one atomic write (KV allows 800 KiB in all): two values'
 * worth, ~1 ms of serialization on the main thread. One would halve that,
 * but a backlog of full values (after a burst) would then cost a commit,
 * and with the embedded store an fsync, each.
 */
const RECORDS_PER_COMMIT = 2 * RECORDS_PER_VALUE;

/**
 * A rollup group's totals, the value stored under each shard key: field
 * name → sum, absent when zero. Hour and day groups: `requests`, `errors`,
 * `limited`, `prompt`, `completion`, `latency_sum`, `ttft_sum`, and
 * `lat_<i>` / `ttft_<i>` (count in LATENCY_BUCKETS_MS bucket i; ttft count
 * is their sum). Month groups: tenant `requests`, `tokens`, `errors`;
 * tenant_model `requests`, `prompt`, `completion`; node and node_tenant
 * `busy_ms`.
 */
export type RollupFields = Record<string, number>;

/**
 * The fields of each kind of group, in the order its sums are held in
 * memory (a Float64Array: a record adds to fixed slots, no property
 * lookups by name). Hour and day groups first, then month groups.
 */
const TIME_FIELDS = [
  "requests",
  "errors",
  "limited",
  "prompt",
  "completion",
  "latency_sum",
  "ttft_sum",
  ...LATENCY_BUCKETS_MS.map((_, i) => `lat_${i}`),
  ...LATENCY_BUCKETS_MS.map((_, i) => `ttft_${i}`),
] as const;
// Slots of TIME_FIELDS.
const REQUESTS = 0;
const ERRORS = 1;
const LIMITED = 2;
const PROMPT = 3;
const COMPLETION = 4;
const LATENCY_SUM = 5;
const TTFT_SUM = 6;
/** The slot of latency bucket 0; TTFT bucket 0 follows the last latency bucket. */
const LAT_0 = 7;
const TTFT_0 = LAT_0 + LATENCY_BUCKETS_MS.length;
const TENANT_MONTH_FIELDS = ["requests", "tokens", "errors"] as const;
const TENANT_MODEL_MONTH_FIELDS = ["requests", "prompt", "completion"] as const;
const NODE_MONTH_FIELDS = ["busy_ms"] as const;

/** How long after its bucket ends a group stays in memory (late records). */
const KEEP_MS = {
  hour: 3 * 3_600_000,
  day: 2 * 86_400_000,
  month: 40 * 86_400_000,
};
/** How often groups past their time are looked for. */
const SWEEP_MS = 60_000;

/** A rollup group held in memory by its writer. */
interface Group {
  /** `granularity|dimension|subject|bucket`: sorts as the keys do. */
  readonly id: string;
  readonly key: Deno.KvKey;
  /** Its field names (one of the *_FIELDS layouts). */
  readonly names: readonly string[];
  /** Every record folded in so far, one sum per name: what its KV value will hold. */
  readonly sums: Float64Array;
  /** Bumped by each fold; a write marks it clean only if none came since. */
  version: number;
  /** While dirty: when it is due to be written (epoch ms). */
  due: number;
  /** When the group may leave memory (epoch ms). */
  readonly end: number;
  /** Left memory: a later record starts a new group (and shard). */
  gone: boolean;
  /** In `#dirty` (a flag: cheaper to test per fold than the set). */
  dirty: boolean;
}

/** A key's last record's tuple and groups (see UsageRollups.#lastOfKey). */
interface LastTuple {
  tenantId: string;
  model: string;
  nodeId: string | null;
  hour: number;
  gs: RecordGroups;
  /** UsageRollups' drop count when its groups were last known present. */
  drops: number;
}

/** The groups one kind of record adds to: its hour, day and month groups. */
interface RecordGroups {
  /** Hour and day groups (every field of the record). */
  time: Group[];
  /** Month groups: tenant, tenant × model, node and node × tenant. */
  tenant: Group;
  tenantModel: Group;
  node: Group | null;
  nodeTenant: Group | null;
}

/** Options of a UsageRollups accumulator. */
export interface UsageRollupsOptions {
  /** Most clean groups kept in memory; the oldest created leave first (default 200,000). */
  maxGroups?: number;
}

/** A tenant's records not written yet (in the order they came). */
interface RecordChunk {
  readonly tenantId: string;
  records: UsageRecord[];
  /** When they are due to be written (epoch ms). */
  due: number;
}

/**
 * A writer's usage: records (`add`) are folded at once into rollup groups
 * held in memory, and wait there with the groups until due (the gateway
 * lets each wait a few seconds, so a group busy in that time costs one
 * write, and a tenant's records share a value); `writeDue` writes them.
 * Records: each tenant's waiting records are written as values of up to
 * RECORDS_PER_VALUE records under the first one's id, so a write retried
 * after a failure (with any records that came meanwhile) overwrites what
 * may have landed, and `listUsageRecords` reads them back one by one.
 * Rollups: each group (granularity, dimension, subject, bucket) is ONE KV
 * value per writer, its absolute totals under a shard id unique forever
 * (`<writer>.<seq>`): writing is a blind `set` (one mutation per group
 * instead of one `sum` per field), idempotent when a failed write is
 * retried, and never contended by other gateway instances, which write
 * their own shards. Readers sum the shards. A failed write leaves its
 * records and groups waiting for the next (a record is folded once).
 * Clean groups leave memory some time after their bucket ends (or when
 * over `maxGroups`); a later record starts a new shard, so nothing is ever
 * overwritten.
 */
export class UsageRollups {
  readonly #writer = crypto.randomUUID().slice(0, 8);
  readonly #maxGroups: number;
  #seq = 0;
  /** In creation order (the order groups leave when over the cap). */
  readonly #groups = new Map<string, Group>();
  /** Groups holding records not written yet (never evicted then). */
  readonly #dirty = new Set<Group>();
  /** Records not written yet, by tenant. */
  readonly #records = new Map<string, RecordChunk>();
  #waitingRecords = 0;
  /** Nothing waiting is due before this (a lower bound). */
  #nextDue = Infinity;
  /** A record's groups by (tenant, key, model, node, hour). */
  readonly #byRecord = new Map<string, RecordGroups>();
  /**
   * Each key's last (model, node, hour) and its groups: a key's records
   * nearly always repeat it, and then find their groups with one lookup by
   * the key id, no key string built.
   */
  readonly #lastOfKey = new Map<string, LastTuple>();
  /** Groups dropped so far: a LastTuple seen at this count has none gone. */
  #drops = 0;
  #nextSweep = 0;
  #chain: Promise<void> = Promise.resolve();

  constructor(opts: UsageRollupsOptions = {}) {
    const { maxGroups = 200_000 } = opts;
    if (!(maxGroups >= 1)) {
      throw new RangeError(
        `Cannot create usage rollups: maxGroups must be >= 1: current value is ${maxGroups}`,
      );
    }
    this.#maxGroups = maxGroups;
  }

  /** Groups held in memory now. */
  get size(): number {
    return this.#groups.size;
  }

  /** Groups and tenants' records waiting to be written. */
  get pending(): number {
    return this.#dirty.size + this.#records.size;
  }

  /** Records waiting to be written. */
  get waitingRecords(): number {
    return this.#waitingRecords;
  }

  /** When the first thing waiting is due (Infinity: none). */
  get nextDue(): number {
    return this.#nextDue;
  }

  /**
   * Folds records into the rollups in memory and keeps them to be written
   * by `writeDue`. A group they make dirty, and a tenant's records, are due
   * `delayMs` later, give or take half: the writes of 1,000 tenants' groups
   * dirtied in the same second drift apart instead of landing in one burst
   * every `delayMs`. A tenant with a value's worth of records waiting is
   * due at once.
   */
  add(records: UsageRecord[], delayMs = 0): void {
    if (records.length === 0) return;
    const now = Date.now();
    this.#fold(records, now, delayMs);
    for (const r of records) {
      let c = this.#records.get(r.tenantId);
      if (!c) {
        c = { tenantId: r.tenantId, records: [], due: later(now, delayMs) };
        this.#records.set(r.tenantId, c);
      }
      c.records.push(r);
      if (c.records.length >= RECORDS_PER_VALUE) c.due = now;
      if (c.due < this.#nextDue) this.#nextDue = c.due;
    }
    this.#waitingRecords += records.length;
  }

  /**
   * Writes what is due by `dueBy` (default: everything), at most `max`
   * values of it, waiting longest first: tenants' records, then rollup
   * groups. On failure they stay waiting. Calls are serialized.
   */
  writeDue(store: Store, dueBy = Infinity, max = Infinity): Promise<void> {
    return this.#serial(async () => {
      const { chunks, groups } = this.#due(dueBy, max);
      // Keys in order: each commit then touches fewer SQLite pages (~25% less CPU).
      chunks.sort((a, b) => a.tenantId < b.tenantId ? -1 : 1);
      groups.sort((a, b) => a.id < b.id ? -1 : 1);
      const lengths = chunks.map((c) => c.records.length);
      const versions = groups.map((g) => g.version);
      try {
        await commitAll(store.kv, chunks.flatMap(recordSets));
        chunks.forEach((c, i) => {
          c.records.splice(0, lengths[i]);
          this.#waitingRecords -= lengths[i]!;
          if (c.records.length === 0) this.#records.delete(c.tenantId);
        });
        await commitAll(
          store.kv,
          groups.map((g): KvSet => [g.key, fieldsOf(g)]),
        );
        groups.forEach((g, i) => {
          if (g.version === versions[i]) {
            this.#dirty.delete(g);
            g.dirty = false;
          }
        });
      } finally {
        this.#nextDue = this.#firstDue();
      }
      this.#evict(Date.now());
    });
  }

  /**
   * What is due by `dueBy`, at most `max`, waiting longest first (maps and
   * sets iterate in insertion order: a group or tenant joins the end when
   * it starts waiting, and stays put until written). Each tick scans up to
   * every waiting group (~10,000 for 1,000 busy tenants): forEach, unlike
   * for-of over a set in this async writer, allocates nothing per element
   * (the iterator results came to ~3.5 KB a request at 500 req/s).
   */
  #due(dueBy: number, max: number): {
    chunks: RecordChunk[];
    groups: Group[];
  } {
    const chunks: RecordChunk[] = [];
    const groups: Group[] = [];
    this.#records.forEach((c) => {
      if (chunks.length < max && c.due <= dueBy) chunks.push(c);
    });
    this.#dirty.forEach((g) => {
      if (chunks.length + groups.length < max && g.due <= dueBy) {
        groups.push(g);
      }
    });
    return { chunks, groups };
  }

  /** When the first thing waiting is due (Infinity: none). */
  #firstDue(): number {
    let first = Infinity;
    this.#dirty.forEach((g) => {
      if (g.due < first) first = g.due;
    });
    this.#records.forEach((c) => {
      if (c.due < first) first = c.due;
    });
    return first;
  }

  /** Adds records and writes everything waiting (`add` then `writeDue`). */
  write(store: Store, records: UsageRecord[]): Promise<void> {
    this.add(records);
    return this.writeDue(store);
  }

  #serial(f: () => Promise<void>): Promise<void> {
    const p = this.#chain.then(f);
    this.#chain = p.catch(() => {});
    return p;
  }

  /**
   * Adds records to their groups. The groups of a (tenant, key, model,
   * node, hour) are looked up once and cached, so a record costs one map
   * lookup and a few additions (no key strings built per record).
   */
  #fold(records: UsageRecord[], now: number, delayMs: number): void {
    for (const r of records) {
      const gs = this.#groupsOfRecord(r);
      const latency = r.latencyMs;
      const prompt = r.promptTokens;
      const completion = r.completionTokens;
      const lat = LAT_0 + bucketOf(latency);
      const ttftMs = r.ttftMs;
      const ttft = ttftMs === null ? -1 : TTFT_0 + bucketOf(ttftMs);
      const error = r.outcome !== "ok" ? 1 : 0;
      const limited = r.status === 429 ? 1 : 0;
      for (const g of gs.time) {
        const v = g.sums;
        v[REQUESTS] = v[REQUESTS]! + 1;
        v[ERRORS] = v[ERRORS]! + error;
        v[LIMITED] = v[LIMITED]! + limited;
        v[PROMPT] = v[PROMPT]! + prompt;
        v[COMPLETION] = v[COMPLETION]! + completion;
        v[LATENCY_SUM] = v[LATENCY_SUM]! + latency;
        v[lat] = v[lat]! + 1;
        if (ttft >= 0) {
          v[TTFT_SUM] = v[TTFT_SUM]! + ttftMs!;
          v[ttft] = v[ttft]! + 1;
        }
        this.#touch(g, now, delayMs);
      }
      const tv = gs.tenant.sums; // TENANT_MONTH_FIELDS
      tv[0] = tv[0]! + 1;
      tv[1] = tv[1]! + prompt + completion;
      tv[2] = tv[2]! + error;
      this.#touch(gs.tenant, now, delayMs);
      const mv = gs.tenantModel.sums; // TENANT_MODEL_MONTH_FIELDS
      mv[0] = mv[0]! + 1;
      mv[1] = mv[1]! + prompt;
      mv[2] = mv[2]! + completion;
      this.#touch(gs.tenantModel, now, delayMs);
      if (gs.node) {
        gs.node.sums[0] = gs.node.sums[0]! + latency; // NODE_MONTH_FIELDS
        this.#touch(gs.node, now, delayMs);
      }
      if (gs.nodeTenant) {
        gs.nodeTenant.sums[0] = gs.nodeTenant.sums[0]! + latency;
        this.#touch(gs.nodeTenant, now, delayMs);
      }
    }
  }

  /** A record's groups: its key's last ones when the tuple repeats, else looked up (or made). */
  #groupsOfRecord(r: UsageRecord): RecordGroups {
    const t = Date.parse(r.at);
    const hour = Math.floor(t / 3_600_000);
    const last = this.#lastOfKey.get(r.keyId);
    if (
      last !== undefined && last.hour === hour && last.model === r.model &&
      last.nodeId === r.nodeId && last.tenantId === r.tenantId
    ) {
      if (last.drops === this.#drops) return last.gs;
      if (!stale(last.gs)) {
        last.drops = this.#drops;
        return last.gs;
      }
    }
    const id =
      `${r.tenantId}\u0000${r.keyId}\u0000${r.model}\u0000${r.nodeId}\u0000${hour}`;
    let gs = this.#byRecord.get(id);
    if (!gs || stale(gs)) {
      if (this.#byRecord.size >= 50_000) this.#byRecord.clear();
      gs = this.#groupsOf(r, t);
      this.#byRecord.set(id, gs);
    }
    if (this.#lastOfKey.size >= 50_000) this.#lastOfKey.clear();
    this.#lastOfKey.set(r.keyId, {
      tenantId: r.tenantId,
      model: r.model,
      nodeId: r.nodeId,
      hour,
      gs,
      drops: this.#drops,
    });
    return gs;
  }

  /** Counts a fold into `g`; newly dirty, it is due `delayMs` after `now`, give or take half. */
  #touch(g: Group, now: number, delayMs: number): void {
    g.version++;
    if (g.dirty) return;
    g.due = later(now, delayMs);
    if (g.due < this.#nextDue) this.#nextDue = g.due;
    this.#dirty.add(g);
    g.dirty = true;
  }

  /** The groups a record adds to, created (each with a new shard) where absent. */
  #groupsOf(r: UsageRecord, t: number): RecordGroups {
    const time: Group[] = [];
    for (const g of ["hour", "day"] as const) {
      const b = timeBucket(g, t);
      const end = Date.parse(g === "hour" ? `${b}:00:00Z` : `${b}T00:00:00Z`) +
        (g === "hour" ? 3_600_000 : 86_400_000) + KEEP_MS[g];
      for (const [dim, subject] of subjects(r)) {
        time.push(
          this.#group(
            `${g}|${dim}|${subject}|${b}`,
            TIME_FIELDS,
            end,
            (shard) => k.usageRollup(g, dim, subject, b, shard),
          ),
        );
      }
    }
    const d = new Date(t);
    const month = d.toISOString().slice(0, 7);
    const end = Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1) +
      KEEP_MS.month;
    const monthGroup = (
      dim: UsageMonthDimension,
      subject: string,
      names: readonly string[],
    ) =>
      this.#group(
        `month|${dim}|${subject}|${month}`,
        names,
        end,
        (shard) => k.usageMonth(month, dim, subject, shard),
      );
    return {
      time,
      tenant: monthGroup("tenant", r.tenantId, TENANT_MONTH_FIELDS),
      tenantModel: monthGroup(
        "tenant_model",
        `${r.tenantId}/${r.model}`,
        TENANT_MODEL_MONTH_FIELDS,
      ),
      node: r.nodeId ? monthGroup("node", r.nodeId, NODE_MONTH_FIELDS) : null,
      nodeTenant: r.nodeId
        ? monthGroup(
          "node_tenant",
          `${r.nodeId}/${r.tenantId}`,
          NODE_MONTH_FIELDS,
        )
        : null,
    };
  }

  /** The group `id` in memory, created with a new shard if absent. */
  #group(
    id: string,
    names: readonly string[],
    end: number,
    key: (shard: string) => Deno.KvKey,
  ): Group {
    let g = this.#groups.get(id);
    if (!g) {
      g = {
        id,
        key: key(`${this.#writer}.${(this.#seq++).toString(36)}`),
        names,
        sums: new Float64Array(names.length),
        version: 0,
        due: 0,
        end,
        gone: false,
        dirty: false,
      };
      this.#groups.set(id, g);
    }
    return g;
  }

  #evict(now: number): void {
    if (now >= this.#nextSweep) {
      this.#nextSweep = now + SWEEP_MS;
      for (const [id, g] of this.#groups) {
        if (g.end < now && !g.dirty) this.#drop(id, g);
      }
    }
    if (this.#groups.size <= this.#maxGroups) return;
    for (const [id, g] of this.#groups) {
      if (this.#groups.size <= this.#maxGroups) break;
      if (!g.dirty) this.#drop(id, g);
    }
  }

  #drop(id: string, g: Group): void {
    g.gone = true;
    this.#drops++;
    this.#groups.delete(id);
  }
}

/** `delayMs` after `now`, give or take half: half to all of it, at random. */
function later(now: number, delayMs: number): number {
  return now + delayMs * (0.5 + 0.5 * Math.random());
}

/** One `set`: key, value, options, and the records in the value (if any). */
type KvSet = [Deno.KvKey, unknown, { expireIn: number }?, number?];

/** A tenant's waiting records as values of up to RECORDS_PER_VALUE each, keyed by the first. */
function recordSets(c: RecordChunk): KvSet[] {
  const sets: KvSet[] = [];
  for (let i = 0; i < c.records.length; i += RECORDS_PER_VALUE) {
    const value = c.records.slice(i, i + RECORDS_PER_VALUE);
    sets.push([
      k.usageRecord(c.tenantId, value[0]!.id),
      value,
      { expireIn: USAGE_RECORD_TTL_MS },
      value.length,
    ]);
  }
  return sets;
}

/**
 * Writes `sets` in order, in atomic writes of at most MAX_MUTATIONS sets
 * and RECORDS_PER_COMMIT records each. Each write's values are serialized
 * on the main thread, and a write of a fast store can complete without
 * the event loop turning, so requests get a turn between writes.
 */
async function commitAll(kv: Deno.Kv, sets: KvSet[]): Promise<void> {
  let i = 0;
  while (i < sets.length) {
    if (i > 0) await new Promise((r) => setTimeout(r, 0));
    const op = kv.atomic();
    let n = 0;
    let records = 0;
    for (; i < sets.length; i++) {
      const [key, value, opts, inValue = 0] = sets[i]!;
      if (
        n === MAX_MUTATIONS || (n > 0 && records + inValue > RECORDS_PER_COMMIT)
      ) break;
      op.set(key, value, opts);
      n++;
      records += inValue;
    }
    await commit(op);
  }
}

async function commit(op: Deno.AtomicOperation): Promise<void> {
  const res = await op.commit();
  if (!res.ok) throw new Error("Cannot write usage: the commit was refused");
}

const accumulators = new WeakMap<Store, UsageRollups>();

/** The rollup accumulator of a store (one per store in this process). */
export function rollupsOf(store: Store): UsageRollups {
  let acc = accumulators.get(store);
  if (!acc) {
    acc = new UsageRollups();
    accumulators.set(store, acc);
  }
  return acc;
}

/** Writes records and every rollup at once (one value per group and writer). */
export function writeUsage(
  store: Store,
  records: UsageRecord[],
): Promise<void> {
  return rollupsOf(store).write(store, records);
}

/** Whether one of a record's cached groups left memory. */
function stale(gs: RecordGroups): boolean {
  return gs.time.some((g) => g.gone) || gs.tenant.gone ||
    gs.tenantModel.gone || !!gs.node?.gone || !!gs.nodeTenant?.gone;
}

/** A group's value: its sums by name, zeros left out. */
function fieldsOf(g: Group): RollupFields {
  const f: RollupFields = {};
  for (let i = 0; i < g.names.length; i++) {
    if (g.sums[i] !== 0) f[g.names[i]!] = g.sums[i]!;
  }
  return f;
}

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
    return Object.entries(v as RollupFields).filter(([, n]) =>
      typeof n === "number"
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
