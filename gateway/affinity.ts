/**
 * Prefix affinity: a number that stays the same for every request of one
 * conversation (its opening: the system prompt and first user message,
 * or a completion prompt's start), so the router can send them to the
 * node that already holds that prefix in its KV cache (the llama engine
 * keeps each slot's cache, and llama-server, vLLM and MLX cache prefixes
 * too). Different conversations get different numbers and spread over the
 * nodes. Only the first OPENING_CHARS characters count: hashing them is a
 * few microseconds whatever the prompt's length.
 *
 * A client's `prompt_cache_key` (OpenAI's field, on chat and Responses;
 * Codex CLI sends its session id) takes precedence: the client names the
 * conversation itself, so its turns stay on one node even when their
 * openings differ (a system prompt that changes, compacted history).
 */

/** Characters of a conversation's opening that decide its affinity. */
const OPENING_CHARS = 2048;

/** FNV-1a over the UTF-16 code units of `s` (up to `max` of them), continuing from `h`. */
function fnv(s: string, h: number, max: number): number {
  const n = Math.min(s.length, max);
  for (let i = 0; i < n; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** The text of a message's content (string, or text parts), as hashed. */
function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  let out = "";
  for (const part of content) {
    if (part && typeof part === "object") {
      const t = (part as { text?: unknown }).text;
      if (typeof t === "string") out += t;
    }
    if (out.length >= OPENING_CHARS) break;
  }
  return out;
}

/**
 * The affinity of a chat (`messages`, OpenAI or Anthropic with `system`)
 * or completion (`prompt`) body, or of its `prompt_cache_key` when it has
 * one; null when it has nothing to go by.
 */
export function affinityOf(body: Record<string, unknown>): number | null {
  let h = typeof body.model === "string"
    ? fnv(body.model, 0x811c9dc5, 256)
    : 0x811c9dc5;
  const key = body.prompt_cache_key;
  if (typeof key === "string" && key.length > 0) {
    // "\0" keeps a key's numbers apart from an opening of the same text
    return fnv(key, fnv("\0key", h, 4), 1024);
  }
  let left = OPENING_CHARS;
  const add = (s: string) => {
    if (left <= 0 || s.length === 0) return;
    h = fnv(s, h, left);
    left -= s.length;
  };
  const system = body.system; // Anthropic Messages
  if (system !== undefined) add(contentText(system));
  if (Array.isArray(body.messages)) {
    // System messages and the first user message: what every turn shares.
    for (const m of body.messages) {
      if (!m || typeof m !== "object") return null;
      const { role, content } = m as { role?: unknown; content?: unknown };
      add(contentText(content));
      add(String(role));
      if (role === "user" || left <= 0) break;
    }
  } else if (typeof body.prompt === "string") add(body.prompt);
  return left === OPENING_CHARS ? null : h;
}

/** A node id's hash, mixed with an affinity: the rendezvous score of that node for it. */
export function rendezvous(affinity: number, nodeHash: number): number {
  let x = (affinity ^ nodeHash) >>> 0;
  // murmur3's finaliser: every bit of both inputs moves the score.
  x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
  x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}

/** The hash of a node id (for `rendezvous`). */
export function nodeHash(id: string): number {
  return fnv(id, 0x811c9dc5, id.length);
}
