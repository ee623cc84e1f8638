/**
 * Which KV-cache slot a new sequence gets, so prompts that share a prefix
 * with what a slot already holds skip that part of prefill.
 *
 * Every slot keeps the tokens its last sequence left in the cache (prompt
 * and generated text). A new prompt goes to the free slot with the longest
 * common prefix; without one (or on a tie) to the least recently used slot,
 * whose cache is then overwritten: eviction by recency. At least the
 * prompt's last token is always decoded again, because sampling needs its
 * logits.
 */

/** A slot given to a sequence, and how much of its prompt is already cached. */
export interface SlotGrant {
  slot: number;
  /** Prompt tokens at the start already in the slot's cache (0 … prompt.length - 1). */
  reuse: number;
}

interface SlotState {
  busy: boolean;
  /** Tokens in the slot's KV cache, from position 0. */
  tokens: Int32Array;
  /** Logical time of the last release, for LRU eviction. */
  usedAt: number;
}

/** Length of the common prefix of two token arrays. */
export function commonPrefix(a: Int32Array, b: Int32Array): number {
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

  /** Takes the free slot that reuses most of `prompt`, or null when all are busy. */
  acquire(prompt: Int32Array): SlotGrant | null {
    let best = -1;
    let bestReuse = -1;
    for (let i = 0; i < this.#slots.length; i++) {
      const s = this.#slots[i]!;
      if (s.busy) continue;
      const reuse = Math.min(
        commonPrefix(s.tokens, prompt),
        Math.max(0, prompt.length - 1),
      );
      if (
        reuse > bestReuse ||
        (reuse === bestReuse && s.usedAt < this.#slots[best]!.usedAt)
      ) {
        best = i;
        bestReuse = reuse;
      }
    }
    if (best < 0) return null;
    const s = this.#slots[best]!;
    s.busy = true;
    s.tokens = EMPTY;
    return { slot: best, reuse: bestReuse };
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
