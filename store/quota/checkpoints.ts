/**
 * Lease checkpoints (k.reservationUse): what each lease has used, which a
 * reclaim after a crash bills it (see README.md).
 */
import { k } from "../kv_keys.ts";
import type { Store } from "../store.ts";
import type { Lease } from "./lease.ts";
import { MAX_SETTLE_MUTATIONS } from "./settlement.ts";
import type { ReservationUse } from "./types.ts";
import { DAY } from "./windows.ts";

/**
 * How stale a lease's checkpoint may get, and so how much of a key's
 * traffic a crash can leave unbilled: half a second, so that with the
 * commit's latency and a busy event loop it stays within the one second
 * the root README.md promises.
 */
export const CHECKPOINT_MS = 500;

/** The leases whose use changed since their last checkpoint, and their writing. */
export class Checkpoints {
  readonly #store: Store;
  readonly #dirty = new Set<Lease>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #running: Promise<void> | null = null;

  constructor(store: Store) {
    this.#store = store;
  }

  /** Marks a lease's use changed: it is checkpointed within CHECKPOINT_MS. */
  changed(l: Lease): void {
    this.#dirty.add(l);
    if (this.#timer !== undefined) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      // After the one before, if it is still running (one at a time).
      const run = (this.#running ?? Promise.resolve())
        .then(() => this.#write());
      this.#running = run;
      void run.finally(() => {
        if (this.#running === run) this.#running = null;
      });
    }, CHECKPOINT_MS);
    Deno.unrefTimer(this.#timer);
  }

  /** Stops checkpointing a lease: its settlement is queued and bills it exactly. */
  forget(l: Lease): void {
    this.#dirty.delete(l);
  }

  /** Waits for the checkpoint being written; disarms the timer when nothing is left to write. */
  async idle(): Promise<void> {
    await this.#running;
    if (this.#dirty.size === 0) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
    }
  }

  /**
   * Writes what each changed lease has used: its finished requests' tokens
   * plus its in-flight requests' reclaimTokens, and the requests it
   * admitted. Blind sets (a reclaim checks the lease's record, not this),
   * up to MAX_SETTLE_MUTATIONS a commit: a busy key costs two sets a
   * second, 1,000 of them ~16 commits. What fails is written next time.
   */
  async #write(): Promise<void> {
    const leases = [...this.#dirty];
    this.#dirty.clear();
    const now = Date.now();
    for (let i = 0; i < leases.length; i += MAX_SETTLE_MUTATIONS) {
      const part = leases.slice(i, i + MAX_SETTLE_MUTATIONS);
      let ok = false;
      try {
        const op = this.#store.kv.atomic();
        for (const l of part) {
          const use: ReservationUse = {
            tokens: l.tokensUsed + l.reclaimHeld,
            requests: l.admitted,
          };
          op.set(k.reservationUse(l.res.id), use, {
            expireIn: Math.max(0, l.stored.deadline - now) + DAY,
          });
        }
        ok = (await op.commit()).ok;
      } catch { /* KV down: next time */ }
      if (!ok) { for (const l of part) this.changed(l); }
    }
  }
}
