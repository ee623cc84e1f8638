/**
 * Child-process events → OpenAI responses: chat and text completions,
 * streamed (always ending with the usage chunk, then `data: [DONE]`) or
 * whole, and embeddings (float or base64).
 */
import { OpenAIError } from "../../protocol/openai/errors.ts";
import { sseComment, sseFrame } from "../../lib/sse.ts";
import {
  ChoiceCollector,
  type ChoiceOutput,
  type ChoicePiece,
  type Kind,
} from "./choice_output.ts";
import type { RequestEvent } from "./process.ts";

export type { Kind } from "./choice_output.ts";

/** An async queue of one request's events. */
export class EventQueue {
  #items: RequestEvent[] = [];
  #wait: ((e: RequestEvent | null) => void) | null = null;

  push(e: RequestEvent) {
    if (this.#wait) {
      const w = this.#wait;
      this.#wait = null;
      w(e);
    } else this.#items.push(e);
  }

  /** The next event; or null after `ms` without one. */
  nextWithin(ms: number): Promise<RequestEvent | null> {
    const e = this.#items.shift();
    if (e) return Promise.resolve(e);
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.#wait = null;
        resolve(null);
      }, ms);
      this.#wait = (e) => {
        clearTimeout(t);
        resolve(e);
      };
    });
  }

  /** The next event. */
  async next(): Promise<RequestEvent> {
    while (true) {
      const e = await this.nextWithin(60_000);
      if (e) return e;
    }
  }
}

const PING_MS = 5_000;
const PING = sseComment("ping");
const DONE = sseFrame("[DONE]");

function ids(kind: Kind) {
  return {
    id: `${kind === "chat" ? "chatcmpl" : "cmpl"}-${
      crypto.randomUUID().replaceAll("-", "")
    }`,
    created: Math.floor(Date.now() / 1000),
  };
}

/** OpenAI usage, with the prompt tokens that came from the prefix cache. */
function usage(prompt: number, completion: number, cached: number) {
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: cached },
  };
}

type Base = { id: string; created: number; model: string };

function chunk(
  kind: Kind,
  base: Base,
  piece: ChoicePiece | null,
  finish: string | null,
) {
  if (kind === "chat") {
    return {
      ...base,
      object: "chat.completion.chunk",
      system_fingerprint: null,
      choices: [{
        index: 0,
        delta: piece?.delta ??
          (finish ? {} : { role: "assistant", content: "" }),
        logprobs: piece?.logprobs ?? null,
        finish_reason: finish,
      }],
    };
  }
  return {
    ...base,
    object: "text_completion",
    choices: [{
      index: 0,
      text: piece?.text ?? "",
      logprobs: piece?.logprobs ?? null,
      finish_reason: finish,
    }],
  };
}

/** An SSE response fed by the queue; `cancel` stops generation when the client leaves. */
export function streamResponse(
  out: ChoiceOutput,
  model: string,
  q: EventQueue,
  cancel: () => void,
  headers: Record<string, string> = {},
): Response {
  const kind = out.kind;
  const base = { ...ids(kind), model };
  const enc = new TextEncoder();
  let finished = false;
  const frames = (pieces: ChoicePiece[]) =>
    pieces.map((p) => sseFrame(chunk(kind, base, p, null))).join("");
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      if (kind === "chat") {
        c.enqueue(enc.encode(sseFrame(chunk(kind, base, null, null))));
      }
    },
    // each pull enqueues something or ends the stream: a pull that
    // returns empty-handed is not called again
    async pull(c) {
      let e = await q.nextWithin(PING_MS);
      while (e?.ev === "text") {
        const text = frames(out.text(e.text, e.logprobs));
        if (text) return c.enqueue(enc.encode(text));
        e = await q.nextWithin(PING_MS);
      }
      if (!e) {
        c.enqueue(enc.encode(PING));
        return;
      }
      finished = true;
      if (e.ev === "done") {
        c.enqueue(enc.encode(
          frames(out.end()) +
            sseFrame(
              chunk(
                kind,
                base,
                kind === "chat" ? { delta: {}, logprobs: null } : null,
                out.finishReason(e.finish),
              ),
            ) +
            sseFrame({
              ...base,
              object: kind === "chat"
                ? "chat.completion.chunk"
                : "text_completion",
              choices: [],
              usage: usage(e.promptTokens, e.completionTokens, e.cachedTokens),
            }),
        ));
      } else if (e.ev === "error") {
        c.enqueue(
          enc.encode(new OpenAIError(e.status, e.code, e.message).toSSE()),
        );
      }
      c.enqueue(enc.encode(DONE));
      c.close();
    },
    cancel() {
      if (!finished) cancel();
    },
  }, { highWaterMark: 0 });
  return new Response(body, {
    headers: {
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
      ...headers,
    },
  });
}

/** Collects the whole generation into one JSON response. */
export async function completeResponse(
  out: ChoiceOutput,
  model: string,
  q: EventQueue,
  headers: Record<string, string> = {},
): Promise<Response> {
  const kind = out.kind;
  const base = { ...ids(kind), model };
  const all = new ChoiceCollector();
  while (true) {
    const e = await q.next();
    if (e.ev === "text") {
      for (const p of out.text(e.text, e.logprobs)) all.add(p);
    } else if (e.ev === "error") {
      throw new OpenAIError(e.status, e.code, e.message);
    } else if (e.ev === "done") {
      for (const p of out.end()) all.add(p);
      const u = usage(e.promptTokens, e.completionTokens, e.cachedTokens);
      const logprobs = all.logprobs(kind, out.logprobs);
      const finish_reason = out.finishReason(e.finish);
      const body = kind === "chat"
        ? {
          ...base,
          object: "chat.completion",
          system_fingerprint: null,
          choices: [{
            index: 0,
            message: {
              role: "assistant",
              content: all.calls.length && !all.content ? null : all.content,
              ...(all.reasoning ? { reasoning_content: all.reasoning } : {}),
              refusal: null,
              ...(all.calls.length ? { tool_calls: all.calls } : {}),
            },
            logprobs,
            finish_reason,
          }],
          usage: u,
        }
        : {
          ...base,
          object: "text_completion",
          choices: [{
            index: 0,
            text: all.content,
            logprobs,
            finish_reason,
          }],
          usage: u,
        };
      return Response.json(body, { headers });
    }
  }
}

/** `POST /v1/embeddings` response. */
export function embeddingResponse(
  model: string,
  vectors: number[][],
  tokens: number,
  base64: boolean,
): Response {
  return Response.json({
    object: "list",
    model,
    data: vectors.map((v, index) => ({
      object: "embedding",
      index,
      embedding: base64 ? floatsToBase64(v) : v,
    })),
    usage: { prompt_tokens: tokens, total_tokens: tokens },
  });
}

function floatsToBase64(v: number[]): string {
  const bytes = new Uint8Array(new Float32Array(v).buffer);
  let bin = "";
  for (let i = 0; i < bytes.length; i++) bin += String.fromCharCode(bytes[i]!);
  return btoa(bin);
}
