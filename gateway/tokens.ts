/**
 * Token estimates without a tokenizer. Two figures: an UPPER bound used to
 * reserve quota (a byte-level BPE token is at least one UTF-8 byte, plus
 * template overhead per message), and a typical estimate (≈ 4 bytes per
 * token) used where a count is shown but nothing is guaranteed by it.
 */

/** Per-message template overhead (role markers, separators). */
export const MESSAGE_OVERHEAD = 8;
/** Fixed overhead of a prompt (BOS, assistant header). */
export const PROMPT_OVERHEAD = 16;

/** UTF-8 byte length of a string without encoding it. */
export function utf8Length(s: string): number {
  let n = s.length;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) continue;
    if (c < 0x800) n += 1;
    else if (c >= 0xd800 && c <= 0xdbff) {
      n += 1; // surrogate pair: 2 UTF-16 units → 4 bytes
    } else n += 2;
  }
  return n;
}

/** Sums the UTF-8 length of every string inside a JSON value (bounded depth). */
export function textBytes(v: unknown, depth = 0): number {
  if (typeof v === "string") return utf8Length(v);
  if (depth > 32 || v === null || typeof v !== "object") return 0;
  let n = 0;
  if (Array.isArray(v)) { for (const x of v) n += textBytes(x, depth + 1); }
  else for (const x of Object.values(v)) n += textBytes(x, depth + 1);
  return n;
}

/** A prompt's size as an upper bound in tokens and a typical estimate. */
export interface PromptSize {
  upper: number;
  estimate: number;
}

/** Sizes a prompt from its text bytes and number of messages. */
export function promptSize(bytes: number, messages: number): PromptSize {
  const overhead = PROMPT_OVERHEAD + MESSAGE_OVERHEAD * messages;
  return { upper: bytes + overhead, estimate: Math.ceil(bytes / 4) + overhead };
}
