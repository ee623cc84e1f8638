/**
 * Upstream SSE streams into exact OpenAI chunks. Quirks handled (Exo,
 * mlx_lm.server, llama-server, Ollama): chunks labelled `chat.completion`,
 * usage attached to a content chunk instead of a final `choices: []` chunk,
 * `role` repeated in every delta (sent once here, in the first), missing
 * `finish_reason` or `logprobs` keys, tool-call deltas in non-exact shapes
 * (protocol/openai/tool_calls.ts) and "stop" after tool calls, several JSON
 * objects in one `data:` payload, and a stream that ends without a finish
 * reason (keys absent, or `null` to the end as Exo sends them): a final
 * chunk then gives one, "length" when the completion tokens reached the
 * cap, else "tool_calls" after tool calls, else "stop". A stream without
 * usage gets it counted with the model's tokenizer, or estimated (tokens.ts),
 * marked `orchard_usage` in its usage chunk.
 */
import { OpenAIError } from "../../protocol/openai/errors.ts";
import {
  ToolCallDeltas,
  toolFinishReason,
} from "../../protocol/openai/tool_calls.ts";
import {
  type ByteSource,
  sseComment,
  SSEError,
  sseFrame,
  SSEReader,
} from "../../lib/sse.ts";
import {
  type Asked,
  choiceLogprobs,
  inferFinish,
  int,
  type Json,
  type Kind,
  newId,
  normaliseUsage,
  obj,
  upstreamError,
  type Usage,
} from "./openai_shapes.ts";
import { estimateTokens, ESTIMATOR, type TokenCounter } from "./tokens.ts";

/** Hooks a stream normaliser reports through. */
export interface StreamHooks {
  /** Called with each content piece's estimated token count as it passes. */
  onTokens(n: number): void;
  /** Called once at the end with the final usage (or an error). */
  onEnd(usage: Usage | null, error: OpenAIError | null): void;
  /** Called when the first piece of the result is made. */
  onFirst?(): void;
  /** Called when the result is cancelled (its reader went away), before `onEnd`. */
  onCancel?(): void;
}

interface ChoiceState {
  roleSent: boolean;
  finished: boolean;
  calls: ToolCallDeltas;
  /** What it generated (content, and tool-call arguments). */
  text: string;
  /** Chunks that carried some of it: a floor on its tokens (engines send a token or more a chunk). */
  pieces: number;
}

/** One stream's choices, normalised chunk by chunk. */
class Choices {
  readonly #byIndex = new Map<number, ChoiceState>();
  /** Whether any chunk carried usable logprobs. */
  sawLogprobs = false;

  constructor(readonly kind: Kind, readonly asked: Asked) {}

