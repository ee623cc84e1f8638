/**
 * Tidying release counters: a `sum` leaves its key without an expiry, so a
 * process deletes the release counters it added to TIDY_AFTER_MS after
 * their window ends, within its settlement commits (a minute's admission
 * counters expire then too, a day's or a month's a day after it). A crash
 * leaves the last minute's behind.
 */

/**
 * How long after its window ends a release counter this process added to
 * is deleted: a `sum` clears a key's expiry, so without this each busy key
 * would leave ~3 rows behind a minute, forever.
 */
export const TIDY_AFTER_MS = 60_000;

/** A release counter deleted by a settlement commit (see Tidier.into). */
export interface Tidy {
  at: number;
  id: string;
  key: Deno.KvKey;
}

/** The release counters this process added to, by when to delete them. */
export class Tidier {
  /** By when to delete them, then by cache id. */
  readonly #due = new Map<number, Map<string, Deno.KvKey>>();

  /** Tracks a release counter whose window ends at `end`, to delete TIDY_AFTER_MS later. */
  afterWindow(id: string, key: Deno.KvKey, end: number): void {
    this.track(end + TIDY_AFTER_MS, id, key);
  }

  /** Tracks a release counter to delete `at`. */
  track(at: number, id: string, key: Deno.KvKey): void {
    let due = this.#due.get(at);
    if (!due) this.#due.set(at, due = new Map());
    due.set(id, key);
  }

  /** Tracks again what a failed commit did not delete. */
  restore(tidied: Tidy[]): void {
    for (const t of tidied) this.track(t.at, t.id, t.key);
  }

  /**
   * Adds to `op` the deletion of up to `room` release counters whose
   * window ended TIDY_AFTER_MS ago; returns them, to be restored if the
   * commit fails. Releases into ended windows are dropped (see Release),
   * so none comes back.
   */
  into(op: Deno.AtomicOperation, room: number, now: number): Tidy[] {
    const out: Tidy[] = [];
    for (const [at, due] of this.#due) {
      if (at > now) continue; // few: one per window
      for (const [id, key] of due) {
        if (out.length >= room) return out;
        op.delete(key);
        out.push({ at, id, key });
        due.delete(id);
      }
      this.#due.delete(at);
    }
    return out;
  }
}
