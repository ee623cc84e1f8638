/**
 * Anthropic's Messages API on top of the OpenAI pipeline: `/v1/messages`
 * (JSON or SSE events in Anthropic's order: message_start,
 * content_block_start, ping, content_block_delta…, content_block_stop,
 * message_delta with usage, message_stop) and `/v1/messages/count_tokens`.
 * Reasoning (`thinking`, `output_config.effort`) reaches models with a
 * reasoning control as a chat `reasoning_effort`, and the model's
 * reasoning comes back as signed thinking blocks when thinking was asked.
 * Errors on these routes use Anthropic's shape; a prompt too long for the
 * model's context gets the exact texts Claude Code acts on ("prompt is too
 * long: N tokens > M maximum" makes it compact; "input length and
 * `max_tokens` exceed context limit: N + K > M" makes it lower max_tokens).
 */
import { ContextLengthError, OpenAIError } from "../protocol/openai/errors.ts";
import { sseFrame } from "../lib/sse.ts";
import { Exchange, type GatewayCore } from "./core.ts";
import {
  ChunkNormaliser,
  malformed,
  normaliseCompletion,
  openAIId,
} from "./normalise.ts";
import { fail, readBody } from "./openai.ts";
import { relayStream, type StreamSink } from "./stream.ts";
import { type AnthropicRequest, toOpenAI } from "./anthropic_request.ts";
import { effortReaches } from "./effort.ts";
import { reasoningKey, sealReasoning } from "./responses_reasoning.ts";
import type { AppliedEdit } from "./anthropic_context.ts";
import { affinityOf } from "./affinity.ts";
import { countPromptTokens, tokenCountHeaders } from "./count_tokens.ts";
import { routeTenant } from "./router.ts";

const ERROR_TYPE: Record<number, string> = {
  400: "invalid_request_error",
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  413: "request_too_large",
  429: "rate_limit_error",
  503: "overloaded_error",
};

/**
 * A node's context overflow (OpenAI's wording, which the llama engine and
 * vLLM use: "maximum context length is M tokens … N in the messages, K in
 * the completion") in Anthropic's words, with the same numbers; null when
 * the numbers cannot be read.
 */
export function contextOverflowMessage(message: string): string | null {
  const max = message.match(/maximum context length is (\d+)/)?.[1];
  const prompt = message.match(/(\d+) in the messages/)?.[1] ??
    message.match(/has (\d+) input tokens/)?.[1];
  if (max === undefined || prompt === undefined) return null;
  const out = message.match(/(\d+) in the completion/)?.[1];
  if (Number(prompt) >= Number(max) || out === undefined) {
    return `prompt is too long: ${prompt} tokens > ${max} maximum`;
  }
  return `input length and \`max_tokens\` exceed context limit: ${prompt} + ${out} > ${max}, decrease input length or \`max_tokens\` and try again`;
}

/** A context overflow with its numbers, in Anthropic's words. */
function overflowMessage(e: ContextLengthError): string {
  const n = e.promptTokens;
  const m = e.contextLength;
  const k = e.completionTokens;
  return k === null || n >= m
    ? `prompt is too long: ${n} tokens > ${m} maximum`
    : `input length and \`max_tokens\` exceed context limit: ${n} + ${k} > ${m}, decrease input length or \`max_tokens\` and try again`;
}

function anthropicErrorBody(e: OpenAIError): string {
  const type = ERROR_TYPE[e.status] ?? "api_error";
  const message = e instanceof ContextLengthError
    ? overflowMessage(e)
    : e.code === "context_length_exceeded"
    ? contextOverflowMessage(e.message) ?? e.message
    : e.message;
  return JSON.stringify({ type: "error", error: { type, message } });
}

/** Renders an error in Anthropic's shape, keeping status and headers. */
export function anthropicError(e: OpenAIError): Response {
  return new Response(anthropicErrorBody(e), {
    status: e.status,
    headers: { "content-type": "application/json", ...e.headers },
  });
}

const STOP: Record<string, string> = {
  stop: "end_turn",
  length: "max_tokens",
  tool_calls: "tool_use",
};

const ev = (name: string, data: unknown) => sseFrame(data, name);

/**
 * Thinking blocks, when the request asked for thinking: how they show the
 * model's reasoning (`omitted`: empty text), and what signs them (the
 * reasoning sealed with jose, as Responses' `encrypted_content`: opaque to
 * the client, which sends it back with earlier turns; the gateway leaves
 * earlier thinking out of the prompt).
 */
