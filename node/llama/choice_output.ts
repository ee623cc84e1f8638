/**
 * Generated text → the pieces of one OpenAI choice: content deltas, tool
 * call deltas exactly as OpenAI streams them (index; id, type and name once
 * in the call's first delta; arguments in pieces), and logprobs in the
 * chat or legacy completions shape. A model that thinks in
 * `<think>…</think>` has that text split off first (node/llama/reasoning.ts)
 * into `reasoning_content` deltas; only what follows reaches the tool-call
 * parser. Used for streams (each piece is one chunk) and whole responses
 * (pieces are folded together).
 */
import type { TokenLogprob } from "./protocol.ts";
import type { ReasoningSplitter } from "./reasoning.ts";
import type { ToolCallParser, ToolParseEvent } from "./tool_calls.ts";

export type Kind = "chat" | "text";

/** One chunk's worth of a choice. */
export interface ChoicePiece {
  /** chat: the `delta` object. */
  delta?: Record<string, unknown>;
  /** text completions: the text. */
  text?: string;
  /** The chunk's `logprobs` (null when not asked for). */
  logprobs: Record<string, unknown> | null;
}

/** Chat logprobs entries in OpenAI's shape. */
function chatLogprobs(lp: TokenLogprob[]): Record<string, unknown> {
  return {
    content: lp.map((t) => ({
      token: t.token,
      logprob: t.logprob,
      bytes: t.bytes,
      top_logprobs: t.top.map((a) => ({
        token: a.token,
        logprob: a.logprob,
        bytes: a.bytes,
      })),
    })),
    refusal: null,
  };
}

/** Builds a choice from generated text. */
export class ChoiceOutput {
  #offset = 0;

  constructor(
    readonly kind: Kind,
    readonly parser: ToolCallParser | null,
    readonly logprobs: boolean,
    readonly think: ReasoningSplitter | null = null,
  ) {}

  /** Pieces for one text event of the model process. */
  text(text: string, lp: TokenLogprob[] | undefined): ChoicePiece[] {
    const logprobs = this.logprobs ? this.#logprobs(lp ?? []) : null;
    if (this.kind === "text") {
      this.#offset += text.length;
      return text || logprobs ? [{ text, logprobs }] : [];
    }
    const split = this.think?.push(text) ?? { reasoning: "", content: text };
    const pieces = this.#chat(split.reasoning, split.content, false);
    // logprobs go with the first text piece of this event, if any
    const first = pieces.find((p) =>
      p.delta && ("content" in p.delta || "reasoning_content" in p.delta)
    );
    if (first) first.logprobs = logprobs;
    return pieces;
  }

  /** Pieces still held when generation ends. */
  end(): ChoicePiece[] {
    const split = this.think?.end() ?? { reasoning: "", content: "" };
    return this.#chat(split.reasoning, split.content, true);
  }

  /** Reasoning, then content (through the tool-call parser when there is one). */
  #chat(reasoning: string, content: string, end: boolean): ChoicePiece[] {
    const out: ChoicePiece[] = reasoning
      ? [{ delta: { reasoning_content: reasoning }, logprobs: null }]
      : [];
    if (!this.parser) {
      if (content) out.push({ delta: { content }, logprobs: null });
      return out;
    }
    const events = content ? this.parser.push(content) : [];
    if (end) events.push(...this.parser.end());
    return out.concat(this.#fromParser(events));
  }

  /** OpenAI's finish_reason for the engine's reason. */
  finishReason(engine: "stop" | "length"): string {
    return this.parser?.sawCall && engine === "stop" ? "tool_calls" : engine;
  }

  #fromParser(events: ToolParseEvent[]): ChoicePiece[] {
    const out: ChoicePiece[] = [];
    for (const e of events) {
      if (e.type === "text") {
        if (e.text) out.push({ delta: { content: e.text }, logprobs: null });
      } else if (e.type === "call_start") {
        out.push({
          delta: {
            tool_calls: [{
              index: e.index,
              id: e.id,
              type: "function",
              function: { name: e.name, arguments: "" },
            }],
          },
          logprobs: null,
        });
      } else if (e.type === "call_args" && e.delta) {
        out.push({
          delta: {
            tool_calls: [{ index: e.index, function: { arguments: e.delta } }],
          },
          logprobs: null,
        });
      }
    }
    return out;
  }

  #logprobs(lp: TokenLogprob[]): Record<string, unknown> {
    if (this.kind === "chat") return chatLogprobs(lp);
    const text_offset: number[] = [];
    let at = this.#offset;
    for (const t of lp) {
      text_offset.push(at);
      at += t.token.length;
    }
    return {
      tokens: lp.map((t) => t.token),
      token_logprobs: lp.map((t) => t.logprob),
      top_logprobs: lp.map((t) =>
        Object.fromEntries(t.top.map((a) => [a.token, a.logprob]))
      ),
      text_offset,
    };
  }
}

/** Folds stream pieces into a whole `message` (chat) or text with logprobs. */
export class ChoiceCollector {
  content = "";
  /** The thinking split off the output (node/llama/reasoning.ts). */
  reasoning = "";
  readonly calls: {
    id: string;
    type: "function";
    function: { name: string; arguments: string };
  }[] = [];
  readonly #lp: Record<string, unknown[]> = {};

  add(p: ChoicePiece) {
    if (p.text !== undefined) this.content += p.text;
    const d = p.delta;
    if (d && typeof d.content === "string") this.content += d.content;
    if (d && typeof d.reasoning_content === "string") {
      this.reasoning += d.reasoning_content;
    }
    if (d && Array.isArray(d.tool_calls)) {
      for (const tc of d.tool_calls as Record<string, unknown>[]) {
        const i = tc.index as number;
        const fn = tc.function as { name?: string; arguments?: string };
        if (!this.calls[i]) {
          this.calls[i] = {
            id: tc.id as string,
            type: "function",
            function: { name: fn.name ?? "", arguments: "" },
          };
        }
        this.calls[i].function.arguments += fn.arguments ?? "";
      }
    }
    if (p.logprobs) {
      for (const [k, v] of Object.entries(p.logprobs)) {
        if (Array.isArray(v)) (this.#lp[k] ??= []).push(...v);
      }
    }
  }

  /** The folded logprobs (null when none were asked for). */
  logprobs(kind: Kind, asked: boolean): Record<string, unknown> | null {
    if (!asked) return null;
    if (kind === "chat") {
      return { content: this.#lp.content ?? [], refusal: null };
    }
    return {
      tokens: this.#lp.tokens ?? [],
      token_logprobs: this.#lp.token_logprobs ?? [],
      top_logprobs: this.#lp.top_logprobs ?? [],
      text_offset: this.#lp.text_offset ?? [],
    };
  }
}
