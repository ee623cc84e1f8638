/**
 * Which KV-cache slot a new sequence gets, so prompts that share a prefix
 * with what a slot already holds skip that part of prefill.
 *
 * Every slot keeps the tokens its last sequence left in the cache (prompt
 * and generated text). A new prompt goes to the free slot with the longest
 * common prefix; without one (or on a tie) to the least recently used slot,
 * whose cache is then overwritten: eviction by recency. When another slot,
 * busy or free, holds a longer prefix (concurrent requests with one system
 * prompt, an agent's parallel calls), the least recently used free slot
 * takes it over: with one unified KV cache the cells are shared between
 * sequences, not copied. At least the prompt's last token is always decoded
 * again, because sampling needs its logits.
 */

/** A slot given to a sequence, and how much of its prompt is already cached. */
export interface SlotGrant {
  slot: number;
  /** Prompt tokens at the start already in the cache (0 … prompt.length - 1). */
  reuse: number;
  /** The slot whose first `reuse` positions the sequence shares, or null for its own. */
  from: number | null;
}

/** What a busy slot's sequence has decoded so far (positions 0 … n-1). */
export interface LiveSlot {
  slot: number;
  tokens: ArrayLike<number>;
}

interface SlotState {
  busy: boolean;
  /** Tokens in the slot's KV cache, from position 0. */
  tokens: Int32Array;
  /** Logical time of the last release, for LRU eviction. */
  usedAt: number;
}

/** Length of the common prefix of two token arrays. */
export function commonPrefix(
  a: ArrayLike<number>,
  b: ArrayLike<number>,
): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

const EMPTY = new Int32Array(0);

/** The slots of one context and what each has cached. */
export class SlotCache {
  readonly #slots: SlotState[];
  #clock = 0;

  constructor(slots: number) {
    if (!(Number.isInteger(slots) && slots >= 1)) {
      throw new RangeError(
        `Cannot create slot cache: slots must be ≥ 1: current value is ${slots}`,
      );
    }
    this.#slots = Array.from(
      { length: slots },
      () => ({ busy: false, tokens: EMPTY, usedAt: 0 }),
    );
  }

  /** Free slots right now. */
  get free(): number {
    return this.#slots.filter((s) => !s.busy).length;
  }

  /**
   * Takes the free slot that reuses most of `prompt` (its own cache, or a
   * prefix shared from a busy slot in `live` or another free slot), or null
   * when all are busy.
   */
  acquire(prompt: Int32Array, live: LiveSlot[] = []): SlotGrant | null {
    const cap = Math.max(0, prompt.length - 1);
    let own = -1;
    let ownReuse = -1;
    let lru = -1;
    let donor: number | null = null;
    let donorReuse = 0;
    for (let i = 0; i < this.#slots.length; i++) {
      const s = this.#slots[i]!;
      if (s.busy) continue;
      const reuse = Math.min(commonPrefix(s.tokens, prompt), cap);
      const older = (j: number) => s.usedAt < this.#slots[j]!.usedAt;
      if (reuse > ownReuse || (reuse === ownReuse && older(own))) {
        own = i;
        ownReuse = reuse;
      }
      if (lru < 0 || older(lru)) lru = i;
      if (reuse > donorReuse) [donor, donorReuse] = [i, reuse];
    }
    if (own < 0) return null;
    for (const l of live) {
      const reuse = Math.min(commonPrefix(l.tokens, prompt), cap);
      if (reuse > donorReuse) [donor, donorReuse] = [l.slot, reuse];
    }
    const shared = donor !== null && donor !== own && donorReuse > ownReuse;
    const slot = shared ? (lru === donor ? own : lru) : own;
    const s = this.#slots[slot]!;
    s.busy = true;
    s.tokens = EMPTY;
    return shared
      ? { slot, reuse: donorReuse, from: donor }
      : { slot, reuse: ownReuse, from: null };
  }

  /** Gives a slot back with the tokens its cache now holds (from position 0). */
  release(slot: number, cached: Int32Array) {
    const s = this.#slots[slot];
    if (!s) throw new RangeError(`Cannot release slot ${slot}: no such slot`);
    s.busy = false;
    s.tokens = cached;
    s.usedAt = ++this.#clock;
  }

  /** Slots that are free but hold cached tokens (cleared first when the cache is full). */
  idleCached(): number[] {
    return this.#slots.flatMap((s, i) =>
      !s.busy && s.tokens.length > 0 ? [i] : []
    );
  }

  /** Forgets what a free slot holds (after its cells were cleared). */
  forget(slot: number) {
    const s = this.#slots[slot];
    if (s && !s.busy) s.tokens = EMPTY;
  }
}
