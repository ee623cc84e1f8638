/**
 * Writing usage: records are folded into rollup groups in memory and wait
 * there with the groups to be written in batches, one batch per tenant
 * (store/usage.ts reads them back). How it stays exact across failures
 * and crashes:
 *
 * - **One source.** A tenant's records and every group they add to that is
 *   the tenant's own (its hour, day and month totals, per key, per model,
 *   per node) are written in ONE atomic commit, with a mark saying up to
 *   which record (sequence number) this writer's records of the tenant are
 *   in KV. So the tenant, key and model views and the month's statement
 *   always hold the same requests. Groups shared by tenants (per model and
 *   overall, per node, and the capacity groups of store/capacity_rollup.ts)
 *   are written on their own schedule.
 * - **Idempotent values.** A group is ONE value per writer, its absolute
 *   totals (and `_seq`, the last record in them) under a shard id unique
 *   forever (`<writer>.<n>`): a blind `set`, never contended by other
 *   gateway instances, which write their own shards; readers sum them.
 *   Records are values of up to RECORDS_PER_VALUE under the first one's id,
 *   so a write retried after a failure overwrites what may have landed.
 * - **Replay.** Each record is journaled (store/usage_journal.ts) before it
 *   waits; after a crash, `UsageRollups.replay` adds to each group exactly
 *   the journaled records past its `_seq`, and writes the records past the
 *   tenant's mark.
 *
 * Clean groups leave memory some time after their bucket ends (or when
 * over `maxGroups`); a later record starts a new shard, so nothing is ever
 * overwritten.
 */
import {
  type CapacityKind,
  k,
  type UsageDimension,
  type UsageMonthDimension,
} from "./kv_keys.ts";
import { retentionMs } from "./retention.ts";
import type { Store } from "./store.ts";
import {
  CLUSTER_FIELDS,
  hourlyNames,
  isPacked,
  MODEL_FIELDS,
  NODE_FIELDS,
} from "./capacity_rollup.ts";
import {
  bucketOf,
  LATENCY_BUCKETS_MS,
  RECORDS_PER_VALUE,
  type RollupFields,
  SEQ_FIELD,
  timeBucket,
  type UsageRecord,
} from "./usage.ts";
import { requestLogIndexSets, requestLogRetentionMs } from "./request_log.ts";
import type { JournalEntry, UsageJournal } from "./usage_journal.ts";

/**
 * Most mutations in one atomic write (KV allows 1000 and 800 KiB). Kept
 * small: a commit serializes its mutations on the main thread (~10 µs a
 * rollup value), and 100 of them held requests up for up to ~4 ms. Several
 * tenants' batches share a commit up to this; one tenant's larger batch
 * (many keys and models busy at once) gets a commit of its own, up to
 * MAX_TENANT_MUTATIONS, so it stays atomic.
 */
const MAX_MUTATIONS = 50;
const MAX_TENANT_MUTATIONS = 400;
/**
 * Most records in one atomic write (KV allows 800 KiB in all): two values'
 * worth, ~1 ms of serialization on the main thread.
 */
const RECORDS_PER_COMMIT = 2 * RECORDS_PER_VALUE;
/** How long a tenant's mark is kept: a journal older than this replays records twice. */
const MARK_TTL_MS = 30 * 86_400_000;
/** A key's "last used" time is written at most this often (with its tenant's batch). */
const LAST_USED_EVERY_MS = 60_000;

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
const NODE_MONTH_FIELDS = ["busy_ms", "tokens"] as const;
/** Capacity groups' slots (store/capacity_rollup.ts): hourly ones hour-major. */
const CAP_NODE_NAMES = hourlyNames(NODE_FIELDS);
const CAP_CLUSTER_NAMES = hourlyNames(CLUSTER_FIELDS);
const CAP_NODE_N = NODE_FIELDS.length;
const CAP_CLUSTER_N = CLUSTER_FIELDS.length;

/** How long after its bucket ends a group stays in memory (late records). */
const KEEP_MS = {
  hour: 3 * 3_600_000,
  day: 2 * 86_400_000,
  month: 40 * 86_400_000,
};
/** How often groups past their time are looked for. */
const SWEEP_MS = 60_000;
/** How often journal files all in KV are looked for. */
const PRUNE_MS = 1000;

/** A rollup group held in memory by its writer. */
interface Group {
  /** `granularity|dimension|subject|bucket`: sorts as the keys do. */
  readonly id: string;
  /** Its shard's key (replay points it at the dead writer's shard). */
  key: Deno.KvKey;
  /** Its field names (one of the *_FIELDS layouts). */
  readonly names: readonly string[];
  /** Stored packed (capacity groups): the fields per hour, else 0 (an object of sums). */
  readonly packed: number;
  /** Every record folded in so far, one sum per name: what its KV value will hold. */
  readonly sums: Float64Array;
  /** The tenant whose batch writes it; null: shared by tenants (model, all, node). */
  readonly tenantId: string | null;
  /** The sequence number of the last record folded in. */
  seq: number;
  /** Records up to this are in `sums` already (replay: the shard's `_seq` in KV). */
  floor: number;
  /** While dirty: the first record folded in since it was last taken to be written. */
  dirtySeq: number;
  /** While dirty and shared: when it is due to be written (epoch ms). */
  due: number;
  /** When the group may leave memory (epoch ms). */
  readonly end: number;
  /** Left memory: a later record starts a new group (and shard). */
  gone: boolean;
  /** Holds records not written yet (a flag: cheaper to test per fold than a set). */
  dirty: boolean;
}

