/**
 * Normalisation of what OpenAI-compatible servers return into OpenAI's exact
 * shapes (non-stream answers, errors, usage, logprobs; streams are in
 * openai_stream.ts). Known quirks handled (Exo, mlx_lm.server, llama-server,
 * Ollama): integer or missing error codes, FastAPI `{"detail": …}` errors,
 * missing ids, indexes or `finish_reason` keys, tool calls in non-exact
 * shapes (protocol/openai/tool_calls.ts) with "stop" for a finish reason, logprob
 * entries without `bytes` or with extra keys, and no usage at all (then
 * counted with the model's tokenizer, or estimated, and said so: see
 * tokens.ts).
 *
 * Logprobs are passed on as the upstream gave them when the client asked
 * (normalised; null when absent or unusable, with a note: no upstream can be
 * known up front to lack them, and none are ever made up), and are null when
 * the client did not ask.
 */
import { OpenAIError } from "../../protocol/openai/errors.ts";
import {
  normaliseToolCalls,
  toolFinishReason,
} from "../../protocol/openai/tool_calls.ts";
import type { TokenCounter, UsageBasis } from "./tokens.ts";

/** A JSON object. */
export type Json = Record<string, unknown>;

/**
 * OpenAI's usage object; `orchard_usage` says how it was made when the
 * upstream reported none ("counted" with the model's tokenizer, or
 * "estimated"), and is absent when the upstream reported it.
 */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  orchard_usage?: UsageBasis;
}

/** "chat" for chat completions, "text" for legacy completions. */
export type Kind = "chat" | "text";

const CODE_BY_STATUS: Record<number, string> = {
  400: "invalid_request",
  401: "invalid_api_key",
  404: "model_not_found",
  408: "timeout",
  413: "request_too_large",
  429: "rate_limit_exceeded",
  503: "server_busy",
};

/** `v` as an object, or null. */
export function obj(v: unknown): Json | null {
  return typeof v === "object" && v !== null && !Array.isArray(v)
    ? v as Json
    : null;
}

/** `v` as a non-negative integer (rounded), or null. */
export function int(v: unknown): number | null {
  return typeof v === "number" && Number.isFinite(v) && v >= 0
    ? Math.round(v)
    : null;
}

/** OpenAI usage from whatever the upstream sent, or null when unusable. */
export function normaliseUsage(v: unknown): Usage | null {
  const u = obj(v);
  if (!u) return null;
  const p = int(u.prompt_tokens ?? u.input_tokens);
  const c = int(u.completion_tokens ?? u.output_tokens) ?? 0;
  if (p === null) return null;
  return { prompt_tokens: p, completion_tokens: c, total_tokens: p + c };
}

/** An OpenAI error from an upstream error response (any of the common shapes). */
export async function upstreamError(res: {
  status: number;
  headers: { get(name: string): string | null };
  text(max?: number): Promise<string>;
}): Promise<OpenAIError> {
  const text = await res.text(64 * 1024).catch(() => "");
  let body: Json | null = null;
  try {
    body = obj(JSON.parse(text));
  } catch { /* not JSON */ }
  const err = obj(body?.error);
  const message = (typeof err?.message === "string" && err.message) ||
    (typeof body?.error === "string" && body.error) ||
    (typeof body?.detail === "string" && body.detail) ||
    (typeof body?.message === "string" && body.message) ||
    text.slice(0, 300) || `Upstream answered ${res.status}`;
  const code = typeof err?.code === "string"
    ? err.code
    : CODE_BY_STATUS[res.status] ?? null;
  const status = res.status >= 400 && res.status <= 599 ? res.status : 502;
  const param = typeof err?.param === "string" ? err.param : null;
  const headers: Record<string, string> = {};
  const ra = res.headers.get("retry-after");
  if (ra) headers["retry-after"] = ra;
  return new OpenAIError(status, code, message, { param, headers });
}

/** What the client asked for that shapes the answer. */
export interface Asked {
  /** The completion cap (`max_tokens` / `max_completion_tokens`), if any. */
  maxTokens: number | null;
  /** Whether the client asked for logprobs. */
  logprobs: boolean;
}

/** Reads what shapes the answer from a request body. */
export function askedOf(body: Json, kind: Kind): Asked {
  const caps = [body.max_tokens, body.max_completion_tokens]
    .filter((v): v is number => Number.isSafeInteger(v) && (v as number) > 0);
  return {
    maxTokens: caps.length ? Math.min(...caps) : null,
    logprobs: kind === "chat"
      ? body.logprobs === true
      : Number.isSafeInteger(body.logprobs) && (body.logprobs as number) >= 0,
  };
}

/** The finish reason when the upstream gave none: the cap reached, a tool call made, else a stop. */
export function inferFinish(
  asked: Asked,
  completionTokens: number,
  toolCalls: boolean,
): string {
  if (asked.maxTokens !== null && completionTokens >= asked.maxTokens) {
    return "length";
  }
  return toolCalls ? "tool_calls" : "stop";
}

function tokenLogprob(v: unknown): Json | null {
  const e = obj(v);
  if (!e || typeof e.token !== "string" || typeof e.logprob !== "number") {
    return null;
  }
  const bytes = Array.isArray(e.bytes) && e.bytes.every((b) => int(b) !== null)
    ? e.bytes
    : e.token.includes("\uFFFD")
    ? null
    : [...new TextEncoder().encode(e.token)];
  return { token: e.token, logprob: e.logprob, bytes };
}

