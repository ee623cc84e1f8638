/**
 * The OpenAI endpoints: chat completions, completions, embeddings (float
 * and base64) and models. Each handler authenticates, validates, resolves
 * the model, admits against limits, then relays to a node.
 */
import { OpenAIError } from "../protocol/openai/errors.ts";
import { JsonBodyError, readJsonObject } from "../lib/json_body.ts";
import { sseComment, sseFrame } from "../lib/sse.ts";
import { Exchange, type GatewayCore } from "./core.ts";
import {
  ChunkNormaliser,
  malformed,
  normaliseCompletion,
  readUsage,
  usageObject,
} from "./normalise.ts";
import { relayStream, type StreamSink } from "./stream.ts";
import { parseChat, parseCompletion, parseEmbeddings } from "./validate.ts";
import { modelAllowed } from "./auth.ts";
import { affinityOf } from "./affinity.ts";
import { CapacityError, routeTenant } from "./router.ts";

const DONE = sseFrame("[DONE]");
const PING = sseComment("ping");

/** Relays OpenAI chunks, stripping the node's usage chunk unless asked for. */
export class OpenAISink implements StreamSink {
  sawText = false;
  constructor(
    readonly norm: ChunkNormaliser,
    readonly ex: Exchange,
    readonly includeUsage: boolean,
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
  data(payload: string): string | null {
    const before = this.norm.chunks;
    const out = this.norm.push(payload);
    this.sawText = this.norm.chunks > before;
    return out === null ? null : sseFrame(out);
  }
  end(): string {
    const basis = this.ex.usageBasis;
    // headers are long gone: a stream says it in a comment, and in its usage chunk
    const note = basis ? `: x-orchard-usage: ${basis}\n\n` : "";
    const usage = this.includeUsage
      ? sseFrame(
        this.norm.usageChunk(
          this.ex.promptTokens,
          this.ex.completionTokens,
          this.ex.cachedTokens,
          basis,
        ),
      )
      : "";
    return note + usage + DONE;
  }
  error(e: OpenAIError): string {
    return e.toSSE();
  }
  ping(): string {
    return PING;
  }
}

/** The deepest JSON nesting a `/v1/*` body may have. */
export const MAX_JSON_DEPTH = 64;

/** Reads a `/v1/*` JSON object body within the configured cap (`fail` maps its errors). */
export function readBody(
  core: GatewayCore,
  req: Request,
): Promise<Record<string, unknown>> {
  return readJsonObject(req, {
    maxBytes: core.deps.config.maxBodyBytes,
    maxDepth: MAX_JSON_DEPTH,
  });
}

/** The OpenAI error for a body that cannot be read as a JSON object. */
function bodyError(e: JsonBodyError): OpenAIError {
  const invalid = (message: string) =>
    new OpenAIError(400, "invalid_json", message);
  switch (e.problem) {
    case "too_large":
      return new OpenAIError(
        413,
        "request_too_large",
        `The request body is larger than the limit of ${e.limit} bytes`,
      );
    case "unreadable":
      return new OpenAIError(
        400,
        "invalid_body",
        "Cannot read the request body",
      );
    case "not_utf8":
      return invalid("The request body is not valid UTF-8");
    case "too_deep":
      return invalid(
        `The request body nests deeper than ${MAX_JSON_DEPTH} levels`,
      );
    case "not_object":
      return invalid("The request body must be a JSON object");
    default:
      return invalid(
        "We could not parse the JSON body of your request. The OpenAI API expects a JSON payload",
      );
  }
}

/** Turns any failure into the client's error response, settling and metering first. */
export function fail(
  ex: Exchange,
  e: unknown,
  render?: (e: OpenAIError) => Response,
): Response {
  let err: OpenAIError;
  if (e instanceof OpenAIError) err = e;
  else if (e instanceof JsonBodyError) err = bodyError(e);
  else if (e instanceof DOMException && e.name === "AbortError") {
    err = new OpenAIError(
      499,
      "client_closed_request",
      "The client closed the request",
    );
  } else {
    ex.core.log.error("request failed", {
      requestId: ex.requestId,
      error: String(e),
    });
    err = new OpenAIError(
      500,
      "internal_error",
      "The gateway failed to handle the request",
      { type: "server_error" },
    );
  }
  ex.status = err.status;
  ex.outcome = err.status === 499 ? "cancelled" : "error";
  ex.error = { code: err.code, type: err.type };
  if (e instanceof CapacityError) ex.refusedFor(e);
  if (!ex.nodeId) ex.core.metrics.rejected(err.code ?? err.type, err.status);
  ex.finish();
  const res = render ? render(err) : err.toResponse();
  for (const [k, v] of Object.entries(ex.headers)) {
    if (!res.headers.has(k)) res.headers.set(k, v);
  }
  res.headers.set("x-request-id", ex.requestId);
  return res;
}

function json(ex: Exchange, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status: 200,
    headers: {
      "content-type": "application/json",
      ...ex.headers,
      ...(ex.usageBasis ? { "x-orchard-usage": ex.usageBasis } : {}),
      "x-request-id": ex.requestId,
    },
  });
}

