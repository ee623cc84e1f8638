/**
 * Keeps grammar-constrained output valid UTF-8, token by token.
 *
 * llama.cpp's grammar decodes the bytes a token adds leniently: an overlong
 * form (0xC1 0xA5 for "e"), a surrogate or a stray continuation byte counts
 * as the character it spells, so the grammar accepts it, while a strict
 * decoder (JSON.parse after TextDecoder) sees U+FFFD: an enum value no
 * longer matches, a string grows past `maxLength`. Before each sample of a
 * constrained sequence the guard lists the tokens that would make the
 * output invalid UTF-8 from where it stands, and the sampler never sees them.
 */

/** Where a UTF-8 byte stream stands: continuation bytes still due, and the range the next one must be in. */
export interface Utf8State {
  need: number;
  lo: number;
  hi: number;
}

/** At a character boundary. */
export const START: Utf8State = { need: 0, lo: 0x80, hi: 0xbf };

/** The state after `bytes`, or null when they make the stream invalid. */
export function advance(st: Utf8State, bytes: Uint8Array): Utf8State | null {
  let { need, lo, hi } = st;
  for (const b of bytes) {
    if (need > 0) {
      if (b < lo || b > hi) return null;
      need--;
      lo = 0x80;
      hi = 0xbf;
      continue;
    }
    if (b < 0x80) continue;
    if (b >= 0xc2 && b <= 0xdf) need = 1;
    else if (b === 0xe0) [need, lo] = [2, 0xa0]; // no overlong 3-byte forms
    else if (b === 0xed) [need, hi] = [2, 0x9f]; // no surrogates
    else if (b >= 0xe1 && b <= 0xef) need = 2;
    else if (b === 0xf0) [need, lo] = [3, 0x90]; // no overlong 4-byte forms
    else if (b === 0xf4) [need, hi] = [3, 0x8f]; // nothing past U+10FFFF
    else if (b >= 0xf1 && b <= 0xf3) need = 3;
    else return null; // a continuation byte, 0xC0, 0xC1 or 0xF5–0xFF
  }
  return { need, lo, hi };
}

/** Per-vocabulary tables for the guard. */
export class Utf8Guard {
  /** Tokens that cannot follow a character boundary. */
  readonly badAtStart: Int32Array;
  /** Tokens that begin with a continuation byte (the only ones that can follow a partial character). */
  readonly continuing: Int32Array;

  constructor(readonly pieces: Uint8Array[]) {
    const bad: number[] = [];
    const cont: number[] = [];
    pieces.forEach((p, t) => {
      if (p.length && advance(START, p) === null) bad.push(t);
      if (p.length && p[0]! >= 0x80 && p[0]! <= 0xbf) cont.push(t);
    });
    this.badAtStart = Int32Array.from(bad);
    this.continuing = Int32Array.from(cont);
  }

  /**
   * Sets to -∞ the logits of every token that would make the output invalid
   * from `st` on (token bytes of length 0, control tokens, stay allowed).
   */
  mask(logits: Float32Array, st: Utf8State) {
    if (st.need === 0) {
      for (const t of this.badAtStart) logits[t] = -Infinity;
      return;
    }
    const keep: [number, number][] = [];
    for (const t of this.continuing) {
      if (advance(st, this.pieces[t]!) !== null) keep.push([t, logits[t]!]);
    }
    if (!keep.length) return; // nothing could complete it: leave the choice to the sampler
    logits.fill(-Infinity);
    for (const [t, v] of keep) logits[t] = v;
  }
}
