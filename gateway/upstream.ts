/**
 * Calls a node: picks a slot through the router, applies the connect,
 * first-byte and total timeouts, and retries ONCE on another node when
 * nothing has been sent to the client yet (connection refused or broken
 * before the first event, 503 before the first byte).
 *
 * A call that ends while the node is still working for it (no answer yet,
 * or a stream not read to its end: a timeout, the client gone, `stop()`)
 * closes its connection and also tells the node by id
 * (`DELETE /orchard/requests/{requestId}`), since a node's server may not
 * notice the close while it has not answered yet (node/in_flight.ts).
 */
import { ContextLengthError, OpenAIError } from "../protocol/openai/errors.ts";
import {
  Http1Client,
  Http1Error,
  type Http1Response,
} from "../lib/http1_client.ts";
import type { Fleet } from "../fleet/types.ts";
import type { NodeRouter, RouteTenant, SlotGrant } from "./router.ts";
import { SSEError, SSEReader, type SSEReaderOptions } from "../lib/sse.ts";
import { after, cancel, race } from "./timers.ts";
import { traceparent, withSpan } from "../lib/trace.ts";
import { TOOL_GRAMMAR_HEADER } from "../protocol/openai/output_controls.ts";

/** Timeouts and caps of node calls, in ms and bytes. */
export interface ProxyOptions {
  /**
   * Until the request is written to the node (default 10 s). A stream's
   * headers then come within `firstByteTimeoutMs` (the node sends them
   * once its model took the request); a non-stream answer comes whole
   * after the generation: only the total timeout bounds it.
   */
  connectTimeoutMs: number;
  /** Until the first event or body byte (default 120 s: long prefill). */
  firstByteTimeoutMs: number;
  /** Longest silence between chunks of a stream (default 60 s). */
  idleTimeoutMs: number;
  /** Longest a whole request may take (default 10 min). */
  totalTimeoutMs: number;
  /** After this long without a first event, headers go out and `: ping` comments start (default 1 s). */
  pingDelayMs: number;
  /** Interval of `: ping` comments while waiting (default 5 s). */
  pingIntervalMs: number;
  /** Largest non-stream node response or stream event accepted (default 16 MiB / 1 MiB). */
  maxResponseBytes: number;
  maxEventBytes: number;
}

/** Defaults of `ProxyOptions`. */
export const DEFAULT_PROXY: ProxyOptions = {
  connectTimeoutMs: 10_000,
  firstByteTimeoutMs: 120_000,
  idleTimeoutMs: 60_000,
  totalTimeoutMs: 600_000,
  pingDelayMs: 1000,
  pingIntervalMs: 5000,
  maxResponseBytes: 16 << 20,
  maxEventBytes: 1 << 20,
};

/**
 * Node response headers the client gets too, each with the values it may
 * take: `x-orchard-tool-grammar` (the tools whose argument schemas the
 * node's grammar loosened, `loose=Name1,Name2`).
 */
const PASSED_ON: Record<string, RegExp> = {
  [TOOL_GRAMMAR_HEADER]:
    /^loose=[a-zA-Z0-9_-]{1,64}(,[a-zA-Z0-9_-]{1,64}){0,127}$/,
};

/** The node's headers in PASSED_ON, when well-formed. */
function passedOn(
  headers: { get(name: string): string | null },
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, ok] of Object.entries(PASSED_ON)) {
    const v = headers.get(name);
    if (v !== null && ok.test(v)) out[name] = v;
  }
  return out;
}

/** A node call in progress; `close()` ends it (aborting the node request if still open). */
export interface UpstreamCall {
  slot: SlotGrant;
  /** Node response headers to pass on to the client (see PASSED_ON). */
  notes: Record<string, string>;
  /** Aborts the node request; reason is recorded. */
  abort: AbortController;
  /** When the whole request must end (epoch ms). */
  deadline: number;
  close(): void;
}

/** A node's answer. */
export type UpstreamResult =
  | (UpstreamCall & { kind: "json"; json: Record<string, unknown> })
  | (UpstreamCall & {
    kind: "stream";
    reader: SSEReader;
    first: string | null;
  });

class Retryable extends Error {}

/**
 * Why a call's node request is aborted when the call ends before its
 * response was read (one instance: each `abort()` without a reason
 * captures a new DOMException's stack).
 */