/** `POST /v1/chat/completions` and `POST /v1/completions`. */
export async function completions(
  core: GatewayCore,
  req: Request,
  requestId: string,
  kind: "chat" | "completions",
): Promise<Response> {
  const ex = new Exchange(core, requestId, kind);
  try {
    const ctx = await ex.authenticate(req, "chat");
    const body = await readBody(core, req);
    const p = kind === "chat" ? parseChat(body) : parseCompletion(body);
    const m = core.resolveModel(ctx, p.model, "chat");
    ex.model = m.id;
    const cap = await ex.admit(ctx, p, m);
    const unclamped = p.maxTokens ?? m.contextLength;
    if (unclamped === null || cap < unclamped) body.max_tokens = cap;
    body.model = m.id;
    if (p.stream) body.stream_options = { include_usage: true };
    const path = kind === "chat" ? "/v1/chat/completions" : "/v1/completions";
    const up = await core.upstream.call(
      m.id,
      path,
      JSON.stringify(body),
      p.stream,
      req.signal,
      requestId,
      affinityOf(body),
      routeTenant(ctx),
    );
    ex.routed(up.slot, up.notes);
    if (up.kind === "stream") {
      const sink = new OpenAISink(
        new ChunkNormaliser(kind, m.id),
        ex,
        p.includeUsage,
      );
      return relayStream(ex, up, sink, {
        ...ex.headers,
        "x-request-id": requestId,
      });
    }
    up.close();
    if (p.stream) throw malformed("stream (not text/event-stream)");
    const r = normaliseCompletion(up.json, kind, m.id);
    ex.firstToken();
    ex.bill(r.reported, r.counted, Math.ceil(r.counted / 4));
    up.json.usage = usage(ex);
    ex.finish();
    return json(ex, up.json);
  } catch (e) {
    return fail(ex, e);
  }
}

function usage(ex: Exchange) {
  return usageObject(
    ex.promptTokens,
    ex.completionTokens,
    ex.cachedTokens,
    ex.usageBasis,
  );
}

/** Encodes floats as base64 of little-endian float32, as OpenAI does. */
export function floatsToBase64(v: number[]): string {
  const f = new Float32Array(v);
  const bytes = new Uint8Array(f.buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

/** `POST /v1/embeddings`. */
export async function embeddings(
  core: GatewayCore,
  req: Request,
  requestId: string,
): Promise<Response> {
  const ex = new Exchange(core, requestId, "embeddings");
  try {
    const ctx = await ex.authenticate(req, "embeddings");
    const body = await readBody(core, req);
    const p = parseEmbeddings(body);
    const m = core.resolveModel(ctx, p.model, "embedding");
    ex.model = m.id;
    await ex.admit(ctx, p, null);
    body.model = m.id;
    const up = await core.upstream.call(
      m.id,
      "/v1/embeddings",
      JSON.stringify(body),
      false,
      req.signal,
      requestId,
      null,
      routeTenant(ctx),
    );
    ex.routed(up.slot, up.notes);
    up.close();
    if (up.kind !== "json") throw malformed("embeddings response");
    const data = up.json.data;
    if (!Array.isArray(data) || data.length !== p.inputs) {
      throw malformed("embeddings response");
    }
    const out = data.map((d, i) => {
      const e = (d as { embedding?: unknown })?.embedding;
      if (
        !Array.isArray(e) ||
        !e.every((x) => typeof x === "number" && Number.isFinite(x))
      ) {
        throw malformed("embedding");
      }
      return {
        object: "embedding",
        index: i,
        embedding: p.encoding === "base64" ? floatsToBase64(e) : e,
      };
    });
    ex.firstToken();
    ex.bill(
      readUsage({ completion_tokens: 0, ...(up.json.usage as object) }),
      0,
      0,
    );
    ex.completionTokens = 0;
    ex.finish();
    const u = {
      prompt_tokens: ex.promptTokens,
      total_tokens: ex.promptTokens,
      ...(ex.usageBasis ? { orchard_usage: ex.usageBasis } : {}),
    };
    return json(ex, { object: "list", data: out, model: m.id, usage: u });
  } catch (e) {
    return fail(ex, e);
  }
}

const STARTED = Math.floor(Date.now() / 1000);

/** `GET /v1/models` and `GET /v1/models/{id}`: models the key may use and a healthy node serves. */
export async function models(
  core: GatewayCore,
  req: Request,
  requestId: string,
  id: string | null,
): Promise<Response> {
  const ex = new Exchange(core, requestId, "chat");
  try {
    const ctx = await ex.authenticate(req, "models");
    const list = core.fleet.servedModels().filter((m) =>
      modelAllowed(ctx, m.id, m.id) ||
      m.aliases.some((a) => modelAllowed(ctx, m.id, a))
    );
    // context_length: tokens per request on the nodes serving it (the
    // smallest, when they differ), as OpenRouter and vLLM list it
    const view = (m: { id: string; contextLength?: number }) => ({
      id: m.id,
      object: "model",
      created: STARTED,
      owned_by: "orchard",
      ...(m.contextLength ? { context_length: m.contextLength } : {}),
    });
    // The operator's aliases are listed as models of their own (a client
    // picks a name from this list); a node's own aliases resolve but are not listed.
    const served = new Set(list.map((m) => m.id));
    const aliased = [...(core.fleet.operatorAliases?.() ?? [])]
      .filter(([alias, target]) =>
        served.has(target) && !served.has(alias) &&
        modelAllowed(ctx, target, alias)
      ).map(([alias, target]) => ({
        id: alias,
        contextLength: list.find((m) => m.id === target)?.contextLength,
      }));
    if (id === null) {
      return json(ex, {
        object: "list",
        data: [...list, ...aliased].sort((a, b) => a.id < b.id ? -1 : 1)
          .map(view),
      });
    }
    const alias = aliased.find((a) => a.id === id);
    if (alias) return json(ex, view(alias));
    const resolved = core.fleet.resolveModel(id);
    const m = list.find((x) => x.id === resolved);
    if (!m) {
      throw new OpenAIError(
        404,
        "model_not_found",
        `The model \`${
          id.slice(0, 256)
        }\` does not exist or you do not have access to it.`,
        { param: "model" },
      );
    }
    return json(ex, view(m));
  } catch (e) {
    return fail(ex, e);
  }
}