/**
 * A choice's logprobs in the client's shape when it asked for them: chat's
 * `{content: [{token, logprob, bytes, top_logprobs}], refusal}` (entries
 * missing `bytes` get them, extra keys go), legacy completions' object as
 * given. Null when not asked, absent or unusable (mlx_lm.server's 2025
 * `{token_logprobs, top_logprobs, tokens}` object in a chat answer).
 */
export function choiceLogprobs(
  v: unknown,
  kind: Kind,
  asked: Asked,
): Json | null {
  if (!asked.logprobs) return null;
  const o = obj(v);
  if (!o || kind === "text") return o;
  if (!Array.isArray(o.content)) return null;
  const content: Json[] = [];
  for (const item of o.content) {
    const e = tokenLogprob(item);
    if (!e) return null;
    const top = obj(item)!.top_logprobs ?? [];
    if (!Array.isArray(top)) return null;
    const tops = top.map(tokenLogprob);
    if (tops.some((t) => t === null)) return null;
    content.push({ ...e, top_logprobs: tops });
  }
  return { content, refusal: null };
}

function finalChoice(
  c: Json,
  i: number,
  kind: Kind,
  asked: Asked,
  completionTokens: number,
): Json {
  const logprobs = choiceLogprobs(c.logprobs, kind, asked);
  const given = typeof c.finish_reason === "string" ? c.finish_reason : null;
  const base = { index: int(c.index) ?? i, logprobs };
  if (kind === "text") {
    return {
      ...base,
      finish_reason: given ?? inferFinish(asked, completionTokens, false),
      text: typeof c.text === "string" ? c.text : "",
    };
  }
  const m = obj(c.message) ?? {};
  const message: Json = { ...m, role: "assistant", content: m.content ?? null };
  delete message.tool_calls;
  const calls = Array.isArray(m.tool_calls) && m.tool_calls.length > 0
    ? normaliseToolCalls(m.tool_calls)
    : null;
  if (Array.isArray(m.tool_calls) && m.tool_calls.length > 0 && !calls) {
    throw new OpenAIError(
      502,
      "upstream_error",
      "The engine returned a malformed tool call",
    );
  }
  let finish = given ?? inferFinish(asked, completionTokens, calls !== null);
  if (calls) {
    message.tool_calls = calls;
    if (message.content === "") message.content = null;
    finish = toolFinishReason(finish) as string;
  }
  return { ...base, finish_reason: finish, message };
}

function rawText(c: unknown, kind: Kind): string {
  const o = obj(c) ?? {};
  if (kind === "text") return typeof o.text === "string" ? o.text : "";
  const m = obj(o.message) ?? {};
  let s = typeof m.content === "string" ? m.content : "";
  for (const t of Array.isArray(m.tool_calls) ? m.tool_calls : []) {
    const a = obj(obj(t)?.function)?.arguments;
    s += typeof a === "string" ? a : a === undefined ? "" : JSON.stringify(a);
  }
  return s;
}

/**
 * Normalises a non-stream completion. Usage the upstream did not report is
 * made with `counter` from the request and the choices' text (`basis` says
 * how; null when the upstream reported it).
 */
export function normaliseCompletion(
  json: unknown,
  kind: Kind,
  model: string,
  request: Json,
  asked: Asked,
  counter: TokenCounter,
): {
  body: Json;
  usage: Usage;
  basis: UsageBasis | null;
  logprobsMissing: boolean;
} {
  const j = obj(json) ?? {};
  const raw = Array.isArray(j.choices) ? j.choices : [];
  let usage = normaliseUsage(j.usage);
  const basis = usage ? null : counter.basis;
  // Each choice's own count decides its finish reason when usage is made here.
  let perChoice: number[] | null = null;
  if (!usage) {
    perChoice = raw.map((c) => counter.text(rawText(c, kind)));
    const p = counter.prompt(request, kind);
    const n = perChoice.reduce((a, b) => a + b, 0);
    usage = {
      prompt_tokens: p,
      completion_tokens: n,
      total_tokens: p + n,
      orchard_usage: counter.basis,
    };
  }
  const total = usage.completion_tokens;
  const choices = raw.map((c, i) =>
    finalChoice(obj(c) ?? {}, i, kind, asked, perChoice?.[i] ?? total)
  );
  const body: Json = {
    id: typeof j.id === "string" && j.id ? j.id : newId(kind),
    object: kind === "chat" ? "chat.completion" : "text_completion",
    created: int(j.created) ?? Math.floor(Date.now() / 1000),
    model,
    choices,
    usage,
  };
  if (typeof j.system_fingerprint === "string") {
    body.system_fingerprint = j.system_fingerprint;
  }
  const logprobsMissing = asked.logprobs &&
    choices.some((c) => c.logprobs === null);
  return { body, usage, basis, logprobsMissing };
}

/** Whether an upstream answer carries usable usage. */
export function hasUsage(json: unknown): boolean {
  return normaliseUsage(obj(json)?.usage) !== null;
}

/** A fresh completion id with OpenAI's prefix. */
export function newId(kind: Kind): string {
  const rand = crypto.randomUUID().replaceAll("-", "").slice(0, 24);
  return kind === "chat" ? `chatcmpl-${rand}` : `cmpl-${rand}`;
}