const CALL_ENDED = new DOMException("The node call ended", "AbortError");

/** Why calls are aborted by `stop()`. */
const STOPPING = new DOMException("The gateway is stopping", "AbortError");

/** What a client gets for a call `stop()` ended or refused. */
export function stoppingError(): OpenAIError {
  return new OpenAIError(
    503,
    "service_unavailable",
    "The gateway is restarting; retry the request",
    { type: "server_error", headers: { "retry-after": "1" } },
  );
}

/** Whether a call was ended by `Upstream.stop()`. */
export function stoppedCall(call: UpstreamCall): boolean {
  return call.abort.signal.reason === STOPPING;
}

/** The abort reason of a call past its total timeout. */
const TOTAL_TIMEOUT = new DOMException("Total timeout", "TimeoutError");

/** How long a node may take to answer a cancellation. */
const CANCEL_TIMEOUT_MS = 5000;

/** Sends requests to nodes. */
export class Upstream {
  /** Keep-alive connections to the nodes (see lib/http1_client.ts for why not fetch). */
  readonly client = new Http1Client();
  /** Calls in progress (their abort controllers), for `stop()`. */
  readonly #calls = new Set<AbortController>();
  /** Cancellations sent to nodes and not yet answered. */
  readonly #cancels = new Set<Promise<void>>();
  #stopped = false;
  /** How node streams are read: the event cap bounds lines too; reads race the coarse timers. */
  readonly #sse: SSEReaderOptions;

