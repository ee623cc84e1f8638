/**
 * Normalises untrusted node output into exact OpenAI shapes: stream chunks
 * (`chat.completion.chunk` / `text_completion`), final responses, and the
 * usage they report. A chunk that needs no change is forwarded as the node
 * sent it (no re-serialisation); malformed frames are refused.
 */
import { OpenAIError } from "../lib/openai_errors.ts";
import { utf8Length } from "./tokens.ts";

/** Usage as reported by a node (validated). */
export interface ReportedUsage {
  prompt: number;
  completion: number;
}

const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);

const count = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 0;

/** Reads a `usage` object; null when absent or malformed. */
export function readUsage(u: unknown): ReportedUsage | null {
  if (!isObj(u) || !count(u.prompt_tokens) || !count(u.completion_tokens)) {
    return null;
  }
  return {
    prompt: u.prompt_tokens as number,
    completion: u.completion_tokens as number,
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

let seq = 0;
/** A fresh id with OpenAI's prefixes (`chatcmpl-`, `cmpl-`, `call_`). */
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
  readonly #toolCalls = new Set<number>();
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
      if (d.tool_calls !== undefined && d.tool_calls !== null) {
        if (!Array.isArray(d.tool_calls)) throw malformed("tool call");
        for (let i = 0; i < d.tool_calls.length; i++) {
          const r = this.#toolCall(d.tool_calls[i], i);
          bytes += r.bytes;
          changed ||= r.changed;
        }
      }
    }
    if (bytes > 0) {
      this.counted += bytes;
      this.chunks++;
    }
    return changed ? JSON.stringify(o) : data;
  }

  #toolCall(tc: unknown, pos: number): { bytes: number; changed: boolean } {
    if (!isObj(tc)) throw malformed("tool call");
    let changed = false;
    if (!Number.isSafeInteger(tc.index)) {
      tc.index = pos;
      changed = true;
    }
    const fn = isObj(tc.function)
      ? tc.function
      : (tc.function = {},
        changed = true,
        tc.function as Record<string, unknown>);
    if (fn.arguments !== undefined && typeof fn.arguments !== "string") {
      fn.arguments = JSON.stringify(fn.arguments);
      changed = true;
    }
    if (!this.#toolCalls.has(tc.index as number)) {
      this.#toolCalls.add(tc.index as number);
      if (typeof tc.id !== "string" || !tc.id) {
        tc.id = openAIId("call_");
        changed = true;
      }
      if (tc.type !== "function") {
        tc.type = "function";
        changed = true;
      }
      if (typeof fn.name !== "string") {
        fn.name = "";
        changed = true;
      }
      if (fn.arguments === undefined) {
        fn.arguments = "";
        changed = true;
      }
    }
    const bytes =
      (typeof fn.arguments === "string" ? utf8Length(fn.arguments) : 0) +
      (typeof fn.name === "string" ? utf8Length(fn.name) : 0);
    return { bytes, changed };
  }

  /** The usage chunk sent when the client asked for `stream_options.include_usage`. */
  usageChunk(prompt: number, completion: number): string {
    return JSON.stringify({
      id: this.id,
      object: this.object,
      created: this.created,
      model: this.model,
      choices: [],
      usage: {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
      },
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
    if (Array.isArray(m.tool_calls)) {
      for (const tc of m.tool_calls) {
        if (!isObj(tc) || !isObj(tc.function)) throw malformed("tool call");
        if (typeof tc.id !== "string") tc.id = openAIId("call_");
        tc.type = "function";
        if (typeof tc.function.arguments !== "string") {
          tc.function.arguments = JSON.stringify(tc.function.arguments ?? {});
        }
        counted += utf8Length(tc.function.arguments as string) +
          utf8Length(String(tc.function.name ?? ""));
      }
    }
  }
  return { reported: readUsage(o.usage), counted };
}
