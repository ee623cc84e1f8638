/** Request rates per plan: how leases are sized and when their successors start. */

/**
 * The shortest time a young key's pace is measured over (see
 * RateMeter.expected): two requests in a burst make a lease of
 * 2 × leaseMs / 10 s (12 a minute), not 2 × leaseMs / their few ms apart.
 */
const YOUNG_RATE_MS = 10_000;

/** Counts each plan's admission attempts over periods of `leaseMs`. */
export class RateMeter {
  readonly #leaseMs: number;
  readonly #rates = new Map<
    string,
    { count: number; since: number; last: number }
  >();

  constructor(leaseMs: number) {
    this.#leaseMs = leaseMs;
  }

  /** Counts an admission attempt of a plan (for lease sizing). */
  count(pk: string, now: number): void {
    const span = this.#leaseMs;
    if (span <= 0) return; // leases off
    let r = this.#rates.get(pk);
    if (!r) {
      if (this.#rates.size >= 100_000) this.#rates.clear();
      r = { count: 0, since: now, last: 0 };
      this.#rates.set(pk, r);
    } else if (now - r.since >= span) {
      // A new period; the one before counts only if it just ended.
      r.last = now - r.since < 2 * span ? r.count : 0;
      r.count = 0;
      r.since = now - ((now - r.since) % span);
    }
    r.count++;
  }

  /**
   * Requests a plan is expected to make in the next `leaseMs`: its count
   * over the last `leaseMs` (the current period plus the part of the one
   * before that it still covers), so a key making one request a second
   * gets a lease of sixty, and a key seen once none. A key seen for less
   * than `leaseMs` (new, or back after an idle period) has its count so
   * far scaled up to `leaseMs`, over at least YOUNG_RATE_MS: its first
   * lease is then sized for its pace, not for the few requests it has made
   * yet (after a restart, 1,000 keys at one request every two seconds took
   * ~30 s of small leases, each a grant and a settlement, to get there).
   */
  expected(pk: string, now: number): number {
    const r = this.#rates.get(pk);
    if (!r) return 0;
    const seen = now - r.since;
    if (r.last === 0 && r.count >= 2) {
      return r.count * this.#leaseMs /
        Math.min(this.#leaseMs, Math.max(YOUNG_RATE_MS, seen));
    }
    const into = Math.min(1, seen / this.#leaseMs);
    return r.count + r.last * (1 - into);
  }

  /**
   * A plan's requests a ms: over the last `leaseMs`, or, seen for less
   * time, over the time it was seen (a second at least).
   */
  perMs(pk: string, now: number): number {
    const r = this.#rates.get(pk);
    if (!r) return 0;
    if (r.last > 0) return this.expected(pk, now) / this.#leaseMs;
    return r.count / Math.max(1000, now - r.since);
  }
}