  constructor(
    readonly fleet: Fleet,
    readonly router: NodeRouter,
    readonly opts: ProxyOptions,
  ) {
    this.#sse = {
      maxLine: opts.maxEventBytes,
      maxEvent: opts.maxEventBytes,
      peer: "node",
      race,
    };
  }

  /**
   * POSTs `body` to `path` on a node serving `model` (the conversation's
   * node for `affinity`: see gateway/router.ts); `stream` selects SSE
   * handling.
   */
  async call(
    model: string,
    path: string,
    body: string,
    stream: boolean,
    signal: AbortSignal,
    requestId: string,
    affinity: number | null = null,
    tenant: RouteTenant | null = null,
  ): Promise<UpstreamResult> {
    let exclude: string | null = null;
    let queuedMs = 0;
    for (let attempt = 0;; attempt++) {
      if (this.#stopped) throw stoppingError();
      const slot = await withSpan(
        "orchard.queue",
        { "orchard.model": model },
        () => this.router.acquire(model, signal, exclude, affinity, tenant),
      );
      // a retry's slot counts the first one's wait too
      slot.queuedMs = queuedMs += slot.queuedMs;
      if (this.#stopped) {
        slot.release();
        throw stoppingError();
      }
      try {
        return await withSpan(
          "orchard.node_call",
          { "orchard.node": slot.node.id, "orchard.attempt": attempt },
          () => this.#once(slot, path, body, stream, signal, requestId),
        );
      } catch (e) {
        slot.release();
        if (e instanceof Retryable && this.#stopped) throw stoppingError();
        if (e instanceof Retryable && attempt === 0 && !signal.aborted) {
          exclude = slot.node.id;
          if (this.fleet.candidates(model).some((n) => n.id !== exclude)) {
            continue;
          }
        }
        if (e instanceof Retryable) {
          // Nothing reached the client and no node took the work (refused,
          // busy, its engine down, broken off before the first event): a
          // retry is safe, and SDKs retry a 503, not a 502. A node whose
          // engine is down is reported unhealthy within a heartbeat (2 s).
          throw new OpenAIError(
            503,
            "model_unavailable",
            `No node could serve the model \`${
              model.slice(0, 256)
            }\` right now (${e.message}); retry shortly`,
            { type: "server_error", headers: { "retry-after": "2" } },
          );
        }
        throw e;
      }
    }
  }

  async #once(
    slot: SlotGrant,
    path: string,
    body: string,
    stream: boolean,
    signal: AbortSignal,
    requestId: string,
  ): Promise<UpstreamResult> {
    const o = this.opts;
    const abort = new AbortController();
    const deadline = Date.now() + o.totalTimeoutMs;
    // The node works for the call until it answers, and while a stream of
    // it is neither read to its end nor broken off (`done`: it cannot be,
    // or it answered whole).
    let head: Http1Response | null = null;
    let done = false;
    this.#calls.add(abort);
    abort.signal.addEventListener("abort", () => {
      this.#calls.delete(abort);
      if (!done && !head?.complete && !head?.brokeOff) {
        this.#cancelOnNode(slot.node.id, requestId);
      }
    }, { once: true });
    const onClient = () =>
      abort.abort(new DOMException("The client went away", "AbortError"));
    if (signal.aborted) onClient();
    signal.addEventListener("abort", onClient, { once: true });
    const total = after(o.totalTimeoutMs, () => abort.abort(TOTAL_TIMEOUT));
    let closed = false;
    const call: UpstreamCall = {
      slot,
      notes: {},
      abort,
      deadline,
      close() {
        if (closed) return;
        closed = true;
        cancel(total);
        signal.removeEventListener("abort", onClient);
        // Frees the node at once if its request is still open.
        if (!abort.signal.aborted) abort.abort(CALL_ENDED);
        slot.release();
      },
    };
    try {
      let sent = false;
      // Connect and write within the connect timeout; then a stream's
      // headers within the first-byte one: the node answers them once its
      // model took the request, which waits for the decode step in
      // progress (a long prompt's prefill chunk takes seconds on a CPU).
      const res = await withTimeout(
        withTimeout(
          this.#send(slot.node.id, path, body, requestId, abort.signal, () => {
            sent = true;
          }),
          o.connectTimeoutMs,
          () =>
            abort.abort(new DOMException("Connect timeout", "TimeoutError")),
          () => !sent,
        ),
        o.firstByteTimeoutMs,
        () =>
          abort.abort(new DOMException("First-byte timeout", "TimeoutError")),
        () => stream,
      ).catch((e) => {
        if (signal.aborted) throw e;
        if (abort.signal.reason === STOPPING) throw stoppingError();
        if (abort.signal.reason === TOTAL_TIMEOUT) {
          throw new OpenAIError(
            504,
            "timeout",
            `The node did not answer within the total timeout (${
              Math.round(o.totalTimeoutMs / 1000)
            } s)`,
            { type: "server_error" },
          );
        }
        done = !abort.signal.aborted; // refused or broken off: nothing runs
        throw new Retryable(
          e instanceof Error ? e.message : "connection failed",
        );
      });
      head = res;
      call.notes = passedOn(res.headers);
      const ct = res.headers.get("content-type") ?? "";
      done =
        !(stream && res.status === 200 && ct.includes("text/event-stream"));
      if (res.status === 503) {
        res.cancel();
        throw new Retryable("the node is busy or unavailable");
      }
      if (res.status !== 200) throw await nodeError(res, o.maxEventBytes);
      if (!done) {
        const reader = new SSEReader(res.reader(), this.#sse);
        let first: string | null = null;
        try {
          first = await reader.next(
            Math.min(o.pingDelayMs, o.firstByteTimeoutMs),
          );
        } catch (e) {
          if (!(e instanceof SSEError && e.kind === "timeout")) {
            reader.cancel();
            throw new Retryable(
              "the node's stream broke off before the first event",
            );
          }
          // Long prefill: the handler sends headers and pings, and keeps waiting.
        }
        if (first === null && reader.ended) {
          throw new Retryable("the node's stream ended before the first event");
        }
        return Object.assign(call, { kind: "stream" as const, reader, first });
      }
      const json = await readJson(res, o);
      return Object.assign(call, { kind: "json" as const, json });
    } catch (e) {
      cancel(total);
      signal.removeEventListener("abort", onClient);
      if (!abort.signal.aborted) abort.abort(CALL_ENDED);
      closed = true;
      throw e;
    }
  }

  /**
   * Ends every call in progress (each one's node is told to stop) and
   * refuses new ones with 503: the end of a graceful stop's drain.
   */
  stop(): void {
    this.#stopped = true;
    for (const abort of [...this.#calls]) abort.abort(STOPPING);
  }

  /** Resolves once the cancellations sent to nodes have been answered (or timed out). */
  async idle(): Promise<void> {
    while (this.#cancels.size > 0) await Promise.allSettled([...this.#cancels]);
  }

  /** Tells a node to stop working for a call this gateway gave up (best effort). */
  #cancelOnNode(nodeId: string, requestId: string): void {
    const abort = new AbortController();
    const timeout = after(CANCEL_TIMEOUT_MS, () => abort.abort(CALL_ENDED));
    const p = (async () => {
      const target = await this.fleet.nodeTarget(nodeId);
      const res = await this.client.request(
        target.url,
        `/orchard/requests/${encodeURIComponent(requestId)}`,
        { method: "DELETE", headers: target.headers, signal: abort.signal },
      );
      await res.text(4096);
    })()
      .catch(() => {}) // unreachable: its connection's close is all it gets
      .finally(() => {
        cancel(timeout);
        this.#cancels.delete(p);
      });
    this.#cancels.add(p);
  }

  /** Sends the request to the node (the target's headers first: ours win). */
  async #send(
    nodeId: string,
    path: string,
    body: string,
    requestId: string,
    signal: AbortSignal,
    onSent: () => void,
  ): Promise<Http1Response> {
    const target = await this.fleet.nodeTarget(nodeId);
    const parent = traceparent(); // the node's spans join this trace
    return await this.client.request(target.url, path, {
      method: "POST",
      headers: {
        ...target.headers,
        "content-type": "application/json",
        "x-request-id": requestId,
        ...(parent ? { traceparent: parent } : {}),
      },
      body,
      signal,
      onSent,
    });
  }
}

