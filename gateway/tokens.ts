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

/** Any UTF-16 unit outside ASCII. */
const NON_ASCII = /[\u0080-\uffff]/;

/**
 * UTF-8 byte length of a string without encoding it. The ASCII prefix is
 * skipped with a native search (prompts are mostly ASCII: ~4× faster than
 * looking at every character).
 */
export function utf8Length(s: string): number {
  const first = s.search(NON_ASCII);
  if (first < 0) return s.length;
  let n = s.length;
  for (let i = first; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) continue;
    if (c < 0x800) n += 1;
    else if (c <= 0xdbff && c >= 0xd800) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        n += 2; // a surrogate pair: 2 units → 4 bytes
        i++;
      } else n += 2; // lone: encoded as U+FFFD, 3 bytes
    } else n += 2; // 3 bytes (a lone low surrogate too)
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
  /** Text bytes of the messages (and tools). */
  bytes: number;
  messages: number;
  /** JSON length of the offered tools (0 without tools). */
  toolsJson: number;
}

/** Sizes a prompt from its text bytes and number of messages. */
export function promptSize(
  bytes: number,
  messages: number,
  toolsJson = 0,
): PromptSize {
  const overhead = PROMPT_OVERHEAD + MESSAGE_OVERHEAD * messages;
  return {
    upper: bytes + overhead,
    estimate: Math.ceil(bytes / 4) + overhead,
    bytes,
    messages,
    toolsJson,
  };
}

/** What a model's template adds, as its node reports it (see protocol/engine.ts). */
export interface TemplateOverhead {
  fixed: number;
  perMessage: number;
  tools: number;
}

/**
 * The prompt's upper bound in tokens for a model whose template overhead is
 * known: the generic bound or the model's, whichever is larger.
 */
export function promptUpper(p: PromptSize, o: TemplateOverhead | null): number {
  if (!o) return p.upper;
  const tools = p.toolsJson > 0 ? o.tools + 2 * p.toolsJson : 0;
  return Math.max(
    p.upper,
    p.bytes + o.fixed + o.perMessage * p.messages + tools,
  );
}
