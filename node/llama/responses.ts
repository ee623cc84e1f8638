/**
 * Child-process events → OpenAI responses: chat and text completions,
 * streamed (always ending with the usage chunk, then `data: [DONE]`) or
 * whole, and embeddings (float or base64).
 */
import { OpenAIError } from "../../lib/openai_errors.ts";
import { sseFrame } from "../engines/_sse.ts";
import type { RequestEvent } from "./process.ts";

export type Kind = "chat" | "text";

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

function ids(kind: Kind) {
  return {
    id: `${kind === "chat" ? "chatcmpl" : "cmpl"}-${
      crypto.randomUUID().replaceAll("-", "")
    }`,
    created: Math.floor(Date.now() / 1000),
  };
}

function usage(prompt: number, completion: number) {
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
  };
}

function chunk(
  kind: Kind,
  base: { id: string; created: number; model: string },
  text: string | null,
  finish: string | null,
) {
  if (kind === "chat") {
    return {
      ...base,
      object: "chat.completion.chunk",
      system_fingerprint: null,
      choices: [{
        index: 0,
        delta: text === null
          ? (finish ? {} : { role: "assistant", content: "" })
          : { content: text },
        logprobs: null,
        finish_reason: finish,
      }],
    };
  }
  return {
    ...base,
    object: "text_completion",
    choices: [{
      index: 0,
      text: text ?? "",
      logprobs: null,
      finish_reason: finish,
    }],
  };
}

/** An SSE response fed by the queue; `cancel` stops generation when the client leaves. */
export function streamResponse(
  kind: Kind,
  model: string,
  q: EventQueue,
  cancel: () => void,
): Response {
  const base = { ...ids(kind), model };
  const enc = new TextEncoder();
  let finished = false;
  let sentText = false;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      if (kind === "chat") {
        c.enqueue(enc.encode(sseFrame(chunk(kind, base, null, null))));
      }
    },
    async pull(c) {
      const e = await q.nextWithin(PING_MS);
      if (!e) {
        if (!sentText) c.enqueue(enc.encode(": ping\n\n"));
        return;
      }
      if (e.ev === "text") {
        sentText = true;
        if (e.text) {
          c.enqueue(enc.encode(sseFrame(chunk(kind, base, e.text, null))));
        }
        return;
      }
      finished = true;
      if (e.ev === "done") {
        c.enqueue(enc.encode(
          sseFrame(chunk(kind, base, kind === "chat" ? null : "", e.finish)) +
            sseFrame({
              ...base,
              object: kind === "chat"
                ? "chat.completion.chunk"
                : "text_completion",
              choices: [],
              usage: usage(e.promptTokens, e.completionTokens),
            }),
        ));
      } else if (e.ev === "error") {
        c.enqueue(
          enc.encode(new OpenAIError(e.status, e.code, e.message).toSSE()),
        );
      }
      c.enqueue(enc.encode("data: [DONE]\n\n"));
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
    },
  });
}

/** Collects the whole generation into one JSON response. */
export async function completeResponse(
  kind: Kind,
  model: string,
  q: EventQueue,
): Promise<Response> {
  const base = { ...ids(kind), model };
  let text = "";
  while (true) {
    const e = await q.next();
    if (e.ev === "text") text += e.text;
    else if (e.ev === "error") {
      throw new OpenAIError(e.status, e.code, e.message);
    } else if (e.ev === "done") {
      const u = usage(e.promptTokens, e.completionTokens);
      const body = kind === "chat"
        ? {
          ...base,
          object: "chat.completion",
          system_fingerprint: null,
          choices: [{
            index: 0,
            message: { role: "assistant", content: text, refusal: null },
            logprobs: null,
            finish_reason: e.finish,
          }],
          usage: u,
        }
        : {
          ...base,
          object: "text_completion",
          choices: [{
            index: 0,
            text,
            logprobs: null,
            finish_reason: e.finish,
          }],
          usage: u,
        };
      return Response.json(body);
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
