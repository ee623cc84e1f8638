/**
 * Writes usage records off the client's critical path: records are queued
 * and written together every `flushMs` (so rollup sums coalesce across many
 * requests), and expired reservations of crashed gateways are reclaimed
 * every `reclaimEveryMs`. `flush()` writes at once and drains the queue.
 */
import { reclaimExpired } from "../store/quota.ts";
import type { Store } from "../store/store.ts";
import { type UsageRecord, writeUsage } from "../store/usage.ts";
import type { Logger } from "./logger.ts";

/** Batches usage records into KV. */
export class UsageWriter {
  readonly #store: Store;
  readonly #log: Logger;
  readonly #maxQueue: number;
  readonly #reclaimEveryMs: number;
  #queue: UsageRecord[] = [];
  #running: Promise<void> | null = null;
  #lastReclaim = 0;
  readonly #flushMs: number;
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** Records dropped because KV failed repeatedly or the queue overflowed. */
  dropped = 0;

  constructor(
    store: Store,
    log: Logger,
    opts: { maxQueue?: number; reclaimEveryMs?: number; flushMs?: number } = {},
  ) {
    this.#flushMs = opts.flushMs ?? 250;
    this.#store = store;
    this.#log = log;
    this.#maxQueue = opts.maxQueue ?? 100_000;
    this.#reclaimEveryMs = opts.reclaimEveryMs ?? 30_000;
    this.#lastReclaim = Date.now();
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

  #schedule(): void {
    if (
      this.#running || this.#timer !== undefined || this.#queue.length === 0
    ) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#running ??= this.#writeBatch();
    }, this.#queue.length >= 2000 ? 0 : this.#flushMs);
  }

  /** Writes what is queued now and resolves when every record is written (or dropped). */
  async flush(): Promise<void> {
    for (;;) {
      if (this.#timer !== undefined) {
        clearTimeout(this.#timer);
        this.#timer = undefined;
      }
      if (!this.#running && this.#queue.length > 0) {
        this.#running = this.#writeBatch();
      }
      if (!this.#running) return;
      await this.#running;
    }
  }

  /** Writes one batch (everything queued, up to 5000), then schedules the next. */
  async #writeBatch(): Promise<void> {
    try {
      const batch = this.#queue.splice(0, 5000);
      let ok = false;
      for (let attempt = 0; attempt < 3 && !ok; attempt++) {
        try {
          await writeUsage(this.#store, batch);
          ok = true;
        } catch (e) {
          this.#log.log("warn", "usage write failed", {
            error: String(e),
            attempt,
          });
        }
      }
      if (!ok) this.dropped += batch.length;
      if (Date.now() - this.#lastReclaim >= this.#reclaimEveryMs) {
        this.#lastReclaim = Date.now();
        const n = await reclaimExpired(this.#store).catch(() => 0);
        if (n > 0) {
          this.#log.log("info", "reclaimed expired reservations", { count: n });
        }
      }
    } finally {
      this.#running = null;
      this.#schedule();
    }
  }
}
