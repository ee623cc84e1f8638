/**
 * Normalisation of what OpenAI-compatible servers return into OpenAI's exact
 * shapes. Known quirks handled (Exo, mlx_lm.server, llama-server, Ollama):
 * stream chunks labelled `chat.completion`, usage attached to a content
 * chunk instead of a final `choices: []` chunk, integer or missing error
 * codes, FastAPI `{"detail": …}` errors, missing ids, indexes or
 * `finish_reason` keys, and no usage at all (then estimated, and said so).
 */
import { OpenAIError } from "../../lib/openai_errors.ts";
import { sseData, sseFrame } from "./_sse.ts";

type Json = Record<string, unknown>;

/** OpenAI's usage object. */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
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

function obj(v: unknown): Json | null {
  return typeof v === "object" && v !== null && !Array.isArray(v)
    ? v as Json
    : null;
}

function int(v: unknown): number | null {
  return typeof v === "number" && Number.isFinite(v) && v >= 0
    ? Math.round(v)
    : null;
}

/** Rough token count for text when the upstream reports none (≈ 4 chars per token). */
export function estimateTokens(text: string): number {
  return text.length === 0 ? 0 : Math.max(1, Math.ceil(text.length / 4));
}

/** The text of the prompt of a chat, completion or embedding request. */
export function promptText(body: Json): string {
  const parts: string[] = [];
  const walk = (v: unknown) => {
    if (typeof v === "string") parts.push(v);
    else if (Array.isArray(v)) v.forEach(walk);
    else if (obj(v)) {
      const o = v as Json;
      if (typeof o.text === "string") parts.push(o.text);
      else if (o.content !== undefined) walk(o.content);
    }
  };
  walk(body.messages ?? body.prompt ?? body.input ?? "");
  return parts.join("\n");
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
export async function upstreamError(res: Response): Promise<OpenAIError> {
  const text = await res.text().catch(() => "");
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

function finalChoice(c: Json, i: number, kind: Kind): Json {
  const base = {
    index: int(c.index) ?? i,
    logprobs: c.logprobs ?? null,
    finish_reason: c.finish_reason ?? "stop",
  };
  if (kind === "text") {
    return { ...base, text: typeof c.text === "string" ? c.text : "" };
  }
  const m = obj(c.message) ?? {};
  return {
    ...base,
    message: { ...m, role: m.role ?? "assistant", content: m.content ?? null },
  };
}

/** Normalises a non-stream completion; `estimated` when usage was computed here. */
export function normaliseCompletion(
  json: unknown,
  kind: Kind,
  model: string,
  prompt: string,
): { body: Json; usage: Usage; estimated: boolean } {
  const j = obj(json) ?? {};
  const choices = (Array.isArray(j.choices) ? j.choices : []).map((c, i) =>
    finalChoice(obj(c) ?? {}, i, kind)
  );
  let usage = normaliseUsage(j.usage);
  const estimated = usage === null;
  if (!usage) {
    const out = choices.map((c) =>
      kind === "text"
        ? String(c.text)
        : String((c.message as Json).content ?? "")
    ).join("");
    const p = estimateTokens(prompt);
    const n = estimateTokens(out);
    usage = { prompt_tokens: p, completion_tokens: n, total_tokens: p + n };
  }
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
  return { body, usage, estimated };
}

function newId(kind: Kind): string {
  const rand = crypto.randomUUID().replaceAll("-", "").slice(0, 24);
  return kind === "chat" ? `chatcmpl-${rand}` : `cmpl-${rand}`;
}

function chunkChoice(c: Json, i: number, kind: Kind): Json {
  const base = {
    index: int(c.index) ?? i,
    logprobs: c.logprobs ?? null,
    finish_reason: c.finish_reason ?? null,
  };
  if (kind === "text") {
    return { ...base, text: typeof c.text === "string" ? c.text : "" };
  }
  const delta = { ...(obj(c.delta) ?? obj(c.message) ?? {}) };
  if (Array.isArray(delta.tool_calls)) {
    delta.tool_calls = delta.tool_calls.map((t, j) => {
      const tc = { ...(obj(t) ?? {}) };
      tc.index = int(tc.index) ?? j;
      if (tc.id && !tc.type) tc.type = "function";
      return tc;
    });
  }
  return { ...base, delta };
}

function generatedText(choice: Json, kind: Kind): string {
  if (kind === "text") return String(choice.text ?? "");
  const d = choice.delta as Json;
  let s = typeof d.content === "string" ? d.content : "";
  if (Array.isArray(d.tool_calls)) {
    for (const t of d.tool_calls) {
      const f = obj(obj(t)?.function);
      if (typeof f?.arguments === "string") s += f.arguments;
    }
  }
  return s;
}

/** Hooks a stream normaliser reports through. */
export interface StreamHooks {
  /** Called with each content piece's estimated token count as it passes. */
  onTokens(n: number): void;
  /** Called once at the end with the final usage (or an error). */
  onEnd(usage: Usage | null, error: OpenAIError | null): void;
}

/**
 * Turns an upstream SSE body into exact OpenAI chunks, ending with one usage
 * chunk (`choices: []`) and `data: [DONE]`; an upstream error mid-stream
 * becomes a final error frame.
 */
export function normaliseStream(
  upstream: ReadableStream<Uint8Array>,
  kind: Kind,
  model: string,
  prompt: string,
  hooks: StreamHooks,
): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  const object = kind === "chat" ? "chat.completion.chunk" : "text_completion";
  let id = "";
  let created = 0;
  let usage: Usage | null = null;
  let generated = "";
  const events = sseData(upstream);
  let ended = false;
  const end = (u: Usage | null, e: OpenAIError | null) => {
    if (!ended) hooks.onEnd(u, e);
    ended = true;
  };

  const finish = (
    ctl: ReadableStreamDefaultController<Uint8Array>,
    error: OpenAIError | null,
  ) => {
    if (error) ctl.enqueue(enc.encode(error.toSSE()));
    else {
      if (!usage) {
        const p = estimateTokens(prompt);
        const n = estimateTokens(generated);
        usage = { prompt_tokens: p, completion_tokens: n, total_tokens: p + n };
        ctl.enqueue(
          enc.encode(
            ": usage estimated by orchard: the upstream reported none\n\n",
          ),
        );
      }
      ctl.enqueue(enc.encode(sseFrame({
        id: id || newId(kind),
        object,
        created: created || Math.floor(Date.now() / 1000),
        model,
        choices: [],
        usage,
      })));
    }
    ctl.enqueue(enc.encode(sseFrame("[DONE]")));
    ctl.close();
    end(usage, error);
  };

  return new ReadableStream<Uint8Array>({
    async pull(ctl) {
      try {
        let sent = false;
        while (!sent) {
          const { value, done } = await events.next();
          if (done || value.trim() === "[DONE]") return finish(ctl, null);
          const items = parseData(value);
          for (const j of items) {
            const err = obj(j.error);
            if (
              err || typeof j.error === "string" || typeof j.detail === "string"
            ) {
              const status = int(err?.status) ?? int(err?.code) ?? 500;
              const fake = new Response(JSON.stringify(j), {
                status: status >= 400 && status <= 599 ? status : 500,
              });
              return finish(ctl, await upstreamError(fake));
            }
            usage = normaliseUsage(j.usage) ?? usage;
            const raw = Array.isArray(j.choices) ? j.choices : [];
            if (raw.length === 0) continue; // usage-only: sent at the end
            id ||= typeof j.id === "string" && j.id ? j.id : newId(kind);
            created ||= int(j.created) ?? Math.floor(Date.now() / 1000);
            const choices = raw.map((c, i) =>
              chunkChoice(obj(c) ?? {}, i, kind)
            );
            let piece = "";
            for (const c of choices) piece += generatedText(c, kind);
            generated += piece;
            if (piece) hooks.onTokens(estimateTokens(piece));
            const out: Json = { id, object, created, model, choices };
            if (typeof j.system_fingerprint === "string") {
              out.system_fingerprint = j.system_fingerprint;
            }
            ctl.enqueue(enc.encode(sseFrame(out)));
            sent = true;
          }
        }
      } catch (err) {
        if ((err as Error)?.name === "AbortError") {
          end(usage, null);
          ctl.error(err);
          return;
        }
        finish(
          ctl,
          new OpenAIError(502, "upstream_error", "The engine stream failed"),
        );
      }
    },
    async cancel() {
      end(usage, null);
      await events.return(undefined);
    },
  });
}

/** JSON objects in one `data:` payload (servers that omit blank lines put several). */
function parseData(data: string): Json[] {
  try {
    const one = obj(JSON.parse(data));
    return one ? [one] : [];
  } catch {
    const out: Json[] = [];
    for (const line of data.split("\n")) {
      try {
        const j = obj(JSON.parse(line));
        if (j) out.push(j);
      } catch { /* not JSON: skipped */ }
    }
    return out;
  }
}
