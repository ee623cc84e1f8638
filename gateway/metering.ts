/**
 * Writes usage off the client's critical path: records are queued and
 * written together every `flushMs`, and each rollup group they were folded
 * into within `rollupMs`: half to all of it, at random, so the groups of
 * many tenants are written a share at a time (in one batch a second), not
 * in one burst that stalls requests. A group busy in that time costs one KV
 * write however many records it took: with 1,000 quiet tenants, ~2 writes
 * per request instead of ~10. Expired reservations of crashed gateways are
 * reclaimed every `reclaimEveryMs`. `flush()` writes everything at once.
 *
 * What a crash loses: records of the last `flushMs` and the rollups of the
 * last `rollupMs` (limits and quotas are unaffected: they are settled in
 * KV by the admitter).
 */
import { reclaimExpired } from "../store/quota.ts";
import type { Store } from "../store/store.ts";
import {
  rollupsOf,
  type UsageRecord,
  type UsageRollups,
} from "../store/usage.ts";
import type { Logger } from "./logger.ts";

/** Tunables of a UsageWriter. */
export interface UsageWriterOptions {
  /** Most records waiting; more are dropped and counted (default 100,000). */
  maxQueue?: number;
  /** How often crashed gateways' reservations are looked for (default 30 s). */
  reclaimEveryMs?: number;
  /** How long a record may wait to share a write (default 250 ms). */
  flushMs?: number;
  /** How long a rollup group may wait to be written (default 10 s; it waits half to all of it). */
  rollupMs?: number;
}

/** Batches usage records and their rollups into KV. */
export class UsageWriter {
  readonly #store: Store;
  /** The store's rollups (shared with other writers on the same store). */
  readonly #acc: UsageRollups;
  readonly #log: Logger;
  readonly #maxQueue: number;
  readonly #reclaimEveryMs: number;
  readonly #flushMs: number;
  readonly #rollupMs: number;
  #queue: UsageRecord[] = [];
  #running: Promise<boolean> | null = null;
  #lastReclaim = Date.now();
  /**
   * When rollups may be written next: a tick after the last write (the
   * groups due meanwhile share it), later after a failure (flush() writes
   * at once).
   */
  #rollupsAt = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** When the armed timer fires (epoch ms). */
  #timerDue = 0;
  /** Records dropped because KV failed repeatedly or the queue overflowed. */
  dropped = 0;

  constructor(store: Store, log: Logger, opts: UsageWriterOptions = {}) {
    this.#store = store;
    this.#acc = rollupsOf(store);
    this.#log = log;
    this.#maxQueue = opts.maxQueue ?? 100_000;
    this.#reclaimEveryMs = opts.reclaimEveryMs ?? 30_000;
    this.#flushMs = opts.flushMs ?? 250;
    this.#rollupMs = opts.rollupMs ?? 10_000;
  }

  /** Queues a record; returns at once. */
  add(r: UsageRecord): void {
    if (this.#queue.length >= this.#maxQueue) {
      this.dropped++;
      return;
    }
    this.#queue.push(r);
    this.#schedule();
  }

  /**
   * Arms the timer for the next write: records soon, rollups later. A
   * timer armed for rollups is brought forward when records arrive.
   */
  #schedule(): void {
    if (this.#running) return;
    const now = Date.now();
    let due: number;
    if (this.#queue.length > 0) {
      due = now + (this.#queue.length >= 2000 ? 0 : this.#flushMs);
    } else if (this.#acc.pending > 0) {
      due = Math.max(now, this.#acc.nextDue, this.#rollupsAt);
    } else return;
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

  /** Writes every queued record and rollup; resolves when all are written (or dropped). */
  async flush(): Promise<void> {
    for (;;) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
      if (!this.#running) {
        if (this.#queue.length === 0 && this.#acc.pending === 0) {
          return;
        }
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

  /**
   * Writes one batch of records (up to 5000), and the rollups when due or
   * `all`; resolves true when a write failed.
   */
  async #write(all: boolean): Promise<boolean> {
    const acc = this.#acc;
    let failed = false;
    const batch = this.#queue.splice(0, 5000);
    if (batch.length > 0) {
      let ok = false;
      for (let attempt = 0; attempt < 3 && !ok; attempt++) {
        try {
          await acc.add(this.#store, batch, this.#rollupMs);
          ok = true;
        } catch (e) {
          this.#log.log("warn", "usage write failed", {
            error: String(e),
            attempt,
          });
        }
      }
      if (!ok) {
        this.dropped += batch.length;
        failed = true;
      }
    }
    const now = Date.now();
    const dueBy = all && this.#queue.length === 0 ? Infinity : now;
    if (acc.nextDue <= dueBy && (all || now >= this.#rollupsAt)) {
      this.#rollupsAt = now + Math.min(1000, this.#rollupMs / 4);
      await acc.writeRollups(this.#store, dueBy).catch((e) => {
        failed = true; // the groups stay pending: written next time
        this.#rollupsAt = now + this.#rollupMs / 2;
        this.#log.log("warn", "usage rollup write failed", {
          error: String(e),
        });
      });
    }
    if (now - this.#lastReclaim >= this.#reclaimEveryMs) {
      this.#lastReclaim = now;
      const n = await reclaimExpired(this.#store).catch(() => 0);
      if (n > 0) {
        this.#log.log("info", "reclaimed expired reservations", { count: n });
      }
    }
    return failed;
  }
}
