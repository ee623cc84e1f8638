/**
 * The node's own HTTP API, answering only its gateway: OpenAI-compatible
 * `/v1/models`, `/v1/chat/completions`, `/v1/completions`,
 * `/v1/embeddings`, plus `/health`, `POST /orchard/count_tokens` (a chat
 * request's prompt tokens, as billed), the gateway-driven link test and
 * `DELETE /orchard/requests/{id}` (the gateway cancelling a call it gave
 * up). Tracks requests in progress so a drain can report when it is done,
 * and so each one's engine work stops when nobody wants it (in_flight.ts).
 */
import { startSpan } from "../lib/trace.ts";
import { Hono } from "hono";
import { JsonBodyError, readJsonObject } from "../lib/json_body.ts";
import { OpenAIError, openAIErrorResponse } from "../protocol/openai/errors.ts";
import { log } from "../lib/log.ts";
import { type GatewayVerifier, requireGateway } from "./auth.ts";
import { type Engine, type OpenAIBody, watchBody } from "./engine.ts";
import { InFlight } from "./in_flight.ts";

/** Drain bookkeeping shared by the server and the heartbeat. */
export class DrainState {
  #requested = false;
  #active = 0;
  #onIdle: () => void;

  /** `onIdle` runs when a requested drain has no work left. */
  constructor(onIdle: () => void = () => {}) {
    this.#onIdle = onIdle;
  }

  /** Whether new work is refused. */
  get requested(): boolean {
    return this.#requested;
  }

  /** Requests in progress (streams count until they end). */
  get active(): number {
    return this.#active;
  }

