/**
 * Coarse timeouts for the request path: one runtime timer, armed for the
 * earliest pending timeout, instead of one runtime timer per timeout. A
 * request arms three or more (connect, first byte, total, and one per
 * streamed chunk), nearly all cancelled long before they fire; Deno's
 * global setTimeout goes through its Node-compatible timers layer (~2 µs
 * per set + clear, plus the runtime's timer heap), here arming and
 * cancelling are two Set operations. Cancelling leaves the runtime timer
 * armed: when it fires it finds its timeouts gone and arms itself for the
 * earliest still pending, so a busy gateway touches the runtime timer about
 * once per connect timeout, not twice per request. It keeps the process
 * alive only while a timeout is pending (ref'd then, unref'd when none is:
 * ~0.05 µs each).
 *
 * Written here: a search for a maintained npm timing-wheel package found
 * none (the matches were Rust, Go and Java libraries), and this needs only
 * ~70 lines. A timeout fires at most RESOLUTION_MS late, never early.
 */

/** Granularity of the timeouts (ms). */
export const RESOLUTION_MS = 10;

/** A pending timeout; pass it to `cancel`. */
export interface Timeout {
  readonly slot: number;
  readonly fn: () => void;
}

/** Pending timeouts by slot (due time / RESOLUTION_MS, rounded up). */
const slots = new Map<number, Set<Timeout>>();
/** The slot the runtime timer is armed for (Infinity: none). */
let armed = Infinity;
let timer: ReturnType<typeof setTimeout> | undefined;
let pending = 0;

/** Runs `fn` after `ms` (up to RESOLUTION_MS later). */
export function after(ms: number, fn: () => void): Timeout {
  const slot = Math.ceil(
    (performance.now() + Math.max(0, ms)) / RESOLUTION_MS,
  );
  const t: Timeout = { slot, fn };
  let set = slots.get(slot);
  if (!set) {
    set = new Set();
    slots.set(slot, set);
  }
  set.add(t);
  if (slot < armed) arm(slot);
  else if (pending === 0) Deno.refTimer(timerId(timer!)); // armed: slot ≥ armed
  pending++;
  return t;
}

/** Cancels a timeout (no-op when it already fired or was cancelled). */
export function cancel(t: Timeout | undefined | null): void {
  if (!t) return;
  const set = slots.get(t.slot);
  if (!set?.delete(t)) return;
  if (set.size === 0) slots.delete(t.slot);
  // (No timer while the one that fired runs its timeouts.)
  if (--pending === 0 && timer !== undefined) Deno.unrefTimer(timerId(timer));
}

/**
 * Resolves "timeout" after `ms` unless `p` settles first (then with its
 * value). One promise and two reactions: Promise.race plus .finally made
 * four promises and their closures per call, twice a request.
 */
export function race<T>(p: Promise<T>, ms: number): Promise<T | "timeout"> {
  return new Promise<T | "timeout">((resolve, reject) => {
    const t = after(ms, () => resolve("timeout"));
    p.then((v) => {
      cancel(t);
      resolve(v);
    }, (e) => {
      cancel(t);
      reject(e);
    });
  });
}

function arm(slot: number): void {
  clearTimeout(timer);
  armed = slot;
  timer = setTimeout(
    fire,
    Math.max(0, slot * RESOLUTION_MS - performance.now()),
  );
}

/** Deno's timer functions take the Node-compatible Timeout object too. */
const timerId = (t: ReturnType<typeof setTimeout>) => t as unknown as number;

/** Runs every timeout come due, in due order, then arms for the next. */
function fire(): void {
  timer = undefined;
  armed = Infinity;
  const now = performance.now() / RESOLUTION_MS;
  const due: number[] = [];
  let next = Infinity;
  for (const slot of slots.keys()) {
    if (slot <= now) due.push(slot);
    else if (slot < next) next = slot;
  }
  due.sort((a, b) => a - b);
  for (const slot of due) {
    const set = slots.get(slot);
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
    slots.delete(slot);
  }
  // A timeout armed by one that fired is already armed for (slot < armed).
  if (next < armed) arm(next);
  else if (pending === 0 && timer !== undefined) {
    Deno.unrefTimer(timerId(timer));
  }
}
