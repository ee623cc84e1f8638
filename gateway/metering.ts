/**
 * Writes usage off the client's critical path: each record is folded into
 * its rollup groups at once, and records and groups wait in memory to be
 * written `rollupMs` after they changed: half to all of it, at random, so
 * the groups of many tenants are written a share at a time (in one batch a
 * second), not in one burst that stalls requests. A group busy in that time
 * costs one KV write however many records it took, and a tenant's records
 * share one value: one B-tree page touched per tenant, not per request.
 * When more are due than `maxWritesPerSecond`, those waiting longest go
 * first and the rest wait (busy groups take more records meanwhile, for the
 * same write), at most MAX_WAIT_MS past due: 1,000 busy tenants' ~10,000
 * values cost 250 writes a second, not ~1,300 (each write costs ~25 µs of
 * CPU with the embedded store, and a round trip with a remote one; usage
 * charts are by hour and day, so a minute of lag hardly shows). `flush()`
 * writes everything at once.
 *
 * What a crash loses: with a journal (`startJournal`), the records of the
 * last 100 ms at most (kill -9; a power cut: the last second); the next
 * gateway on the data directory replays the rest (`replayJournals`).
 * Without one, the records and rollups of the last `rollupMs`, or up to
 * MAX_WAIT_MS more while writes are over budget. Limits and quotas are
 * settled in KV by the admitter either way.
 */
import type { Store } from "../store/store.ts";
import type { UsageRecord } from "../store/usage.ts";
import { rollupsOf, UsageRollups } from "../store/usage_rollups.ts";
import {
  journalDirs,
  readJournal,
  UsageJournal,
} from "../store/usage_journal.ts";
import type { Logger } from "../lib/log.ts";

/** Tunables of a UsageWriter. */
export interface UsageWriterOptions {
  /** Most records waiting; more are dropped and counted (default 100,000). */
  maxQueue?: number;
  /** How long records and rollup groups may wait to be written (default 10 s; each waits half to all of it). */
  rollupMs?: number;
  /**
   * Most values written a second when more are due (default 250): the
   * rest wait, longest first, but none more than MAX_WAIT_MS.
   */
  maxWritesPerSecond?: number;
}

/** The longest anything waits to be written when more than `maxWritesPerSecond` are due. */
const MAX_WAIT_MS = 60_000;

/** Batches usage records and their rollups into KV. */
export class UsageWriter {
  readonly #store: Store;
  /** The store's rollups (shared with other writers on the same store). */
  readonly #acc: UsageRollups;
  readonly #log: Logger;
  readonly #maxQueue: number;
  readonly #rollupMs: number;
  readonly #maxWritesPerSecond: number;
  /** Time between writes: what falls due meanwhile shares one. */
  readonly #tickMs: number;
  #running: Promise<boolean> | null = null;
  /**
   * When the next write may start: a tick after the last one (what falls
   * due meanwhile shares it), later after a failure (flush() writes at
   * once).
   */
  #writeAt = 0;
  /** Values written past the ticks' shares so far (later ticks write that much less). */
  #overdrawn = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** When the armed timer fires (epoch ms). */
  #timerDue = 0;
  /** Records dropped because too many were waiting (KV failing for long). */
  dropped = 0;
  #journal: UsageJournal | null = null;
  /** Replays run one at a time (at start, and when instances lapse). */
  #replaying: Promise<unknown> = Promise.resolve();

  constructor(store: Store, log: Logger, opts: UsageWriterOptions = {}) {
    this.#store = store;
    this.#acc = rollupsOf(store);
    this.#log = log;
    this.#maxQueue = opts.maxQueue ?? 100_000;
    this.#rollupMs = opts.rollupMs ?? 10_000;
    this.#maxWritesPerSecond = opts.maxWritesPerSecond ?? 250;
    this.#tickMs = Math.min(1000, this.#rollupMs / 4);
  }

  /**
   * Journals every record added from now on, under
   * `<root>/<instance>/<writer>`, deleting what is in KV as it goes.
   */
  async startJournal(root: string, instance: string): Promise<void> {
    if (this.#journal) return;
    this.#journal = await UsageJournal.open(
      `${root}/${instance}/${this.#acc.writer}`,
    );
    this.#acc.attachJournal(this.#journal);
  }

