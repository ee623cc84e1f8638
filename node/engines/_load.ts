/**
 * Load bookkeeping shared by engines: a slot limiter with a bounded wait
 * queue (503 + retry-after when full), and a tokens-per-second meter.
 */
import { OpenAIError } from "../../protocol/openai/errors.ts";

/** Concurrency limiter: `slots` at once, at most `maxQueue` waiting. */
export class SlotLimiter {
  #busy = 0;
  #waiters: (() => void)[] = [];
  #slots: number;
  #maxQueue: number;

  constructor(slots: number, maxQueue: number) {
    if (!(slots >= 1) || !(maxQueue >= 0)) {
      throw new RangeError(
        `Cannot create limiter: slots must be ≥ 1 and maxQueue ≥ 0: current values are ${slots}, ${maxQueue}`,
      );
    }
    this.#slots = slots;
    this.#maxQueue = maxQueue;
  }

  /** Concurrent requests allowed. */
  get slots(): number {
    return this.#slots;
  }

  /** Requests that may wait for a slot. */
  get maxQueue(): number {
    return this.#maxQueue;
  }

  /** Changes the slot count (and queue bound); waiters get the slots it adds. */
  resize(slots: number, maxQueue: number): void {
    if (!(slots >= 1) || !(maxQueue >= 0)) {
      throw new RangeError(
        `Cannot resize limiter: slots must be ≥ 1 and maxQueue ≥ 0: current values are ${slots}, ${maxQueue}`,
      );
    }
    this.#slots = slots;
    this.#maxQueue = maxQueue;
    while (this.#busy < this.#slots && this.#waiters.length > 0) {
      this.#busy++;
      this.#waiters.shift()!();
    }
  }

  /** Requests generating now. */
  get inFlight(): number {
    return this.#busy;
  }

  /** Requests waiting for a slot. */
  get queued(): number {
    return this.#waiters.length;
  }

  /** Waits for a slot; returns its release function (idempotent). */
  async acquire(signal: AbortSignal): Promise<() => void> {
    if (this.#busy >= this.#slots) {
      if (this.#waiters.length >= this.#maxQueue) {
        throw new OpenAIError(503, "server_busy", "All slots are busy", {
          headers: { "retry-after": "1" },
        });
      }
      await new Promise<void>((resolve, reject) => {
        const wake = () => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        };
        const onAbort = () => {
          this.#waiters = this.#waiters.filter((w) => w !== wake);
          reject(signal.reason);
        };
        signal.addEventListener("abort", onAbort, { once: true });
        this.#waiters.push(wake);
      });
    } else this.#busy++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.#busy <= this.#slots
        ? this.#waiters.shift()
        : undefined;
      if (next) next(); // the slot passes straight to the next waiter
      else this.#busy--;
    };
  }
}

/** Tokens generated per second over a sliding window. */
export class TokenMeter {
  #events: { at: number; n: number }[] = [];
  readonly windowMs: number;

  constructor(windowMs = 10_000) {
    this.windowMs = windowMs;
  }

  /** Records `n` tokens generated now. */
  add(n: number): void {
    if (n <= 0) return;
    const now = Date.now();
    this.#events.push({ at: now, n });
    this.#trim(now);
  }

  /** Tokens per second over the window. */
  rate(): number {
    const now = Date.now();
    this.#trim(now);
    let sum = 0;
    for (const e of this.#events) sum += e.n;
    return Math.round((sum / (this.windowMs / 1000)) * 10) / 10;
  }

  #trim(now: number) {
    while (this.#events.length && now - this.#events[0]!.at > this.windowMs) {
      this.#events.shift();
    }
  }
}