export interface ThinkingOutput {
  display: "summarized" | "omitted";
  sign: (text: string) => Promise<string>;
}

/**
 * Renders OpenAI chunks as Anthropic stream events. A node's
 * `reasoning_content` becomes a thinking block (`thinking_delta`s, then a
 * `signature_delta` before its `content_block_stop`) when thinking was
 * asked for, and is left out when not.
 */
export class AnthropicSink implements StreamSink {
  sawText = false;
  #started = false;
  #pinged = false;
  #index = -1;
  #open: "text" | "tool" | "thinking" | null = null;
  readonly #tools = new Map<number, number>();
  #stop = "end_turn";
  readonly #id = openAIId("msg_");
  /** The open thinking block's text, and its signature once made. */
  #thought = "";
  #signature: string | null = null;

  constructor(
    readonly norm: ChunkNormaliser,
    readonly ex: Exchange,
    readonly model: string,
    /** `context_management.applied_edits` for message_delta (null: not asked). */
    readonly applied: AppliedEdit[] | null = null,
    /** Thinking blocks (null: thinking not asked for, reasoning left out). */
    readonly thinking: ThinkingOutput | null = null,
  ) {}
  get reported() {
    return this.norm.reported;
  }
  get counted() {
    return this.norm.counted;
  }
  get chunks() {
    return this.norm.chunks;
  }