  #state(index: number): ChoiceState {
    let st = this.#byIndex.get(index);
    if (!st) {
      st = {
        roleSent: false,
        finished: false,
        calls: new ToolCallDeltas(),
        text: "",
        pieces: 0,
      };
      this.#byIndex.set(index, st);
    }
    return st;
  }

  /** One upstream choice in exact shape. */
  choice(c: Json, i: number): Json {
    const index = int(c.index) ?? i;
    const st = this.#state(index);
    const logprobs = choiceLogprobs(c.logprobs, this.kind, this.asked);
    if (logprobs) this.sawLogprobs = true;
    let finish = typeof c.finish_reason === "string" ? c.finish_reason : null;
    if (this.kind === "text") {
      st.finished ||= finish !== null;
      const text = typeof c.text === "string" ? c.text : "";
      return { index, text, logprobs, finish_reason: finish };
    }
    const { role: _role, tool_calls: raw, ...rest } = obj(c.delta) ??
      obj(c.message) ?? {};
    const delta: Json = st.roleSent ? rest : { role: "assistant", ...rest };
    st.roleSent = true;
    if (Array.isArray(raw) && raw.length > 0) {
      const calls = st.calls.push(raw);
      if (!calls) {
        throw new OpenAIError(
          502,
          "upstream_error",
          "The engine streamed a malformed tool call",
        );
      }
      delta.tool_calls = calls;
    }
    if (finish !== null && st.calls.count > 0) {
      finish = toolFinishReason(finish) as string;
    }
    st.finished ||= finish !== null;
    return { index, delta, logprobs, finish_reason: finish };
  }

  /** Records text a choice generated. */
  generated(index: number, piece: string): void {
    const st = this.#state(index);
    st.text += piece;
    st.pieces++;
  }

  /** Each choice's completion tokens by `counter`: at least one per chunk that carried text. */
  counts(counter: TokenCounter): Map<number, number> {
    const out = new Map<number, number>();
    for (const [index, st] of this.#byIndex) {
      out.set(index, Math.max(counter.text(st.text), st.pieces));
    }
    return out;
  }

  /** Closing choices for those the upstream left without a finish reason; `tokensOf` gives a choice's completion tokens. */
  unfinished(tokensOf: (index: number) => number): Json[] {
    if (this.#byIndex.size === 0) this.#state(0);
    const out: Json[] = [];
    for (const [index, st] of this.#byIndex) {
      if (st.finished) continue;
      const finish_reason = inferFinish(
        this.asked,
        tokensOf(index),
        st.calls.count > 0,
      );
      const body = this.kind === "text"
        ? { text: "" }
        : { delta: st.roleSent ? {} : { role: "assistant", content: "" } };
      out.push({ index, ...body, logprobs: null, finish_reason });
    }
    return out;
  }
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

/** What a stream answers: the request and how to count its tokens. */
export interface StreamRequest {
  kind: Kind;
  model: string;
  /** The client's request body. */
  request: Json;
  asked: Asked;
  /** The model's token counter: asked for only when the upstream reports no usage. */
  counter(): Promise<TokenCounter>;
}

/** How long the end of an upstream body may take to come after its `[DONE]`. */
const DRAIN_MS = 100;

/**
 * Turns an upstream SSE body into exact OpenAI chunks, ending with a real
 * finish reason, one usage chunk (`choices: []`) and `data: [DONE]`; an
 * upstream error mid-stream, or a line or event of its stream over 1 MiB
 * (lib/sse.ts), becomes a final error frame. When the result is cancelled
 * or `signal` aborts, the upstream body is cancelled at once, even mid-read
 * (the fetch's abort alone left a read already waiting pending in about
 * one run in six here, with Deno 2.9.6).
 */
export function normaliseStream(
  upstream: ReadableStream<Uint8Array> | ByteSource,
  req: StreamRequest,
  hooks: StreamHooks,
  signal?: AbortSignal,
): ReadableStream<Uint8Array> {
  const { kind, model, asked } = req;
  const enc = new TextEncoder();
  const object = kind === "chat" ? "chat.completion.chunk" : "text_completion";
  const state = new Choices(kind, asked);
  let id = "";
  let created = 0;
  let usage: Usage | null = null;
  // Caps as the gateway's on this node's own stream (1 MiB a line and an
  // event): an engine cannot make the node buffer more.
  const events = new SSEReader(upstream, { peer: "engine" });
  let stopped = false;
  const stop = () => {
    stopped = true;
    events.cancel(signal?.reason);
  };
  if (signal?.aborted) stop();
  else signal?.addEventListener("abort", stop, { once: true });
  let ended = false;
  const end = (u: Usage | null, e: OpenAIError | null) => {
    if (!ended) hooks.onEnd(u, e);
    ended = true;
    signal?.removeEventListener("abort", stop);
  };
  const chunk = (choices: Json[], extra: Json = {}) =>
    sseFrame({
      id: id ||= newId(kind),
      object,
      created: created ||= Math.floor(Date.now() / 1000),
      model,
      choices,
      ...extra,
    });
  /**
   * Frames made and not yet sent: the events of one upstream read go out
   * as one chunk (one write at each hop), not one each.
   */
  let pending = "";
  let first = true;
  const flush = (ctl: ReadableStreamDefaultController<Uint8Array>) => {
    if (pending === "") return;
    ctl.enqueue(enc.encode(pending));
    pending = "";
    if (first) {
      first = false;
      hooks.onFirst?.();
    }
  };

  /** Usage made here when the upstream sent none, and each choice's tokens. */
  const countUsage = async (): Promise<
    { usage: Usage; tokensOf: (i: number) => number }
  > => {
    const counter = await req.counter().catch(() => ESTIMATOR);
    const counts = state.counts(counter);
    const p = counter.prompt(req.request, kind);
    let n = 0;
    for (const c of counts.values()) n += c;
    return {
      usage: {
        prompt_tokens: p,
        completion_tokens: n,
        total_tokens: p + n,
        orchard_usage: counter.basis,
      },
      tokensOf: (i) => counts.get(i) ?? 0,
    };
  };

  /** Ends the stream; `drain` after the upstream's `[DONE]`, to read its body's end (the connection is then reused). */
  const finish = async (
    ctl: ReadableStreamDefaultController<Uint8Array>,
    error: OpenAIError | null,
    drain = false,
  ) => {
    if (error) pending += error.toSSE();
    else {
      let note = "";
      let tokensOf: (i: number) => number;
      if (usage) {
        const total = usage.completion_tokens;
        tokensOf = () => total;
      } else {
        flush(ctl); // what came goes out while the tokens are counted
        const made = await countUsage();
        if (ended) return; // cancelled meanwhile
        if (stopped) {
          end(usage, null);
          ctl.error(signal?.reason);
          return;
        }
        usage = made.usage;
        tokensOf = made.tokensOf;
        note = usage.orchard_usage === "counted"
          ? "usage counted by orchard with the model's tokenizer: the upstream reported none"
          : "usage estimated by orchard: the upstream reported none";
      }
      const closing = state.unfinished(tokensOf);
      if (closing.length) pending += chunk(closing);
      if (note) pending += sseComment(note);
      if (asked.logprobs && !state.sawLogprobs) {
        pending += sseComment("logprobs requested: the upstream sent none");
      }
      pending += chunk([], { usage });
    }
    pending += sseFrame("[DONE]");
    flush(ctl);
    ctl.close();
    end(usage, error);
    if (drain) await events.drain(DRAIN_MS);
    events.cancel();
  };

  return new ReadableStream<Uint8Array>({
    async pull(ctl) {
      try {
        // One upstream event at least, then those already read with it.
        let sent = false;
        for (;;) {
          const value = sent ? events.buffered() : await events.next();
          if (sent && value === null) return flush(ctl);
          if (stopped) {
            end(usage, null);
            ctl.error(signal?.reason);
            return;
          }
          if (value === null || value.trim() === "[DONE]") {
            return await finish(ctl, null, value !== null);
          }
          for (const j of parseData(value)) {
            const err = obj(j.error);
            if (
              err || typeof j.error === "string" || typeof j.detail === "string"
            ) {
              const status = int(err?.status) ?? int(err?.code) ?? 500;
              const fake = new Response(JSON.stringify(j), {
                status: status >= 400 && status <= 599 ? status : 500,
              });
              return await finish(ctl, await upstreamError(fake));
            }
            usage = normaliseUsage(j.usage) ?? usage;
            const raw = Array.isArray(j.choices) ? j.choices : [];
            if (raw.length === 0) continue; // usage-only: sent at the end
            id ||= typeof j.id === "string" && j.id ? j.id : newId(kind);
            created ||= int(j.created) ?? Math.floor(Date.now() / 1000);
            const choices = raw.map((c, i) => state.choice(obj(c) ?? {}, i));
            let tokens = 0;
            for (const c of choices) {
              const piece = generatedText(c, kind);
              if (!piece) continue;
              state.generated(c.index as number, piece);
              tokens += Math.max(1, estimateTokens(piece));
            }
            if (tokens) hooks.onTokens(tokens);
            const extra: Json = typeof j.system_fingerprint === "string"
              ? { system_fingerprint: j.system_fingerprint }
              : {};
            pending += chunk(choices, extra);
            sent = true;
          }
        }
      } catch (err) {
        const cause = err instanceof SSEError && err.kind === "closed"
          ? err.cause
          : err;
        if ((cause as Error)?.name === "AbortError") {
          end(usage, null);
          ctl.error(cause);
          return;
        }
        await finish(
          ctl,
          err instanceof OpenAIError ? err : new OpenAIError(
            502,
            "upstream_error",
            err instanceof SSEError && err.kind === "too_large"
              ? err.message
              : "The engine stream failed",
          ),
        );
      }
    },
    cancel() {
      if (!ended) hooks.onCancel?.();
      end(usage, null);
      stop();
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
