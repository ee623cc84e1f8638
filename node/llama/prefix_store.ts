/**
 * KV-cache prefixes kept in host memory after their slot was given to
 * another prompt, so an agent that comes back after others used every
 * slot gets its prefix back instead of prefilling it again.
 *
 * The child process saves a slot's sequence (`llama_state_seq_get_data`)
 * just before its cells are overwritten, when what would be lost is worth
 * it (SAVE_MIN tokens), and restores one (`llama_state_seq_set_data`)
 * into the slot it chose when a new prompt's best match is a saved
 * prefix. This store only decides what is kept: entries are the saved
 * tokens with their state bytes, bounded by a byte budget, least recently
 * used out first; an entry that is a prefix of a newer one is dropped.
 */
import { commonPrefix } from "./slot_cache.ts";

/** Fewest cached tokens a slot must be about to lose for them to be saved. */
export const SAVE_MIN = 256;

/** A saved sequence. */
export interface SavedPrefix {
  /** Tokens at positions 0 … n-1. */
  readonly tokens: Int32Array;
  /** `llama_state_seq_get_data`'s bytes for them. */
  readonly state: Uint8Array;
  usedAt: number;
}

/** A bounded LRU of saved sequences. */
export class PrefixStore {
  readonly budget: number;
  #entries: SavedPrefix[] = [];
  #bytes = 0;
  #clock = 0;

  constructor(budgetBytes: number) {
    if (!(Number.isSafeInteger(budgetBytes) && budgetBytes >= 0)) {
      throw new RangeError(
        `Cannot create prefix store: budgetBytes must be an integer ≥ 0: current value is ${budgetBytes}`,
      );
    }
    this.budget = budgetBytes;
  }

  /** Bytes held. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Entries held. */
  get size(): number {
    return this.#entries.length;
  }

  /**
   * Whether saving `tokens` (of `stateBytes`) would be worth it: enough
   * of them, within the budget, and not already held by an entry.
   */
  wants(tokens: Int32Array, stateBytes = 0): boolean {
    if (
      this.budget === 0 || tokens.length < SAVE_MIN || stateBytes > this.budget
    ) return false;
    return !this.#entries.some((e) =>
      e.tokens.length >= tokens.length &&
      commonPrefix(e.tokens, tokens) === tokens.length
    );
  }

  /** Keeps a saved sequence, dropping the least recently used to fit; false when it cannot fit. */
  put(tokens: Int32Array, state: Uint8Array): boolean {
    if (state.length > this.budget || !this.wants(tokens)) return false;
    // an entry this one extends is redundant now
    this.#entries = this.#entries.filter((e) => {
      const covered = e.tokens.length <= tokens.length &&
        commonPrefix(e.tokens, tokens) === e.tokens.length;
      if (covered) this.#bytes -= e.state.length;
      return !covered;
    });
    while (this.#bytes + state.length > this.budget && this.#entries.length) {
      let lru = 0;
      for (let i = 1; i < this.#entries.length; i++) {
        if (this.#entries[i]!.usedAt < this.#entries[lru]!.usedAt) lru = i;
      }
      this.#bytes -= this.#entries[lru]!.state.length;
      this.#entries.splice(lru, 1);
    }
    this.#entries.push({ tokens, state, usedAt: ++this.#clock });
    this.#bytes += state.length;
    return true;
  }

  /**
   * The entry sharing the longest prefix with `prompt` (at most `cap`
   * tokens of it count), marked used; null when none shares any.
   */
  best(
    prompt: ArrayLike<number>,
    cap: number,
  ): { entry: SavedPrefix; reuse: number } | null {
    let best: SavedPrefix | null = null;
    let reuse = 0;
    for (const e of this.#entries) {
      const n = Math.min(commonPrefix(e.tokens, prompt), cap);
      if (n > reuse) [best, reuse] = [e, n];
    }
    if (!best) return null;
    best.usedAt = ++this.#clock;
    return { entry: best, reuse };
  }
}