/** A key's last record's tuple and groups (see UsageRollups.#lastOfKey). */
interface LastTuple {
  tenantId: string;
  model: string;
  nodeId: string | null;
  /** Its spanning instance's other members, joined (see membersOf). */
  members: string;
  hour: number;
  gs: RecordGroups;
  /** UsageRollups' drop count when its groups were last known present. */
  drops: number;
}

/** The groups one kind of record adds to: its hour, day and month groups. */
interface RecordGroups {
  /** The tenant's own hour and day groups: tenant, key, tenant × model. */
  tenantTime: Group[];
  /** Shared hour and day groups: model, all. */
  sharedTime: Group[];
  /** Month groups: tenant, tenant × model, node and node × tenant. */
  tenant: Group;
  tenantModel: Group;
  node: Group | null;
  nodeTenant: Group | null;
  /** Capacity day groups (shared): the node's (if routed), the model's and the cluster's. */
  capNode: Group | null;
  /**
   * The other members of the spanning instance that served it: each one's
   * node month, node × tenant month and capacity groups, which count its
   * busy time too (not its requests or tokens: those are the serving
   * node's).
   */
  members: { node: Group; nodeTenant: Group; capNode: Group }[];
  capModel: Group;
  capCluster: Group;
  /** The record's hour of the (UTC) day: its slot in the hourly capacity groups. */
  hod: number;
}

/** A tenant's records and groups not written yet. */
interface TenantBatch {
  readonly tenantId: string;
  /** Records to write, in sequence order, with their sequence numbers. */
  records: UsageRecord[];
  seqs: number[];
  /** The tenant's groups made dirty since the batch began. */
  groups: Group[];
  /** When it is due to be written (epoch ms). */
  due: number;
}

/** Options of a UsageRollups accumulator. */
export interface UsageRollupsOptions {
  /** Most clean groups kept in memory; the oldest created leave first (default 200,000). */
  maxGroups?: number;
  /** The writer id (default: a new random one; replay passes the dead writer's). */
  writer?: string;
}

/** One `set`: key, value, options, and the records in the value (if any). */
type KvSet = [Deno.KvKey, unknown, { expireIn: number }?, number?];

/** What one batch or shared group taken to be written puts back if its commit fails. */
interface Taken {
  sets: KvSet[];
  batch: TenantBatch | null;
  groups: { g: Group; dirtySeq: number }[];
}

/**
 * A writer's usage: records (`add`) are folded at once into rollup groups
 * held in memory, and wait with the groups until due (the gateway lets
 * each wait a few seconds, so a group busy in that time costs one write,
 * and a tenant's records share a value); `writeDue` writes them. A failed
 * write leaves its records and groups waiting for the next (a record is
 * folded once).
 */
export class UsageRollups {
  readonly writer: string;
  readonly #maxGroups: number;
  #shardSeq = 0;
  /** The last record's sequence number (records are numbered from 1). */
  #recordSeq = 0;
  #journal: UsageJournal | null = null;
  #nextPrune = 0;
  /** When each key's "last used" was last written (this writer). */
  readonly #lastUsedWritten = new Map<string, number>();
  /** In creation order (the order groups leave when over the cap). */
  readonly #groups = new Map<string, Group>();
  /** Shared groups holding records not written yet. */
  readonly #dirty = new Set<Group>();
  /** Tenants' batches, oldest first. */
  readonly #batches = new Map<string, TenantBatch>();
  #waitingRecords = 0;
  /** Groups waiting to be written (shared and tenants'). */
  #waitingGroups = 0;
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
  /** How long each tenant's records are kept, read before each write (store/request_log.ts). */
  #retention = new Map<string, number>();
  /** Told which tenants' batches each commit wrote (see onWritten). */
  readonly #written = new Set<(tenantIds: string[]) => void>();

  constructor(opts: UsageRollupsOptions = {}) {
    const { maxGroups = 200_000 } = opts;
    if (!(maxGroups >= 1)) {
      throw new RangeError(
        `Cannot create usage rollups: maxGroups must be >= 1: current value is ${maxGroups}`,
      );
    }
    this.#maxGroups = maxGroups;
    this.writer = opts.writer ?? crypto.randomUUID().slice(0, 8);
  }

  /** Groups held in memory now. */
  get size(): number {
    return this.#groups.size;
  }

  /** Shared groups and tenants' batches waiting to be written. */
  get pending(): number {
    return this.#dirty.size + this.#batches.size;
  }

  /** Records waiting to be written. */
  get waitingRecords(): number {
    return this.#waitingRecords;
  }

