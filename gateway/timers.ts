/**
 * Coarse timeouts for the request path: one runtime timer ticking every
 * RESOLUTION_MS while any timeout is pending, instead of one runtime timer
 * per timeout. A request arms three or more (connect, first byte, total,
 * and one per streamed chunk), nearly all cancelled long before they fire;
 * Deno's global setTimeout goes through its Node-compatible timers layer
 * (~2 µs per set + clear, plus the runtime's timer heap), here arming and
 * cancelling are two Set operations. Timeouts are bucketed by due time, so
 * a tick only looks at the buckets that came due.
 *
 * Written here: a search for a maintained npm timing-wheel package found
 * none (the matches were Rust, Go and Java libraries), and this needs only
 * ~60 lines. A timeout fires at most RESOLUTION_MS late, never early.
 */

/** Granularity of the timeouts (ms). */
export const RESOLUTION_MS = 10;

/** A pending timeout; pass it to `cancel`. */
export interface Timeout {
  readonly slot: number;
  readonly fn: () => void;
}

const slots = new Map<number, Set<Timeout>>();
let pending = 0;
/** The next slot not yet run. */
let next = 0;
let ticker: ReturnType<typeof setInterval> | undefined;

/** Runs `fn` after `ms` (up to RESOLUTION_MS later). */
export function after(ms: number, fn: () => void): Timeout {
  const due = Math.ceil((performance.now() + Math.max(0, ms)) / RESOLUTION_MS);
  // Never a slot the ticker has passed (it would not be looked at again).
  const slot = pending > 0 ? Math.max(due, next) : due;
  const t: Timeout = { slot, fn };
  let set = slots.get(slot);
  if (!set) {
    set = new Set();
    slots.set(slot, set);
  }
  set.add(t);
  if (pending++ === 0) {
    next = Math.floor(performance.now() / RESOLUTION_MS);
    ticker = setInterval(tick, RESOLUTION_MS);
  }
  return t;
}

/** Cancels a timeout (no-op when it already fired or was cancelled). */
export function cancel(t: Timeout | undefined | null): void {
  if (!t) return;
  const set = slots.get(t.slot);
  if (!set?.delete(t)) return;
  if (set.size === 0) slots.delete(t.slot);
  if (--pending === 0) stop();
}

/** Resolves "timeout" after `ms` unless `p` settles first (then with its value). */
export function race<T>(p: Promise<T>, ms: number): Promise<T | "timeout"> {
  let t: Timeout | undefined;
  const timeout = new Promise<"timeout">((resolve) => {
    t = after(ms, () => resolve("timeout"));
  });
  return Promise.race([p, timeout]).finally(() => cancel(t));
}

function stop(): void {
  clearInterval(ticker);
  ticker = undefined;
}

function tick(): void {
  const now = Math.floor(performance.now() / RESOLUTION_MS);
  for (; next <= now; next++) {
    const set = slots.get(next);
    if (!set) continue;
    // Each leaves the set as it fires, so one cancelled by an earlier one
    // in the same slot does not fire.
    for (const t of set) {
      set.delete(t);
      pending--;
      try {
        t.fn();
      } catch (e) {
        queueMicrotask(() => {
          throw e; // reported like an exception in a runtime timer
        });
      }
    }
    slots.delete(next);
  }
  if (pending === 0) stop();
}