  /** What the heartbeat reports. */
  get state(): "none" | "draining" | "drained" {
    if (!this.#requested) return "none";
    return this.#active === 0 ? "drained" : "draining";
  }

  /** Sets the drain flag as the gateway says (from heartbeat responses). */
  set(requested: boolean): void {
    const was = this.#requested;
    this.#requested = requested;
    if (requested && !was && this.#active === 0) this.#onIdle();
  }

  /** Marks a request started; the returned function marks it ended (idempotent). */
  begin(): () => void {
    this.#active++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.#active--;
      if (this.#requested && this.#active === 0) this.#onIdle();
    };
  }
}

/** The link test as the node server exposes it (from node/native). */
export interface LinkTester {
  /** Starts a one-shot listener; returns what the peer needs to connect. */
  listen(body: Record<string, unknown>): Promise<unknown>;
  /** Connects to a listener and measures; returns an `orchard.linktest/1` result. */
  connect(body: Record<string, unknown>): Promise<unknown>;
}

/** What the node server is built from. */
export interface NodeServerDeps {
  engine: Engine;
  verifier: GatewayVerifier;
  drain: DrainState;
  /** Largest request body accepted (default 4 MiB). */
  maxBodyBytes?: number;
  /** Absent when the native library is not available (then 501). */
  linktest?: LinkTester | null;
}

/** Reads a JSON object body of at most `max` bytes, failing in OpenAI's shape. */
async function readBody(req: Request, max: number): Promise<OpenAIBody> {
  try {
    return await readJsonObject(req, { maxBytes: max });
  } catch (e) {
    if (!(e instanceof JsonBodyError)) throw e;
    switch (e.problem) {
      case "too_large":
        throw new OpenAIError(
          413,
          "request_too_large",
          `Body is over ${max} bytes`,
        );
      case "unreadable":
        throw new OpenAIError(
          400,
          "invalid_body",
          "Cannot read the request body",
        );
      case "not_object":
        throw new OpenAIError(
          400,
          "invalid_request",
          "Body must be a JSON object",
        );
      default:
        throw new OpenAIError(400, "invalid_json", "Body is not valid JSON");
    }
  }
}

/**
 * Calls `done` when the response body has been sent or cancelled, and
 * `cancelled` first when it was cancelled (its reader went away). A body
 * that is not an event stream is whole already (engines answer JSON once
 * generated): it is done at once, not wrapped (a wrapper reads it through a
 * stream reader, ~100 µs a request). A stream an engine watches itself
 * (engine.ts `StreamWatch`) reports to these hooks; any other is read
 * through a wrapping stream.
 */
function track(
  res: Response,
  done: () => void,
  cancelled: () => void,
  firstChunk: () => void = () => {},
): Response {
  if (
    !res.body ||
    !(res.headers.get("content-type") ?? "").startsWith("text/event-stream")
  ) {
    firstChunk();
    done();
    return res;
  }
  if (watchBody(res, { first: firstChunk, cancelled, done })) return res;
  const reader = res.body.getReader();
  let first = true;
  const body = new ReadableStream<Uint8Array>({
    async pull(ctl) {
      try {
        const { value, done: end } = await reader.read();
        if (first) {
          first = false;
          firstChunk();
        }
        if (end) {
          ctl.close();
          done();
        } else ctl.enqueue(value);
      } catch (err) {
        done();
        ctl.error(err);
      }
    },
    async cancel(reason) {
      cancelled();
      done();
      await reader.cancel(reason);
    },
  });
  return new Response(body, { status: res.status, headers: res.headers });
}

/** Builds the node's HTTP app. */
export function createNodeApp(deps: NodeServerDeps): Hono {
  const { engine, drain } = deps;
  const max = deps.maxBodyBytes ?? 4 * 1024 * 1024;
  const inFlight = new InFlight();
  const app = new Hono();
  app.use("*", requireGateway(deps.verifier));

  app.get("/health", (c) =>
    c.json({
      status: engine.stats().healthy ? "ok" : "unhealthy",
      engine: engine.kind,
      drain: drain.state,
      stats: engine.stats(),
    }));
  app.get("/v1/models", async (c) => {
    const created = Math.floor(Date.now() / 1000);
    const data = (await engine.models()).filter((m) => m.servable !== false)
      .map((m) => ({
        id: m.id,
        object: "model",
        created,
        owned_by: "orchard",
        ...(m.contextLength ? { context_length: m.contextLength } : {}),
      }));
    return c.json({ object: "list", data });
  });

  const work = (
    call: (body: OpenAIBody, signal: AbortSignal) => Promise<Response>,
  ) =>
    async function generate(c: { req: { raw: Request } }): Promise<Response> {
      if (drain.requested) {
        throw new OpenAIError(503, "node_draining", "This node is draining", {
          headers: { "retry-after": "5" },
        });
      }
      const id = c.req.raw.headers.get("x-request-id");
      const req = inFlight.begin(
        id && id.length <= 128 ? id : null,
        c.req.raw.signal,
      );
      const drained = drain.begin();
      // The engine's time, as spans of the request's trace (lib/trace.ts):
      // waiting for a slot and its answer, then to the first chunk
      // (prefill), then to the end (decode).
      const attrs = { "orchard.engine": engine.kind };
      let phase = startSpan("orchard.engine.queue", attrs);
      const next = (name: string) => {
        phase.end();
        phase = startSpan(name, attrs);
      };
      let finished = false;
      const done = () => {
        if (finished) return;
        finished = true;
        phase.end();
        req.end();
        drained();
      };
      try {
        const body = await readBody(c.req.raw, max);
        phase.setAttribute("orchard.model", String(body.model ?? ""));
        const res = await call(body, req.signal);
        next("orchard.engine.prefill");
        return track(
          res,
          done,
          () => req.cancel(),
          () => next("orchard.engine.decode"),
        );
      } catch (err) {
        done();
        throw err;
      }
    };
  app.post(
    "/v1/chat/completions",
    work((b, s) => engine.chatCompletions(b, s)),
  );
  app.post("/v1/completions", work((b, s) => engine.completions(b, s)));
  app.post("/v1/embeddings", work((b, s) => engine.embeddings(b, s)));
  // The prompt tokens a chat request would be billed, without generating.
  app.post("/orchard/count_tokens", async (c) => {
    if (!engine.countTokens) {
      throw new OpenAIError(
        501,
        "not_supported",
        "This node's engine cannot count tokens",
      );
    }
    const body = await readBody(c.req.raw, max);
    const n = await engine.countTokens(body, c.req.raw.signal);
    return c.json({
      object: "token_count",
      model: String(body.model ?? ""),
      prompt_tokens: n.promptTokens,
      context_length: n.contextLength,
    });
  });
  // The gateway gave up on a call (timeout, client gone, its own stop).
  app.delete(
    "/orchard/requests/:id",
    (c) =>
      inFlight.cancel(c.req.param("id"))
        ? c.body(null, 204)
        : openAIErrorResponse(404, "not_found", "No such request in progress"),
  );

  app.post("/orchard/linktest/:step{listen|connect}", async (c) => {
    if (!deps.linktest) {
      throw new OpenAIError(501, "not_supported", "Link test is unavailable");
    }
    const body = await readBody(c.req.raw, 64 * 1024);
    const lt = deps.linktest;
    return c.json(
      c.req.param("step") === "listen"
        ? await lt.listen(body)
        : await lt.connect(body),
    );
  });

  app.notFound(() => openAIErrorResponse(404, "not_found", "Not found"));
  app.onError((err) => {
    if (err instanceof OpenAIError) return err.toResponse();
    log.error("node request failed", { error: String(err) });
    return openAIErrorResponse(500, "internal_error", "The node failed");
  });
  return app;
}