  /** About how many values waiting would take to write: groups, plus a record value and a mark per batch. */
  get waitingValues(): number {
    return this.#waitingGroups + 2 * this.#batches.size;
  }

  /** When the first thing waiting is due (Infinity: none). */
  get nextDue(): number {
    return this.#nextDue;
  }

  /**
   * Calls `fn` with the tenants whose records each commit wrote, once it
   * landed (their views hold them: budgets are checked then); returns the
   * function that stops it.
   */
  onWritten(fn: (tenantIds: string[]) => void): () => void {
    this.#written.add(fn);
    return () => void this.#written.delete(fn);
  }

  /** Journals every record added from now on (the journal's files are pruned as they reach KV). */
  attachJournal(journal: UsageJournal): void {
    this.#journal = journal;
  }

  /**
   * Every record up to this sequence number is in KV with all its groups
   * (nothing is being written: call between writes).
   */
  writtenUpTo(): number {
    let first = this.#recordSeq + 1;
    this.#batches.forEach((b) => {
      if (b.seqs.length > 0 && b.seqs[0]! < first) first = b.seqs[0]!;
      for (const g of b.groups) if (g.dirtySeq < first) first = g.dirtySeq;
    });
    this.#dirty.forEach((g) => {
      if (g.dirtySeq < first) first = g.dirtySeq;
    });
    return first - 1;
  }

  /**
   * Numbers and journals records, folds them into the rollups in memory
   * and keeps them to be written by `writeDue`. A tenant's batch, and a
   * shared group they make dirty, are due `delayMs` later, give or take
   * half: the writes of 1,000 tenants dirtied in the same second drift
   * apart instead of landing in one burst every `delayMs`. A tenant with a
   * value's worth of records waiting is due at once.
   */
  add(records: UsageRecord[], delayMs = 0): void {
    if (records.length === 0) return;
    const seqs = records.map(() => ++this.#recordSeq);
    if (this.#journal) {
      for (let i = 0; i < records.length; i++) {
        this.#journal.append(seqs[i]!, records[i]!);
      }
    }
    this.#fold(records, seqs, Date.now(), delayMs, null);
  }

  /**
   * Writes what is due by `dueBy` (default: everything), about `max`
   * values of it (a tenant's batch is written whole, so the last may take
   * more), waiting longest first: tenants' batches, then shared groups.
   * Resolves with how many values it wrote. On failure what was not
   * written stays waiting. Calls are serialized.
   */
  writeDue(store: Store, dueBy = Infinity, max = Infinity): Promise<number> {
    return this.#serial(async () => {
      const retention = new Map<string, number>();
      for (const t of [...this.#batches.keys()]) {
        retention.set(t, await requestLogRetentionMs(store, t));
      }
      this.#retention = retention;
      const taken = this.#take(dueBy, max);
      let written = 0;
      let i = 0;
      try {
        for (const commit of commitsOf(taken)) {
          const sets = commit.flatMap((t) => t.sets);
          await commitSets(store.kv, sets);
          written += sets.length;
          if (this.#written.size > 0) {
            const tenants = [
              ...new Set(
                commit.flatMap((t) => t.batch ? [t.batch.tenantId] : []),
              ),
            ];
            if (tenants.length > 0) {
              for (const fn of this.#written) {
                try {
                  fn(tenants);
                } catch { /* a listener's failure is its own */ }
              }
            }
          }
          i += commit.length;
          if (i < taken.length) await new Promise((r) => setTimeout(r, 0));
        }
      } catch (e) {
        this.#restore(taken.slice(i));
        throw e;
      } finally {
        this.#nextDue = this.#firstDue();
      }
      const now = Date.now();
      this.#evict(now);
      if (this.#journal && (now >= this.#nextPrune || dueBy === Infinity)) {
        this.#nextPrune = now + PRUNE_MS;
        this.#journal.prune(this.writtenUpTo());
      }
      return written;
    });
  }

  /** Adds records and writes everything waiting (`add` then `writeDue`). */
  async write(store: Store, records: UsageRecord[]): Promise<void> {
    this.add(records);
    await this.writeDue(store);
  }

  /**
   * Replays a dead writer's journal: adds to each of its shards exactly the
   * records past the shard's `_seq`, and writes the records past each
   * tenant's mark. Running it again (after a crash during it) adds nothing
   * twice. Resolves with how many records were missing from KV.
   */
  static async replay(
    store: Store,
    writer: string,
    entries: JournalEntry[],
  ): Promise<number> {
    if (entries.length === 0) return 0;
    const acc = new UsageRollups({ writer, maxGroups: Infinity });
    const records = entries.map((e) => e.record);
    const seqs = entries.map((e) => e.seq);
    const groups = new Set<Group>();
    const marks = new Map<string, number>();
    for (const r of records) {
      marks.set(r.tenantId, 0);
      if (r.model === "") continue; // in no rollup
      const gs = acc.#groupsOfRecord(r);
      for (const g of allGroups(gs)) groups.add(g);
    }
    for (const g of groups) await acc.#loadShard(store, g);
    for (const t of marks.keys()) {
      const mark = await store.kv.get<number>(k.usageMark(t, writer));
      marks.set(t, typeof mark.value === "number" ? mark.value : 0);
    }
    const missing = (r: UsageRecord, seq: number) =>
      seq > marks.get(r.tenantId)!;
    acc.#fold(records, seqs, Date.now(), 0, missing);
    await acc.writeDue(store);
    return records.filter((r, i) => missing(r, seqs[i]!)).length;
  }

  /** Points a group at its writer's latest shard in KV (greatest `_seq`) and starts from its sums. */
  async #loadShard(store: Store, g: Group): Promise<void> {
    const prefix = g.key.slice(0, -1);
    let best: Deno.KvEntry<unknown> | null = null;
    let bestSeq = -1;
    for await (const e of store.kv.list({ prefix })) {
      const shard = e.key[e.key.length - 1];
      if (typeof shard !== "string" || !shard.startsWith(`${this.writer}.`)) {
        continue;
      }
      const v = e.value as RollupFields | null;
      const seq = typeof v?.[SEQ_FIELD] === "number" ? v[SEQ_FIELD] : 0;
      if (seq > bestSeq) [best, bestSeq] = [e, seq];
    }
    if (!best) return;
    g.key = best.key;
    if (isPacked(best.value)) {
      g.sums.set(best.value.v.subarray(0, g.sums.length));
    } else {
      const v = best.value as RollupFields;
      g.names.forEach((n, i) =>
        g.sums[i] = typeof v[n] === "number" ? v[n] : 0
      );
    }
    g.floor = g.seq = bestSeq;
  }

  /**
   * Takes what is due by `dueBy`, at most `max` values, waiting longest
   * first (maps and sets iterate in insertion order: a batch or group
   * joins the end when it starts waiting). Their values are read now, and
   * they are marked clean: records that come while they are written start
   * new batches. Each tick scans up to every waiting batch and group:
   * forEach, unlike for-of in this async writer, allocates nothing per
   * element.
   */
  #take(dueBy: number, max: number): Taken[] {
    const taken: Taken[] = [];
    let values = 0;
    this.#batches.forEach((b) => {
      if (values >= max || b.due > dueBy) return;
      this.#batches.delete(b.tenantId);
      this.#waitingRecords -= b.records.length;
      for (const t of this.#takeBatch(b)) {
        if (t.sets.length === 0) continue; // replay: all of it in KV already
        values += t.sets.length;
        taken.push(t);
      }
    });
    const shared: Group[] = [];
    this.#dirty.forEach((g) => {
      if (values < max && g.due <= dueBy) {
        shared.push(g);
        values++;
      }
    });
    // Keys in order: each commit then touches fewer SQLite pages (~25% less CPU).
    shared.sort((a, b) => a.id < b.id ? -1 : 1);
    for (const g of shared) {
      this.#dirty.delete(g);
      taken.push({
        sets: [setOf(g)],
        batch: null,
        groups: [this.#clean(g)],
      });
    }
    return taken;
  }

  /**
   * A batch's sets: its records (a value per RECORDS_PER_VALUE), the
   * tenant's mark at the last of them, and its groups, all in one commit.
   * A batch too large for one (more than RECORDS_PER_COMMIT records, or
   * MAX_TENANT_MUTATIONS values) is split: records a commit's worth at a
   * time, each with the mark at its last record (so a crash between them
   * replays exactly the rest), then its groups (each says up to which
   * record it holds).
   */
  #takeBatch(b: TenantBatch): Taken[] {
    b.groups.sort((x, y) => x.id < y.id ? -1 : 1);
    const groups = b.groups.map((g) => this.#clean(g));
    const groupSets = b.groups.map(setOf);
    const recordSets = b.records.length <= RECORDS_PER_COMMIT
      ? this.#recordSets(b.tenantId, b.records, b.seqs)
      : null;
    if (
      recordSets && recordSets.length + groups.length <= MAX_TENANT_MUTATIONS
    ) {
      return [{
        sets: [...recordSets, ...groupSets],
        batch: b,
        groups,
      }];
    }
    const parts: Taken[] = [];
    for (let i = 0; i < b.records.length; i += RECORDS_PER_COMMIT) {
      const records = b.records.slice(i, i + RECORDS_PER_COMMIT);
      const seqs = b.seqs.slice(i, i + RECORDS_PER_COMMIT);
      parts.push({
        sets: this.#recordSets(b.tenantId, records, seqs),
        batch: { ...b, records, seqs, groups: [] },
        groups: [],
      });
    }
    for (let i = 0; i < groups.length; i += MAX_MUTATIONS) {
      parts.push({
        sets: groupSets.slice(i, i + MAX_MUTATIONS),
        batch: null,
        groups: groups.slice(i, i + MAX_MUTATIONS),
      });
    }
    return parts;
  }

  /** Records as values of up to RECORDS_PER_VALUE under the first one's id, and the tenant's mark at the last. */
  #recordSets(
    tenantId: string,
    records: UsageRecord[],
    seqs: number[],
  ): KvSet[] {
    const sets: KvSet[] = [];
    const expireIn = this.#retention.get(tenantId) ??
      retentionMs(tenantId, "usage");
    for (let i = 0; i < records.length; i += RECORDS_PER_VALUE) {
      const value = records.slice(i, i + RECORDS_PER_VALUE);
      sets.push([
        k.usageRecord(tenantId, value[0]!.id),
        value,
        { expireIn },
        value.length,
      ]);
      // The request log's index of this value, in the same commit.
      for (
        const [key, positions] of requestLogIndexSets(
          tenantId,
          value[0]!.id,
          value,
        )
      ) {
        sets.push([key, positions, { expireIn }]);
      }
    }
    if (seqs.length > 0) {
      sets.push([
        k.usageMark(tenantId, this.writer),
        seqs[seqs.length - 1]!,
        { expireIn: MARK_TTL_MS },
      ]);
    }
    return sets.concat(this.#lastUsedSets(records));
  }

  /**
   * Each key's "last used" (the start of its latest request here), at most
   * once a LAST_USED_EVERY_MS per key: what the portal shows, written with
   * the records that prove it, not a KV write per request.
   */
  #lastUsedSets(records: UsageRecord[]): KvSet[] {
    const latest = new Map<string, string>();
    for (const r of records) {
      const at = latest.get(r.keyId);
      if (at === undefined || r.at > at) latest.set(r.keyId, r.at);
    }
    const now = Date.now();
    const sets: KvSet[] = [];
    for (const [keyId, at] of latest) {
      if (now - (this.#lastUsedWritten.get(keyId) ?? 0) < LAST_USED_EVERY_MS) {
        continue;
      }
      if (this.#lastUsedWritten.size >= 100_000) this.#lastUsedWritten.clear();
      this.#lastUsedWritten.set(keyId, now);
      sets.push([k.apiKeyLastUsed(keyId), at]);
    }
    return sets;
  }

  #clean(g: Group): { g: Group; dirtySeq: number } {
    g.dirty = false;
    this.#waitingGroups--;
    return { g, dirtySeq: g.dirtySeq };
  }

  /**
   * Puts back what a failed write took: its records before any that came
   * since (last part first, each put before the others), its groups dirty
   * again.
   */
  #restore(taken: Taken[]): void {
    const now = Date.now();
    for (const t of taken.toReversed()) {
      const b = t.batch;
      if (b) {
        const since = this.#batches.get(b.tenantId);
        if (since) {
          since.records = b.records.concat(since.records);
          since.seqs = b.seqs.concat(since.seqs);
          since.due = Math.min(since.due, b.due);
        } else {
          this.#batches.set(b.tenantId, { ...b, groups: [] });
        }
        this.#waitingRecords += b.records.length;
      }
      for (const { g, dirtySeq } of t.groups) {
        if (g.dirty) g.dirtySeq = Math.min(g.dirtySeq, dirtySeq);
        else if (g.tenantId === null) {
          this.#markShared(g, dirtySeq, now, 0);
        } else {
          const batch = this.#batchOf(g.tenantId, now, 0);
          this.#waitingGroups++;
          g.dirty = true;
          g.dirtySeq = dirtySeq;
          batch.groups.push(g);
        }
      }
    }
  }

  /** When the first thing waiting is due (Infinity: none). */
  #firstDue(): number {
    let first = Infinity;
    this.#dirty.forEach((g) => {
      if (g.due < first) first = g.due;
    });
    this.#batches.forEach((b) => {
      if (b.due < first) first = b.due;
    });
    return first;
  }

  #serial<T>(f: () => Promise<T>): Promise<T> {
    const p = this.#chain.then(f);
    this.#chain = p.then(() => {}, () => {});
    return p;
  }

  /** The tenant's batch, begun (due `delayMs` after `now`, give or take half) if none waits. */
  #batchOf(tenantId: string, now: number, delayMs: number): TenantBatch {
    let b = this.#batches.get(tenantId);
    if (!b) {
      b = {
        tenantId,
        records: [],
        seqs: [],
        groups: [],
        due: later(now, delayMs),
      };
      this.#batches.set(tenantId, b);
      if (b.due < this.#nextDue) this.#nextDue = b.due;
    }
    return b;
  }

  /**
   * Adds records to their groups (those past each group's floor), and the
   * records `keep` accepts (default all) to their tenants' batches. The
   * groups of a (tenant, key, model, node, hour) are looked up once and
   * cached, so a record costs one map lookup and a few additions.
   */
  #fold(
    records: UsageRecord[],
    seqs: number[],
    now: number,
    delayMs: number,
    keep: ((r: UsageRecord, seq: number) => boolean) | null,
  ): void {
    for (let i = 0; i < records.length; i++) {
      const r = records[i]!;
      const seq = seqs[i]!;
      const b = this.#batchOf(r.tenantId, now, delayMs);
      if (keep === null || keep(r, seq)) {
        b.records.push(r);
        b.seqs.push(seq);
        this.#waitingRecords++;
        if (b.records.length >= RECORDS_PER_VALUE) {
          b.due = now;
          this.#nextDue = now;
        }
      }
      // Refused before its model was known: in the request log only.
      if (r.model === "") continue;
      const gs = this.#groupsOfRecord(r);
      const latency = r.latencyMs;
      const prompt = r.promptTokens;
      const completion = r.completionTokens;
      const lat = LAT_0 + bucketOf(latency);
      const ttftMs = r.ttftMs;
      const ttft = ttftMs === null ? -1 : TTFT_0 + bucketOf(ttftMs);
      const error = r.outcome !== "ok" ? 1 : 0;
      const limited = r.status === 429 ? 1 : 0;
      const addTime = (g: Group) => {
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
      };
      for (const g of gs.tenantTime) {
        if (seq <= g.floor) continue;
        addTime(g);
        this.#markOwn(g, b, seq);
      }
      for (const g of gs.sharedTime) {
        if (seq <= g.floor) continue;
        addTime(g);
        this.#markShared(g, seq, now, delayMs);
      }
      const t = gs.tenant;
      if (seq > t.floor) {
        const tv = t.sums; // TENANT_MONTH_FIELDS
        tv[0] = tv[0]! + 1;
        tv[1] = tv[1]! + prompt + completion;
        tv[2] = tv[2]! + error;
        this.#markOwn(t, b, seq);
      }
      const tm = gs.tenantModel;
      if (seq > tm.floor) {
        const mv = tm.sums; // TENANT_MODEL_MONTH_FIELDS
        mv[0] = mv[0]! + 1;
        mv[1] = mv[1]! + prompt;
        mv[2] = mv[2]! + completion;
        this.#markOwn(tm, b, seq);
      }
      const node = gs.node;
      if (node && seq > node.floor) {
        node.sums[0] = node.sums[0]! + latency; // NODE_MONTH_FIELDS
        node.sums[1] = node.sums[1]! + prompt + completion;
        this.#markShared(node, seq, now, delayMs);
      }
      const nt = gs.nodeTenant;
      if (nt && seq > nt.floor) {
        nt.sums[0] = nt.sums[0]! + latency;
        nt.sums[1] = nt.sums[1]! + prompt + completion;
        this.#markOwn(nt, b, seq);
      }
      for (const m of gs.members) {
        if (seq > m.node.floor) {
          m.node.sums[0] = m.node.sums[0]! + latency;
          this.#markShared(m.node, seq, now, delayMs);
        }
        if (seq > m.nodeTenant.floor) {
          m.nodeTenant.sums[0] = m.nodeTenant.sums[0]! + latency;
          this.#markOwn(m.nodeTenant, b, seq);
        }
      }
      this.#foldCapacity(r, gs, seq, now, delayMs);
    }
  }

  /** Adds a record to its capacity groups (store/capacity_rollup.ts). */
  #foldCapacity(
    r: UsageRecord,
    gs: RecordGroups,
    seq: number,
    now: number,
    delayMs: number,
  ): void {
    const routed = r.nodeId !== null;
    if (!routed && r.refused === undefined) return;
    const queue = r.queueMs ?? 0;
    const cc = gs.capCluster;
    if (seq > cc.floor) {
      const v = cc.sums; // CLUSTER_FIELDS
      const o = gs.hod * CAP_CLUSTER_N;
      v[o] = v[o]! + 1;
      if (queue > 0) v[o + 1] = v[o + 1]! + 1;
      v[o + 2] = v[o + 2]! + queue;
      if (r.refused !== undefined) v[o + 3] = v[o + 3]! + 1;
      this.#markShared(cc, seq, now, delayMs);
    }
    if (!routed) return;
    const busy = Math.max(0, r.latencyMs - queue);
    const share = busy / Math.max(1, r.slots ?? 1);
    const cn = gs.capNode;
    if (cn && seq > cn.floor) {
      const v = cn.sums; // NODE_FIELDS
      const o = gs.hod * CAP_NODE_N;
      v[o] = v[o]! + 1;
      v[o + 1] = v[o + 1]! + r.promptTokens;
      v[o + 2] = v[o + 2]! + r.completionTokens;
      v[o + 3] = v[o + 3]! + busy;
      v[o + 4] = v[o + 4]! + share;
      v[o + 5] = v[o + 5]! + queue;
      this.#markShared(cn, seq, now, delayMs);
    }
    for (const { capNode } of gs.members) {
      if (seq <= capNode.floor) continue;
      const v = capNode.sums; // NODE_FIELDS: busy and slot time only
      const o = gs.hod * CAP_NODE_N;
      v[o + 3] = v[o + 3]! + busy;
      v[o + 4] = v[o + 4]! + share;
      this.#markShared(capNode, seq, now, delayMs);
    }
    const cm = gs.capModel;
    if (seq > cm.floor) {
      const v = cm.sums; // MODEL_FIELDS
      v[0] = v[0]! + 1;
      v[1] = v[1]! + r.promptTokens;
      v[2] = v[2]! + r.completionTokens;
      v[3] = v[3]! + share;
      this.#markShared(cm, seq, now, delayMs);
    }
  }

  /** Counts a fold into a tenant's own group: it joins the tenant's batch if not dirty yet. */
  #markOwn(g: Group, b: TenantBatch, seq: number): void {
    g.seq = seq;
    if (g.dirty) return;
    g.dirty = true;
    g.dirtySeq = seq;
    this.#waitingGroups++;
    b.groups.push(g);
  }

  /** Counts a fold into a shared group; newly dirty, it is due `delayMs` after `now`, give or take half. */
  #markShared(g: Group, seq: number, now: number, delayMs: number): void {
    if (seq > g.seq) g.seq = seq;
    if (g.dirty) return;
    g.dirty = true;
    g.dirtySeq = seq;
    this.#waitingGroups++;
    g.due = later(now, delayMs);
    if (g.due < this.#nextDue) this.#nextDue = g.due;
    this.#dirty.add(g);
  }

  /** A record's groups: its key's last ones when the tuple repeats, else looked up (or made). */
  #groupsOfRecord(r: UsageRecord): RecordGroups {
    const t = Date.parse(r.at);
    const hour = Math.floor(t / 3_600_000);
    const last = this.#lastOfKey.get(r.keyId);
    if (
      last !== undefined && last.hour === hour && last.model === r.model &&
      last.nodeId === r.nodeId && last.tenantId === r.tenantId &&
      last.members === membersOf(r)
    ) {
      if (last.drops === this.#drops) return last.gs;
      if (!stale(last.gs)) {
        last.drops = this.#drops;
        return last.gs;
      }
    }
    const id =
      `${r.tenantId}\u0000${r.keyId}\u0000${r.model}\u0000${r.nodeId}\u0000${hour}\u0000${
        membersOf(r)
      }`;
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
      members: membersOf(r),
      hour,
      gs,
      drops: this.#drops,
    });
    return gs;
  }

  /** The groups a record adds to, created (each with a new shard) where absent. */
  #groupsOf(r: UsageRecord, t: number): RecordGroups {
    const tenantTime: Group[] = [];
    const sharedTime: Group[] = [];
    for (const g of ["hour", "day"] as const) {
      const b = timeBucket(g, t);
      const end = Date.parse(g === "hour" ? `${b}:00:00Z` : `${b}T00:00:00Z`) +
        (g === "hour" ? 3_600_000 : 86_400_000) + KEEP_MS[g];
      for (const [dim, subject, own] of subjects(r)) {
        (own ? tenantTime : sharedTime).push(
          this.#group(
            `${g}|${dim}|${subject}|${b}`,
            TIME_FIELDS,
            end,
            own ? r.tenantId : null,
            (shard) => k.usageRollup(g, dim, subject, b, shard),
          ),
        );
      }
      // Per key and model, which spend per key is priced from (store/spend.ts).
      tenantTime.push(
        this.#group(
          `${g}|key_model|${r.tenantId}|${b}|${r.keyId}|${r.model}`,
          TIME_FIELDS,
          end,
          r.tenantId,
          (shard) => k.usageKeyModel(g, r.tenantId, b, r.keyId, r.model, shard),
        ),
      );
    }
    const d = new Date(t);
    const day = d.toISOString().slice(0, 10);
    const dayEnd =
      Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()) +
      86_400_000 + KEEP_MS.day;
    const capGroup = (
      kind: CapacityKind,
      subject: string,
      names: readonly string[],
      packed: number,
    ) =>
      this.#group(
        `capacity|${kind}|${subject}|${day}`,
        names,
        dayEnd,
        null,
        (shard) => k.usageCapacity(day, kind, subject, shard),
        packed,
      );
    const month = d.toISOString().slice(0, 7);
    const end = Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1) +
      KEEP_MS.month;
    const monthGroup = (
      dim: UsageMonthDimension,
      subject: string,
      names: readonly string[],
      tenantId: string | null,
    ) =>
      this.#group(
        `month|${dim}|${subject}|${month}`,
        names,
        end,
        tenantId,
        (shard) => k.usageMonth(month, dim, subject, shard),
      );
    return {
      tenantTime,
      sharedTime,
      tenant: monthGroup(
        "tenant",
        r.tenantId,
        TENANT_MONTH_FIELDS,
        r.tenantId,
      ),
      tenantModel: monthGroup(
        "tenant_model",
        `${r.tenantId}/${r.model}`,
        TENANT_MODEL_MONTH_FIELDS,
        r.tenantId,
      ),
      node: r.nodeId
        ? monthGroup("node", r.nodeId, NODE_MONTH_FIELDS, null)
        : null,
      nodeTenant: r.nodeId
        ? monthGroup(
          "node_tenant",
          `${r.nodeId}/${r.tenantId}`,
          NODE_MONTH_FIELDS,
          r.tenantId,
        )
        : null,
      capNode: r.nodeId
        ? capGroup("node", r.nodeId, CAP_NODE_NAMES, CAP_NODE_N)
        : null,
      members: memberIds(r).map((id) => ({
        node: monthGroup("node", id, NODE_MONTH_FIELDS, null),
        nodeTenant: monthGroup(
          "node_tenant",
          `${id}/${r.tenantId}`,
          NODE_MONTH_FIELDS,
          r.tenantId,
        ),
        capNode: capGroup("node", id, CAP_NODE_NAMES, CAP_NODE_N),
      })),
      capModel: capGroup("model", r.model, MODEL_FIELDS, MODEL_FIELDS.length),
      capCluster: capGroup("cluster", "*", CAP_CLUSTER_NAMES, CAP_CLUSTER_N),
      hod: d.getUTCHours(),
    };
  }

  /** The group `id` in memory, created with a new shard if absent. */
  #group(
    id: string,
    names: readonly string[],
    end: number,
    tenantId: string | null,
    key: (shard: string) => Deno.KvKey,
    packed = 0,
  ): Group {
    let g = this.#groups.get(id);
    if (!g) {
      g = {
        id,
        key: key(`${this.writer}.${(this.#shardSeq++).toString(36)}`),
        names,
        packed,
        sums: new Float64Array(names.length),
        tenantId,
        seq: 0,
        floor: 0,
        dirtySeq: 0,
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

/** The rollup subjects of a record: dimension, subject, and whether it is the tenant's own. */
function subjects(r: UsageRecord): [UsageDimension, string, boolean][] {
  return [
    ["tenant", r.tenantId, true],
    ["key", `${r.tenantId}/${r.keyId}`, true],
    ["tenant_model", `${r.tenantId}/${r.model}`, true],
    ["model", r.model, false],
    ["all", "*", false],
  ];
}

function allGroups(gs: RecordGroups): Group[] {
  const out = [...gs.tenantTime, ...gs.sharedTime, gs.tenant, gs.tenantModel];
  if (gs.node) out.push(gs.node);
  if (gs.nodeTenant) out.push(gs.nodeTenant);
  if (gs.capNode) out.push(gs.capNode);
  for (const m of gs.members) out.push(m.node, m.nodeTenant, m.capNode);
  out.push(gs.capModel, gs.capCluster);
  return out;
}

/** `delayMs` after `now`, give or take half: half to all of it, at random. */
function later(now: number, delayMs: number): number {
  return now + delayMs * (0.5 + 0.5 * Math.random());
}

/** A record's spanning-instance members other than its node (valid ids, at most 32, no repeats). */
function memberIds(r: UsageRecord): string[] {
  if (!r.nodeId || !Array.isArray(r.members)) return [];
  const out = new Set<string>();
  for (const id of r.members) {
    if (typeof id === "string" && id && id !== r.nodeId) out.add(id);
    if (out.size >= 32) break;
  }
  return [...out];
}

/** memberIds joined: what a record's cached groups are looked up by. */
function membersOf(r: UsageRecord): string {
  return r.members ? memberIds(r).join(",") : "";
}

/** Whether one of a record's cached groups left memory. */
function stale(gs: RecordGroups): boolean {
  return gs.tenantTime.some((g) => g.gone) ||
    gs.sharedTime.some((g) => g.gone) || gs.tenant.gone ||
    gs.tenantModel.gone || !!gs.node?.gone || !!gs.nodeTenant?.gone ||
    !!gs.capNode?.gone || gs.capModel.gone || gs.capCluster.gone ||
    gs.members.some((m) => m.node.gone || m.nodeTenant.gone || m.capNode.gone);
}

/** A group's value (its sums by name, zeros left out, and `_seq`) under its shard key. */
function setOf(g: Group): KvSet {
  if (g.packed > 0) {
    return [g.key, { [SEQ_FIELD]: g.seq, n: g.packed, v: g.sums.slice() }];
  }
  const f: RollupFields = {};
  for (let i = 0; i < g.names.length; i++) {
    if (g.sums[i] !== 0) f[g.names[i]!] = g.sums[i]!;
  }
  f[SEQ_FIELD] = g.seq;
  return [g.key, f];
}

/**
 * Groups what was taken into commits: whole batches (each atomic) and
 * shared groups, up to MAX_MUTATIONS and RECORDS_PER_COMMIT records each;
 * a batch larger than that gets a commit of its own.
 */
function commitsOf(taken: Taken[]): Taken[][] {
  const commits: Taken[][] = [];
  let cur: Taken[] = [];
  let n = 0;
  let records = 0;
  for (const t of taken) {
    const tn = t.sets.length;
    const tr = t.sets.reduce((a, s) => a + (s[3] ?? 0), 0);
    if (
      cur.length > 0 &&
      (n + tn > MAX_MUTATIONS || records + tr > RECORDS_PER_COMMIT)
    ) {
      commits.push(cur);
      cur = [];
      n = records = 0;
    }
    cur.push(t);
    n += tn;
    records += tr;
  }
  if (cur.length > 0) commits.push(cur);
  return commits;
}

async function commitSets(kv: Deno.Kv, sets: KvSet[]): Promise<void> {
  const op = kv.atomic();
  for (const [key, value, opts] of sets) op.set(key, value, opts);
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
