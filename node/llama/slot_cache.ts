/**
 * Which KV-cache slot a new sequence gets, so prompts that share a prefix
 * with what a slot already holds skip that part of prefill.
 *
 * Every slot keeps the tokens its last sequence left in the cache (prompt
 * and generated text). A new prompt may reuse a free slot's own cache in
 * place (what follows the common prefix is dropped), or take over a free
 * slot and share the longest prefix any slot holds, busy or free (with
 * one unified KV cache the cells are shared between sequences, not
 * copied). Each choice is scored by what it saves against what it
 * destroys:
 *
 *     score = prompt tokens reused − cached tokens lost
 *
 * where the tokens lost are what the slot held beyond the reused prefix
 * (all it held, when it takes a prefix from another slot), less a tail
 * of LOST_FREE tokens not worth keeping (the end of an answer that the
 * next turn re-renders differently). With a host-memory prefix cache
 * (prefix_store.ts), a cache saved before it is overwritten is not lost
 * but copied, and a saved prefix can be restored into a slot: each copied
 * token counts COPY_COST of a prefilled one. The best score wins; on a tie, the
 * slot's own cache in place, then the least recently used slot. So a
 * request with a different first line never lands on the slot holding
 * another conversation's long prefix while an empty or cheaper slot is
 * free. At least the prompt's last token is always decoded again,
 * because sampling needs its logits.
 */

/** A slot given to a sequence, and how much of its prompt is already cached. */
export interface SlotGrant {
  slot: number;
  /** Prompt tokens at the start already in the cache (0 … prompt.length - 1). */
  reuse: number;
  /** The slot whose first `reuse` positions the sequence shares, or null for its own. */
  from: number | null;
  /** Present when the prefix comes from host memory (prefix_store.ts): restore it into the slot first. */
  restore?: true;
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

/** Cached tokens a choice may drop at no cost (see the module comment). */
export const LOST_FREE = 32;
/**
 * What a token copied to or from host memory costs, in prefilled tokens:
 * an estimate, not a measurement (a 7B model's 57 KB of KV per token copies
 * in ~10 µs; prefilling a token takes ~1 ms on a laptop GPU, more on a CPU).
 */
export const COPY_COST = 1 / 64;

/** The host-memory prefix cache as slot choice sees it (prefix_store.ts). */
export interface HostPrefixes {
  /** Prompt tokens a saved prefix would give back (0: none). */
  restorable: number;
  /** Whether a slot's cache, about to lose `lost` tokens, would be saved first. */
  savable(held: Int32Array, lost: number): boolean;
}

const NO_HOST: HostPrefixes = { restorable: 0, savable: () => false };

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
   * prefix shared from a busy slot in `live` or another free slot, or
   * a prefix saved in host memory), or null when all are busy.
   */
  acquire(
    prompt: Int32Array,
    live: LiveSlot[] = [],
    host: HostPrefixes = NO_HOST,
  ): SlotGrant | null {
    const cap = Math.max(0, prompt.length - 1);
    const free: { i: number; own: number }[] = [];
    let donor: number | null = null;
    let donorReuse = 0;
    for (let i = 0; i < this.#slots.length; i++) {
      const s = this.#slots[i]!;
      if (s.busy) continue;
      const own = Math.min(commonPrefix(s.tokens, prompt), cap);
      free.push({ i, own });
      if (own > donorReuse) [donor, donorReuse] = [i, own];
    }
    if (free.length === 0) return null;
    for (const l of live) {
      const reuse = Math.min(commonPrefix(l.tokens, prompt), cap);
      if (reuse > donorReuse) [donor, donorReuse] = [l.slot, reuse];
    }
    let best: SlotGrant | null = null;
    let bestScore = -Infinity;
    const consider = (g: SlotGrant, held: Int32Array, lost: number) => {
      // a cache saved before it is overwritten is not lost: it costs a copy
      let cost = lost <= LOST_FREE
        ? 0
        : host.savable(held, lost)
        ? COPY_COST * held.length
        : lost - LOST_FREE;
      if (g.restore) cost += COPY_COST * g.reuse;
      const score = g.reuse - cost;
      const b = best;
      const inPlace = (x: SlotGrant) => x.from === null && !x.restore;
      const better = b === null || score > bestScore ||
        (score === bestScore && (
          (inPlace(g) && !inPlace(b)) ||
          (inPlace(g) === inPlace(b) &&
            this.#slots[g.slot]!.usedAt < this.#slots[b.slot]!.usedAt)
        ));
      if (better) [best, bestScore] = [g, score];
    };
    for (const { i, own } of free) {
      const held = this.#slots[i]!.tokens;
      consider({ slot: i, reuse: own, from: null }, held, held.length - own);
      if (donor !== null && donor !== i && donorReuse > own) {
        consider(
          { slot: i, reuse: donorReuse, from: donor },
          held,
          held.length,
        );
      }
      if (host.restorable > Math.max(own, donorReuse)) {
        consider(
          { slot: i, reuse: host.restorable, from: null, restore: true },
          held,
          held.length,
        );
      }
    }
    const grant = best!;
    const s = this.#slots[grant.slot]!;
    s.busy = true;
    s.tokens = EMPTY;
    return grant;
  }

  /** What each slot holds now (busy: null), for tests and the host cache. */
  cached(slot: number): Int32Array | null {
    const s = this.#slots[slot];
    return s && !s.busy ? s.tokens : null;
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