  #start(): string {
    if (this.#started) return "";
    this.#started = true;
    return ev("message_start", {
      type: "message_start",
      message: {
        id: this.#id,
        type: "message",
        role: "assistant",
        model: this.model,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: this.ex.promptEstimate, output_tokens: 0 },
      },
    });
  }

  #close(): string {
    if (this.#open === null) return "";
    let s = "";
    if (this.#open === "thinking") {
      s = ev("content_block_delta", {
        type: "content_block_delta",
        index: this.#index,
        delta: { type: "signature_delta", signature: this.#signature ?? "" },
      });
    }
    this.#open = null;
    return s + ev("content_block_stop", {
      type: "content_block_stop",
      index: this.#index,
    });
  }

  #openBlock(
    kind: "text" | "tool" | "thinking",
    block: Record<string, unknown>,
  ): string {
    let s = this.#close();
    this.#index++;
    this.#open = kind;
    s += ev("content_block_start", {
      type: "content_block_start",
      index: this.#index,
      content_block: block,
    });
    if (!this.#pinged) {
      this.#pinged = true;
      s += ev("ping", { type: "ping" });
    }
    return s;
  }

  #text(): string {
    return this.#open === "text"
      ? ""
      : this.#openBlock("text", { type: "text", text: "" });
  }

  data(payload: string): string | null | Promise<string | null> {
    const before = this.norm.chunks;
    this.norm.push(payload);
    this.sawText = this.norm.chunks > before;
    const o = this.norm.last;
    this.norm.last = null;
    let s = this.#start();
    const choice = o && Array.isArray(o.choices)
      ? o.choices[0] as Record<string, unknown> | undefined
      : undefined;
    if (!choice) return s || null;
    const d = (choice.delta ?? {}) as Record<string, unknown>;
    if (
      this.thinking && typeof d.reasoning_content === "string" &&
      d.reasoning_content
    ) {
      s += this.#thinkingDelta(d.reasoning_content);
    }
    const next = (typeof d.content === "string" && d.content.length > 0) ||
      (Array.isArray(d.tool_calls) && d.tool_calls.length > 0);
    if (next && this.#signPending()) {
      // the thinking block ends here: sign it before its stop is made
      return this.#sign().then(() => this.#deltas(s, choice, d) || null);
    }
    return this.#deltas(s, choice, d) || null;
  }

  /** Whether the open block is thinking still to sign. */
  #signPending(): boolean {
    return this.#open === "thinking" && this.#signature === null;
  }

  async #sign(): Promise<void> {
    this.#signature = await this.thinking!.sign(this.#thought);
  }

  #thinkingDelta(text: string): string {
    let s = "";
    if (this.#open !== "thinking") {
      s += this.#openBlock("thinking", {
        type: "thinking",
        thinking: "",
        signature: "",
      });
      this.#thought = "";
      this.#signature = null;
    }
    this.#thought += text;
    if (this.thinking!.display === "omitted") return s;
    return s + ev("content_block_delta", {
      type: "content_block_delta",
      index: this.#index,
      delta: { type: "thinking_delta", thinking: text },
    });
  }

  /** The events for one chunk's text and tool-call deltas, after `s`. */
  #deltas(
    s: string,
    choice: Record<string, unknown>,
    d: Record<string, unknown>,
  ): string {
    if (typeof d.content === "string" && d.content.length > 0) {
      s += this.#text();
      s += ev("content_block_delta", {
        type: "content_block_delta",
        index: this.#index,
        delta: { type: "text_delta", text: d.content },
      });
    }
    if (Array.isArray(d.tool_calls)) {
      for (const tc of d.tool_calls as Record<string, unknown>[]) {
        const fn = tc.function as Record<string, unknown>;
        const idx = tc.index as number;
        if (!this.#tools.has(idx)) {
          s += this.#openBlock("tool", {
            type: "tool_use",
            id: tc.id,
            name: fn.name,
            input: {},
          });
          this.#tools.set(idx, this.#index);
        }
        if (typeof fn.arguments === "string" && fn.arguments.length > 0) {
          s += ev("content_block_delta", {
            type: "content_block_delta",
            index: this.#tools.get(idx),
            delta: { type: "input_json_delta", partial_json: fn.arguments },
          });
        }
      }
    }
    if (typeof choice.finish_reason === "string") {
      this.#stop = STOP[choice.finish_reason] ?? "end_turn";
    }
    return s;
  }

  /** Signs a thinking block the answer ended in, before the end goes out. */
  async complete(): Promise<void> {
    if (this.#signPending()) await this.#sign();
  }

  end(): string {
    let s = this.#start();
    if (this.#index < 0) s += this.#text();
    s += this.#close();
    s += ev("message_delta", {
      type: "message_delta",
      delta: { stop_reason: this.#stop, stop_sequence: null },
      usage: anthropicUsage(this.ex),
      ...contextManagement(this.applied),
    });
    return s + ev("message_stop", { type: "message_stop" });
  }

  error(e: OpenAIError): string {
    return sseFrame(anthropicErrorBody(e), "error");
  }

  ping(): string {
    return this.#start() +
      (this.#pinged ? ev("ping", { type: "ping" }) : this.#text());
  }
}

/** The `context_management` member of a message or message_delta, when the request had one. */
function contextManagement(applied: AppliedEdit[] | null) {
  return applied ? { context_management: { applied_edits: applied } } : {};
}

/** Converts a non-stream chat completion into an Anthropic message. */
async function toMessage(
  o: Record<string, unknown>,
  ex: Exchange,
  model: string,
  applied: AppliedEdit[] | null,
  thinking: ThinkingOutput | null,
): Promise<Record<string, unknown>> {
  const choice = (o.choices as Record<string, unknown>[])[0] ?? {};
  const msg = (choice.message ?? {}) as Record<string, unknown>;
  const content: unknown[] = [];
  const thought = msg.reasoning_content;
  if (thinking && typeof thought === "string" && thought.length > 0) {
    content.push({
      type: "thinking",
      thinking: thinking.display === "omitted" ? "" : thought,
      signature: await thinking.sign(thought),
    });
  }
  if (typeof msg.content === "string" && msg.content.length > 0) {
    content.push({ type: "text", text: msg.content });
  }
  for (
    const tc of (Array.isArray(msg.tool_calls) ? msg.tool_calls : []) as Record<
      string,
      unknown
    >[]
  ) {
    const fn = tc.function as Record<string, unknown>;
    let input: unknown = {};
    try {
      input = JSON.parse(String(fn.arguments || "{}"));
    } catch { /* keep {} */ }
    content.push({ type: "tool_use", id: tc.id, name: fn.name, input });
  }
  if (content.length === 0) content.push({ type: "text", text: "" });
  return {
    id: openAIId("msg_"),
    type: "message",
    role: "assistant",
    model,
    content,
    stop_reason: STOP[String(choice.finish_reason)] ?? "end_turn",
    stop_sequence: null,
    usage: anthropicUsage(ex),
    ...contextManagement(applied),
  };
}

/** Anthropic's usage: `input_tokens` excludes what was read from the prompt cache. */
function anthropicUsage(ex: Exchange) {
  const cached = ex.cachedTokens ?? 0;
  return {
    input_tokens: ex.promptTokens - Math.min(cached, ex.promptTokens),
    cache_read_input_tokens: Math.min(cached, ex.promptTokens),
    output_tokens: ex.completionTokens,
  };
}

/**
 * Gives `thinking` / `output_config.effort` their meaning: the chat
 * `reasoning_effort` they come to, sent where every node serving the model
 * has a reasoning control (gateway/effort.ts); whether it was.
 */
function applyEffort(
  core: GatewayCore,
  a: AnthropicRequest,
  model: string,
): boolean {
  if (a.effort === null || !effortReaches(core, model)) return false;
  a.chat.body.reasoning_effort = a.effort;
  return true;
}

/** Thinking blocks signed for the tenant (see ThinkingOutput). */
async function thinkingOutput(
  core: GatewayCore,
  tenantId: string,
  display: ThinkingOutput["display"],
): Promise<ThinkingOutput> {
  const key = await reasoningKey(core.deps.store);
  return { display, sign: (text) => sealReasoning(key, tenantId, text) };
}

/** `POST /v1/messages`. */
export async function messages(
  core: GatewayCore,
  req: Request,
  requestId: string,
): Promise<Response> {
  const ex = new Exchange(core, requestId, "messages");
  try {
    const ctx = await ex.authenticate(req, "chat");
    const a = toOpenAI(await readBody(core, req));
    const p = a.chat;
    const m = core.resolveModel(ctx, p.model, "chat");
    const reaches = applyEffort(core, a, m.id);
    ex.model = m.id;
    const cap = await ex.admit(ctx, p, m);
    p.body.max_tokens = cap;
    p.body.model = m.id;
    if (p.stream) p.body.stream_options = { include_usage: true };
    const up = await core.upstream.call(
      m.id,
      "/v1/chat/completions",
      JSON.stringify(p.body),
      p.stream,
      req.signal,
      requestId,
      affinityOf(p.body),
      routeTenant(ctx),
    );
    ex.routed(up.slot, up.notes);
    const ignored = reaches ? a.ignored : [...a.effortPaths, ...a.ignored];
    if (ignored.length > 0) {
      ex.report({ "x-orchard-ignored": ignored.join(", ") });
    }
    const thinking: ThinkingOutput | null = a.thinking
      ? await thinkingOutput(core, ctx.tenant.id, a.thinking.display)
      : null;
    const headers: Record<string, string> = {
      ...ex.headers,
      "x-request-id": requestId,
      "request-id": requestId,
    };
    if (up.kind === "stream") {
      return relayStream(
        ex,
        up,
        new AnthropicSink(
          new ChunkNormaliser("chat", m.id),
          ex,
          p.model,
          a.applied,
          thinking,
        ),
        headers,
      );
    }
    up.close();
    if (p.stream) throw malformed("stream (not text/event-stream)");
    const r = normaliseCompletion(up.json, "chat", m.id);
    ex.firstToken();
    ex.bill(r.reported, r.counted, Math.ceil(r.counted / 4));
    ex.finish();
    const msg = await toMessage(up.json, ex, p.model, a.applied, thinking);
    return new Response(JSON.stringify(msg), {
      headers: {
        "content-type": "application/json",
        ...headers,
        ...(ex.usageBasis ? { "x-orchard-usage": ex.usageBasis } : {}),
      },
    });
  } catch (e) {
    return fail(ex, e, anthropicError);
  }
}

/**
 * `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages`
 * would bill them, counted by a node serving the model
 * (gateway/count_tokens.ts); the estimate only when none can count.
 */
export async function countTokens(
  core: GatewayCore,
  req: Request,
  requestId: string,
): Promise<Response> {
  const ex = new Exchange(core, requestId, "messages");
  try {
    const ctx = await ex.authenticate(req, "chat");
    const body = await readBody(core, req);
    // count_tokens has no max_tokens; a thinking budget must stay below it
    const budget = (body.thinking as { budget_tokens?: unknown } | null)
      ?.budget_tokens;
    body.max_tokens ??= Number.isSafeInteger(budget)
      ? (budget as number) + 1
      : 1;
    const a = toOpenAI(body);
    const m = core.resolveModel(ctx, a.chat.model, "chat");
    applyEffort(core, a, m.id); // the switch may change the prompt (an empty think block)
    const n = await countPromptTokens(core, {
      model: m.id,
      body: a.chat.body,
      estimate: a.chat.prompt.estimate,
      tenantId: ctx.tenant.id,
      signal: req.signal,
      requestId,
    });
    const count: Record<string, unknown> = { input_tokens: n.tokens };
    if (a.applied) {
      count.context_management = { original_input_tokens: a.originalTokens };
    }
    return new Response(JSON.stringify(count), {
      headers: {
        "content-type": "application/json",
        "x-request-id": requestId,
        "request-id": requestId,
        ...tokenCountHeaders(n),
      },
    });
  } catch (e) {
    return fail(ex, e, anthropicError);
  }
}