/** `p`, or after `ms` (when `applies()` still holds then) `onTimeout()` and a rejection. */
async function withTimeout<T>(
  p: Promise<T>,
  ms: number,
  onTimeout: () => void,
  applies: () => boolean = () => true,
): Promise<T> {
  const r = await race(p, ms);
  if (r !== "timeout") return r;
  if (!applies()) return await p;
  onTimeout();
  throw new Error(`no answer within ${ms} ms`);
}

/** Reads a body with a size cap and the first-byte/total deadline. */
async function readJson(
  res: Http1Response,
  o: ProxyOptions,
): Promise<Record<string, unknown>> {
  const text = await readCapped(res, o.maxResponseBytes, o.firstByteTimeoutMs);
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw new OpenAIError(
      502,
      "upstream_error",
      "The node sent a malformed response",
    );
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    throw new OpenAIError(
      502,
      "upstream_error",
      "The node sent a malformed response",
    );
  }
  return v as Record<string, unknown>;
}

const responseTooLarge = () =>
  new OpenAIError(502, "upstream_error", "The node's response is too large");
const responseBrokeOff = () =>
  new OpenAIError(502, "upstream_error", "The node's response broke off");

/** Reads a whole body of at most `max` bytes within `timeoutMs`. */
async function readCapped(
  res: Http1Response,
  max: number,
  timeoutMs: number,
): Promise<string> {
  try {
    return await withTimeout(res.text(max), timeoutMs, () => res.cancel());
  } catch (e) {
    if (e instanceof Http1Error && e.kind === "too_large") {
      throw responseTooLarge();
    }
    throw responseBrokeOff();
  }
}

const PASS_STATUS = new Set([400, 404, 408, 413, 422, 429]);

/** Turns a node's non-200 answer into an OpenAIError, keeping only well-formed fields (a context_length_exceeded keeps its numbers). */
export async function nodeError(
  res: Http1Response,
  max: number,
): Promise<OpenAIError> {
  let message = `The node answered ${res.status}`;
  let code: string | null = null;
  let param: string | null = null;
  try {
    const text = await readCapped(res, max, 5000);
    const body = JSON.parse(text) as {
      error?: { message?: unknown; code?: unknown; param?: unknown };
    };
    const err = body?.error;
    if (err && typeof err === "object") {
      if (typeof err.message === "string") message = err.message.slice(0, 1000);
      if (typeof err.code === "string" || typeof err.code === "number") {
        code = String(err.code).slice(0, 100);
      }
      if (typeof err.param === "string") param = err.param.slice(0, 100);
    }
  } catch { /* keep the generic message */ }
  if (res.status === 400 && code === "context_length_exceeded") {
    const e = ContextLengthError.fromHeaders(res.headers, param);
    if (e) return e;
  }
  if (PASS_STATUS.has(res.status)) {
    const headers: Record<string, string> = {};
    const ra = res.headers.get("retry-after");
    if (ra && /^\d{1,5}$/.test(ra)) headers["retry-after"] = ra;
    return new OpenAIError(res.status, code, message, { param, headers });
  }
  return new OpenAIError(502, "upstream_error", `The node failed: ${message}`);
}
