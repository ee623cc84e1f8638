/**
 * Writes usage records off the client's critical path: records are queued
 * and one background loop commits whatever accumulated since its last
 * commit (so batches grow with load), and reclaims expired reservations of
 * crashed gateways every `reclaimEveryMs`. `close()` drains the queue.
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
  /** Records dropped because KV failed repeatedly or the queue overflowed. */
  dropped = 0;

  constructor(
    store: Store,
    log: Logger,
    opts: { maxQueue?: number; reclaimEveryMs?: number } = {},
  ) {
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
    this.#running ??= this.#loop();
  }

  /** Resolves when every queued record has been written (or dropped). */
  async flush(): Promise<void> {
    while (this.#running) await this.#running;
  }

  async #loop(): Promise<void> {
    try {
      while (this.#queue.length > 0) {
        const batch = this.#queue.splice(0, 2000);
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
            this.#log.log("info", "reclaimed expired reservations", {
              count: n,
            });
          }
        }
      }
    } finally {
      this.#running = null;
    }
  }
}
