/**
 * Normalises untrusted node output into exact OpenAI shapes: stream chunks
 * (`chat.completion.chunk` / `text_completion`), final responses, and the
 * usage they report. A chunk that needs no change is forwarded as the node
 * sent it (no re-serialisation); malformed frames are refused.
 */
import { OpenAIError } from "../protocol/openai/errors.ts";
import {
  normaliseToolCalls,
  ToolCallDeltas,
  toolFinishReason,
} from "../protocol/openai/tool_calls.ts";
import { utf8Length } from "./tokens.ts";

/**
 * How usage was made when the engine reported none: "counted" by the node
 * with the model's tokenizer, or "estimated" (by the node without one, or
 * here when the node's usage never came). Said to the client in an
 * `x-orchard-usage` header (non-stream) and the usage object's
 * `orchard_usage`, and kept in the usage record.
 */
export type UsageBasis = "counted" | "estimated";

/** Usage as reported by a node (validated). */
export interface ReportedUsage {
  prompt: number;
  completion: number;
  /** Prompt tokens the engine reused from its prefix cache (when it says). */
  cached?: number;
  /** Set when the node made the figures itself (its `orchard_usage`). */
  basis?: UsageBasis;
}

const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);

const count = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 0;

/** Reads a `usage` object; null when absent or malformed. */
export function readUsage(u: unknown): ReportedUsage | null {
  if (!isObj(u) || !count(u.prompt_tokens) || !count(u.completion_tokens)) {
    return null;
  }
  const details = u.prompt_tokens_details;
  const cached = isObj(details) && count(details.cached_tokens)
    ? Math.min(details.cached_tokens as number, u.prompt_tokens as number)
    : undefined;
  const basis = u.orchard_usage === "counted" || u.orchard_usage === "estimated"
    ? u.orchard_usage
    : undefined;
  return {
    prompt: u.prompt_tokens as number,
    completion: u.completion_tokens as number,
    ...(cached === undefined ? {} : { cached }),
    ...(basis === undefined ? {} : { basis }),
  };
}

/**
 * OpenAI's usage object for billed figures (with the cached share when
 * known, and `orchard_usage` when the engine did not report them).
 */
export function usageObject(
  prompt: number,
  completion: number,
  cached: number | null,
  basis: UsageBasis | null = null,
): Record<string, unknown> {
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    ...(cached === null
      ? {}
      : { prompt_tokens_details: { cached_tokens: Math.min(cached, prompt) } }),
    ...(basis === null ? {} : { orchard_usage: basis }),
  };
}

/** The terminal error to send when a node's frame is unusable. */
export function malformed(what: string): OpenAIError {
  return new OpenAIError(
    502,
    "upstream_error",
    `The node sent a malformed ${what}`,
    { type: "server_error" },
  );
}

/** Turns a node's `{"error":…}` frame into a sanitised OpenAIError. */
export function nodeFrameError(e: unknown): OpenAIError {
  const o = isObj(e) ? e : {};
  const message = typeof o.message === "string"
    ? o.message.slice(0, 1000)
    : "The node failed while generating";
  const code = typeof o.code === "string" || typeof o.code === "number"
    ? String(o.code).slice(0, 100)
    : "upstream_error";
  return new OpenAIError(502, code, message, { type: "server_error" });
}

/** UTF-8 bytes of a tool call's name and arguments. */
/**
 * Bytes a tool call's framing takes that the engine generates but the
 * client never sees (Hermes' `<tool_call>\n{"name": …, "arguments": …}\n
 * </tool_call>` is ~50; Mistral's `[TOOL_CALLS]` and Llama 3's
 * `<|python_tag|>` less): counted with each call, so billing by min(reported,
 * counted) does not cut the tokens a tool call really cost (one cut at 600
 * tokens was billed 242), while a node still cannot claim more than 64
 * tokens a call beyond what it delivered.
 */
const TOOL_CALL_FRAMING_BYTES = 64;

/** Delivered bytes of a tool call (delta): its name and arguments, and its framing when it starts a call. */
function toolCallBytes(tc: Record<string, unknown>): number {
  const fn = tc.function as { name?: unknown; arguments?: unknown };
  return (typeof fn.name === "string"
    ? utf8Length(fn.name) + TOOL_CALL_FRAMING_BYTES
    : 0) +
    (typeof fn.arguments === "string" ? utf8Length(fn.arguments) : 0);
}

let seq = 0;
/** A fresh id with a prefix (`chatcmpl-`, `cmpl-`, `msg_`, `toolu_`). */
export function openAIId(prefix: string): string {
  return `${prefix}${Date.now().toString(36)}${(seq++).toString(36)}${
    Math.random().toString(36).slice(2, 10)
  }`;
}

/** Normalises the chunks of one stream and counts what was delivered. */
export class ChunkNormaliser {
  readonly object: "chat.completion.chunk" | "text_completion";
  id: string;
  created = Math.floor(Date.now() / 1000);
  reported: ReportedUsage | null = null;
  /** UTF-8 bytes of delivered text (an upper bound on tokens). */
  counted = 0;
  /** Chunks that carried text (≈ tokens for one-token-per-chunk engines). */
  chunks = 0;
  /** Tool-call deltas of each choice, by choice index. */
  readonly #toolCalls = new Map<unknown, ToolCallDeltas>();
  #idFixed = false;
  /** The last chunk accepted by `push`, normalised. */
  last: Record<string, unknown> | null = null;

