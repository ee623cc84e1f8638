/**
 * Relays a node's SSE stream to the client as exact OpenAI chunks: `: ping`
 * comments while the node is still in prefill, the node's usage chunk
 * stripped (re-emitted, billed, only with `stream_options.include_usage`),
 * a final `data: {"error":…}` frame after any failure, and usage billed for
 * what was delivered when the node or the client goes away.
 */
import { OpenAIError } from "../protocol/openai/errors.ts";
import type { Exchange } from "./core.ts";
import type { ReportedUsage } from "./normalise.ts";
import { SSEError } from "../lib/sse.ts";
import { stoppedCall, stoppingError, type UpstreamResult } from "./upstream.ts";

type StreamCall = UpstreamResult & { kind: "stream" };

/** The events a stream relay produces, rendered by an output format (OpenAI or Anthropic). */
export interface StreamSink {
  /**
   * Called for each node payload; returns text to send (or null). Throws to
   * end with an error. A sink returns a promise only where it must wait
   * before its next events (sealing reasoning with jose): the relay awaits
   * it before the next payload, so events keep their order.
   */
  data(payload: string): string | null | Promise<string | null>;
  /** Text sent after the last node event, once usage is billed. */
  end(): string;
  /** The terminal frame for an error. */
  error(e: OpenAIError): string;
  /** A keep-alive comment. */
  ping(): string;
  /**
   * Awaited once usage is billed and before `end()`, when the stream ended
   * well (not after an error or with the client gone): what must be done
   * before the client sees the end (a stored response). It must not throw.
   */
  complete?(): Promise<void>;
  /** Whether the last `data` delivered generated text (first-token time). */
  readonly sawText: boolean;
  /** Billing figures gathered so far. */
  readonly reported: ReportedUsage | null;
  readonly counted: number;
  readonly chunks: number;
}

const ENC = new TextEncoder();

/** Why a relay stopped early, as the client sees it. */
function streamError(e: unknown, call: StreamCall): OpenAIError {
  if (e instanceof OpenAIError) return e;
  if (stoppedCall(call)) return stoppingError();
  const reason = call.abort.signal.reason as DOMException | undefined;
  if (
    reason?.name === "TimeoutError" ||
    (e instanceof SSEError && e.kind === "timeout")
  ) {
    return new OpenAIError(
      504,
      "timeout",
      "The node stopped responding in time",
      { type: "server_error" },
    );
  }
  if (e instanceof SSEError && e.kind === "too_large") {
    return new OpenAIError(502, "upstream_error", e.message, {
      type: "server_error",
    });
  }
  return new OpenAIError(502, "upstream_error", "The node's stream broke off", {
    type: "server_error",
  });
}

/** How long the end of a node's body may take to come after its `[DONE]`. */
const DRAIN_MS = 100;

/** Builds the streaming Response relaying `call` through `sink`. */
export function relayStream(
  ex: Exchange,
  call: StreamCall,
  sink: StreamSink,
  headers: Record<string, string>,
): Response {
  const o = ex.core.proxy;
  let cancelled = false;
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      const send = (s: string | null) => {
        if (s === null || s === "" || cancelled) return;
        try {
          controller.enqueue(ENC.encode(s));
        } catch {
          cancelled = true;
        }
      };
      let err: OpenAIError | null = null;
      let done = false;
      /** Frames made from the node's events and not yet sent (see below). */
      let pending = "";
      try {
        let data = call.first;
        if (data === null && !call.reader.ended) {
          send(sink.ping());
          const until = ex.t0 + o.firstByteTimeoutMs;
          for (;;) {
            const left = until - performance.now();
            if (left <= 0) {
              throw new SSEError("timeout", "no first event");
            }
            try {
              data = await call.reader.next(Math.min(o.pingIntervalMs, left));
              break;
            } catch (e) {
              if (!(e instanceof SSEError && e.kind === "timeout")) {
                throw e;
              }
              send(sink.ping());
            }
          }
        }
        while (data !== null) {
          if (data === "[DONE]") {
            done = true;
            break;
          }
          let out = sink.data(data);
          if (typeof out === "object" && out !== null) out = await out;
          if (sink.sawText) ex.firstToken();
          if (out !== null) pending += out;
          // The events that came in the same read go out in one write.
          data = call.reader.buffered();
          if (data !== null) continue;
          send(pending);
          pending = "";
          if (cancelled) break;
          data = await call.reader.next(
            Math.min(o.idleTimeoutMs, call.deadline - Date.now()),
          );
        }
        if (!done && !cancelled) {
          throw new SSEError("closed", "ended without [DONE]");
        }
      } catch (e) {
        if (!cancelled) err = streamError(e, call);
      }
      ex.bill(sink.reported, sink.counted, sink.chunks);
      ex.outcome = cancelled ? "cancelled" : err ? "error" : "ok";
      if (err) ex.error = { code: err.code, type: err.type };
      if (err) {
        ex.core.log.warn("stream ended with an error", {
          requestId: ex.requestId,
          node: ex.nodeId,
          code: err.code,
        });
      }
      if (!done) {
        call.reader.cancel();
        call.close();
      }
      if (!err && !cancelled && sink.complete) await sink.complete();
      send(pending + (err ? sink.error(err) : sink.end()));
      if (!cancelled) {
        try {
          controller.close();
        } catch { /* already closed */ }
      }
      if (done) {
        // The client has everything: read the node body's end (nearly
        // always here already) so the connection is reused.
        await call.reader.drain(DRAIN_MS);
        call.reader.cancel();
        call.close();
      }
      ex.finish();
    },
    cancel() {
      cancelled = true;
      call.abort.abort(new DOMException("The client went away", "AbortError"));
    },
  });
  return new Response(body, {
    status: 200,
    headers: {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      "x-accel-buffering": "no",
      ...headers,
    },
  });
}