  /**
   * Replays the journals under `root` that gateways left behind, of the
   * instances `dead` says are (this writer's own is never touched), and
   * deletes them; resolves with how many records were missing from KV.
   * One replay runs at a time.
   */
  replayJournals(
    root: string,
    dead: (instance: string) => boolean | Promise<boolean>,
  ): Promise<number> {
    const run = this.#replaying.then(async () => {
      let missing = 0;
      for (const j of await journalDirs(root)) {
        if (j.dir === this.#journal?.dir || !(await dead(j.instance))) continue;
        const { entries, skipped } = await readJournal(j.dir);
        const n = await UsageRollups.replay(this.#store, j.writer, entries);
        await Deno.remove(j.dir, { recursive: true });
        await removeIfEmpty(`${root}/${j.instance}`);
        missing += n;
        this.#log.info("replayed the usage journal of a stopped gateway", {
          instance: j.instance,
          records: entries.length,
          missing: n,
          ...(skipped > 0 ? { unreadableLines: skipped } : {}),
        });
      }
      return missing;
    });
    this.#replaying = run.catch(() => {});
    return run;
  }

  /** Writes everything waiting, then closes the journal (deleted if all of it is in KV). */
  async close(): Promise<void> {
    await this.flush();
    await this.#replaying;
    const journal = this.#journal;
    if (!journal) return;
    await journal.close(this.#acc.writtenUpTo());
    await removeIfEmpty(journal.dir.slice(0, journal.dir.lastIndexOf("/")));
  }

  /** Folds a record into the rollups and keeps it to be written; returns at once. */
  add(r: UsageRecord): void {
    if (this.#acc.waitingRecords >= this.#maxQueue) {
      this.dropped++;
      return;
    }
    this.#acc.add([r], this.#rollupMs);
    this.#schedule();
  }

  /** Arms the timer for the next write, when the first thing waiting is due. */
  #schedule(): void {
    if (this.#running || this.#acc.pending === 0) return;
    const now = Date.now();
    const due = Math.max(now, this.#acc.nextDue, this.#writeAt);
    if (this.#timer !== undefined) {
      if (this.#timerDue <= due) return;
      clearTimeout(this.#timer);
    }
    this.#timerDue = due;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      if (!this.#running) this.#start(false);
    }, due - now);
  }

  /** Writes every waiting record and rollup; resolves when all are written (or a write failed). */
  async flush(): Promise<void> {
    for (;;) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
      if (!this.#running) {
        if (this.#acc.pending === 0) return;
        this.#start(true);
      }
      const failed = await this.#running!;
      if (failed) return; // KV is failing: what is left waits for the next write
    }
  }

  /** Runs `#write`, then schedules the next (after it settled: it may finish at once). */
  #start(all: boolean): void {
    this.#running = this.#write(all).finally(() => {
      this.#running = null;
      this.#schedule();
    });
  }

  /** Writes what is due (everything when `all`); resolves true when a write failed. */
  async #write(all: boolean): Promise<boolean> {
    let failed = false;
    const now = Date.now();
    const dueBy = all ? Infinity : now;
    if (this.#acc.nextDue <= dueBy && (all || now >= this.#writeAt)) {
      this.#writeAt = now + this.#tickMs;
      // A share a tick; more when so many wait that some would wait longer
      // than MAX_WAIT_MS.
      // A tenant's batch is written whole: what a tick wrote over its
      // share comes off the next ones'.
      const share = all ? Infinity : Math.ceil(
        Math.max(
          this.#maxWritesPerSecond * this.#tickMs / 1000,
          this.#acc.waitingValues * this.#tickMs / MAX_WAIT_MS,
        ),
      );
      const max = share - this.#overdrawn;
      this.#overdrawn = Math.max(0, -max);
      if (max > 0) {
        await this.#acc.writeDue(this.#store, dueBy, max).then((n) => {
          this.#overdrawn = all ? 0 : Math.max(0, n - max);
        }, (e) => {
          failed = true; // what was due stays waiting: written next time
          this.#writeAt = now + this.#rollupMs / 2;
          this.#log.warn("usage write failed", { error: String(e) });
        });
      }
    }
    return failed;
  }
}

/** Removes a directory if it is empty (journals of an instance all replayed). */
async function removeIfEmpty(dir: string): Promise<void> {
  await Deno.remove(dir).catch(() => {});
}