  constructor(kind: "chat" | "completions", readonly model: string) {
    this.object = kind === "chat" ? "chat.completion.chunk" : "text_completion";
    this.id = openAIId(kind === "chat" ? "chatcmpl-" : "cmpl-");
  }

  /**
   * Takes one `data:` payload; returns the JSON text to forward, or null to
   * drop it (usage-only chunks). Throws on malformed frames and node errors.
   */
  push(data: string): string | null {
    let o: unknown;
    try {
      o = JSON.parse(data);
    } catch {
      throw malformed("stream frame");
    }
    if (!isObj(o)) throw malformed("stream frame");
    if ("error" in o && o.error) throw nodeFrameError(o.error);
    if (!Array.isArray(o.choices)) throw malformed("stream chunk");
    let changed = false;
    if (o.object !== this.object) {
      o.object = this.object;
      changed = true;
    }
    if (o.id !== this.id) {
      if (!this.#idFixed && typeof o.id === "string" && o.id.length <= 128) {
        this.id = o.id;
      } else {
        o.id = this.id;
        changed = true;
      }
    }
    this.#idFixed = true;
    if (typeof o.created !== "number") {
      o.created = this.created;
      changed = true;
    }
    if (typeof o.model !== "string") {
      o.model = this.model;
      changed = true;
    }
    if ("usage" in o) {
      const u = readUsage(o.usage);
      if (u) this.reported = u;
      delete o.usage;
      changed = true;
    }
    this.last = o;
    if (o.choices.length === 0) return null;
    let bytes = 0;
    for (const c of o.choices) {
      if (!isObj(c)) throw malformed("stream choice");
      if (this.object === "text_completion") {
        if (typeof c.text === "string") bytes += utf8Length(c.text);
        else if (c.text !== undefined && c.text !== null) {
          throw malformed("stream choice");
        }
        continue;
      }
      const d = c.delta;
      if (!isObj(d)) throw malformed("stream delta");
      if (typeof d.content === "string") bytes += utf8Length(d.content);
      if (typeof d.reasoning_content === "string") {
        bytes += utf8Length(d.reasoning_content);
      }
      let calls = this.#toolCalls.get(c.index);
      if (d.tool_calls !== undefined && d.tool_calls !== null) {
        if (!Array.isArray(d.tool_calls)) throw malformed("tool call");
        if (!calls) this.#toolCalls.set(c.index, calls = new ToolCallDeltas());
        const out = calls.push(d.tool_calls);
        if (out === null) throw malformed("tool call");
        d.tool_calls = out;
        changed = true;
        for (const tc of out) bytes += toolCallBytes(tc);
      }
      if (calls && calls.count > 0 && typeof c.finish_reason === "string") {
        const reason = toolFinishReason(c.finish_reason);
        changed ||= reason !== c.finish_reason;
        c.finish_reason = reason;
      }
    }
    if (bytes > 0) {
      this.counted += bytes;
      this.chunks++;
    }
    return changed ? JSON.stringify(o) : data;
  }

  /** The usage chunk sent when the client asked for `stream_options.include_usage`. */
  usageChunk(
    prompt: number,
    completion: number,
    cached: number | null,
    basis: UsageBasis | null = null,
  ): string {
    return JSON.stringify({
      id: this.id,
      object: this.object,
      created: this.created,
      model: this.model,
      choices: [],
      usage: usageObject(prompt, completion, cached, basis),
    });
  }
}

/** Normalises a non-stream chat or completion response in place; returns what it counted. */
export function normaliseCompletion(
  o: Record<string, unknown>,
  kind: "chat" | "completions",
  model: string,
): { reported: ReportedUsage | null; counted: number } {
  if (isObj(o.error)) throw nodeFrameError(o.error);
  if (!Array.isArray(o.choices)) throw malformed("response");
  o.object = kind === "chat" ? "chat.completion" : "text_completion";
  if (typeof o.id !== "string") {
    o.id = openAIId(kind === "chat" ? "chatcmpl-" : "cmpl-");
  }
  if (typeof o.created !== "number") o.created = Math.floor(Date.now() / 1000);
  if (typeof o.model !== "string") o.model = model;
  let counted = 0;
  for (const c of o.choices) {
    if (!isObj(c)) throw malformed("choice");
    if (kind === "completions") {
      if (typeof c.text === "string") counted += utf8Length(c.text);
      continue;
    }
    const m = c.message;
    if (!isObj(m)) throw malformed("message");
    if (typeof m.content === "string") counted += utf8Length(m.content);
    if (typeof m.reasoning_content === "string") {
      counted += utf8Length(m.reasoning_content);
    }
    if (Array.isArray(m.tool_calls) && m.tool_calls.length > 0) {
      const calls = normaliseToolCalls(m.tool_calls);
      if (calls === null) throw malformed("tool call");
      m.tool_calls = calls;
      c.finish_reason = toolFinishReason(c.finish_reason);
      for (const tc of calls) counted += toolCallBytes(tc);
    }
  }
  return { reported: readUsage(o.usage), counted };
}
