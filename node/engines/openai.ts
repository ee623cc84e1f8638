/**
 * The `openai` engine: fronts an OpenAI-compatible server on the Mac (Exo,
 * mlx_lm.server, llama-server, Ollama, vLLM). It discovers the upstream's
 * models and keeps only those that actually answer, forwards requests with
 * a slot limit, and returns exact OpenAI shapes (see openai_shapes.ts and
 * openai_stream.ts).
 *
 * Request fields reach the upstream unchanged (`tools`, `tool_choice`,
 * `parallel_tool_calls`, `response_format`, `logprobs`, `top_logprobs`, …;
 * only `stream_options.include_usage` is forced on for streams). What the
 * upstream cannot do is its answer to give: a 4xx from it is passed on as
 * an OpenAI error, and logprobs it does not send come back null (with an
 * `x-orchard-logprobs: missing` header or an SSE comment) rather than made up.
 */
import { log } from "../../lib/log.ts";
import { OpenAIError } from "../../lib/openai_errors.ts";
import type {
  Engine,
  EngineModel,
  EngineStats,
  OpenAIBody,
} from "../engine.ts";
import { SlotLimiter, TokenMeter } from "./_load.ts";
import {
  askedOf,
  type Kind,
  normaliseCompletion,
  normaliseUsage,
  promptText,
  upstreamError,
} from "./openai_shapes.ts";
import { normaliseStream } from "./openai_stream.ts";

/** Options of `createOpenAIEngine`. */
export interface OpenAIEngineOptions {
  /** Base URL of the upstream, with or without `/v1`. */
  upstreamUrl: string;
  /** Bearer key for the upstream, if it wants one. */
  apiKey?: string;
  /** Concurrent upstream requests (default 4). */
  slots?: number;
  /** Requests that may wait for a slot before 503 (default 4 × slots). */
  maxQueue?: number;
  /** How often models are re-discovered (default 30 s). */
  refreshMs?: number;
  /**
   * While the upstream is down, how often it is checked again (default
   * 1 s): a call that cannot connect marks it down at once, so the next
   * heartbeat reports the node unhealthy and the gateway routes elsewhere.
   */
  recheckMs?: number;
  /** Probe each listed model with a 1-token request (default true). */
  verifyModels?: boolean;
  /** Timeout of each probe request (default 30 s). */
  probeTimeoutMs?: number;
}

/** Creates the engine (call `start()` before use). */
export function createOpenAIEngine(opts: OpenAIEngineOptions): Engine {
  const base = opts.upstreamUrl.replace(/\/+$/, "").replace(/\/v1$/, "") +
    "/v1";
  const limiter = new SlotLimiter(
    opts.slots ?? 4,
    opts.maxQueue ?? 4 * (opts.slots ?? 4),
  );
  const meter = new TokenMeter();
  const refreshMs = opts.refreshMs ?? 30_000;
  const recheckMs = opts.recheckMs ?? 1000;
  const probeTimeoutMs = opts.probeTimeoutMs ?? 30_000;
  const verify = opts.verifyModels ?? true;
  let served = new Map<string, EngineModel>();
  const verified = new Map<string, EngineModel["kind"]>();
  let health: { healthy: boolean; detail?: string } = {
    healthy: false,
    detail: "not started",
  };
  let timer: ReturnType<typeof setTimeout> | undefined;
  let closed = false;
  const life = new AbortController();

  function headers(): Headers {
    const h = new Headers({ "content-type": "application/json" });
    if (opts.apiKey) h.set("authorization", `Bearer ${opts.apiKey}`);
    return h;
  }

  function post(
    path: string,
    body: unknown,
    signal: AbortSignal,
  ): Promise<Response> {
    return fetch(base + path, {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal,
      redirect: "manual",
    });
  }

  async function probe(id: string): Promise<EngineModel["kind"] | null> {
    const tries: [EngineModel["kind"], string, unknown][] = [
      ["chat", "/chat/completions", {
        model: id,
        messages: [{ role: "user", content: "ping" }],
        max_tokens: 1,
        stream: false,
      }],
      ["embedding", "/embeddings", { model: id, input: "ping" }],
    ];
    if (/embed/i.test(id)) tries.reverse();
    for (const [kind, path, body] of tries) {
      const signal = AbortSignal.any([
        life.signal,
        AbortSignal.timeout(probeTimeoutMs),
      ]);
      const res = await post(path, body, signal).catch(() => null);
      await res?.body?.cancel();
      if (res?.ok) return kind;
    }
    return null;
  }

  async function discover(): Promise<void> {
    const res = await fetch(base + "/models", {
      headers: headers(),
      signal: AbortSignal.any([life.signal, AbortSignal.timeout(10_000)]),
      redirect: "manual",
    });
    if (!res.ok) {
      await res.body?.cancel();
      throw new Error(`GET /v1/models answered ${res.status}`);
    }
    const json = await res.json() as { data?: { id?: unknown }[] };
    const ids = (json.data ?? []).map((m) => m.id).filter((
      id,
    ): id is string => typeof id === "string" && id.length > 0);
    const next = new Map<string, EngineModel>();
    for (const id of ids) {
      let kind = verified.get(id) ?? null;
      if (!kind) {
        kind = verify ? await probe(id) : "chat";
        if (kind) verified.set(id, kind);
        else log.info("upstream model is listed but not servable", { id });
      }
      if (kind) next.set(id, { id, loaded: true, kind });
    }
    for (const id of verified.keys()) if (!next.has(id)) verified.delete(id);
    served = next;
  }

  async function refresh(): Promise<void> {
    try {
      await discover();
      health = { healthy: true };
    } catch (err) {
      health = {
        healthy: false,
        detail: `upstream ${base} unreachable: ${(err as Error).message}`,
      };
    }
  }

  /** The next refresh: soon while the upstream is down, else after refreshMs. */
  function schedule() {
    if (closed) return;
    clearTimeout(timer);
    timer = setTimeout(
      () => refresh().finally(schedule),
      health.healthy ? refreshMs : recheckMs,
    );
  }

  /**
   * A call could not reach the upstream (refused, reset, DNS): it is down
   * now, not at the next refresh; checked again every recheckMs until it
   * answers.
   */
  function unreachable(err: unknown): void {
    const was = health.healthy;
    health = {
      healthy: false,
      detail: `upstream ${base} unreachable: ${(err as Error)?.message ?? err}`,
    };
    if (was) {
      log.warn("upstream unreachable; rechecking every second", {
        upstream: base,
      });
      schedule();
    }
  }

  function modelOf(body: OpenAIBody): string {
    const model = body.model;
    if (typeof model !== "string" || !model) {
      throw new OpenAIError(400, "invalid_request", "model is required", {
        param: "model",
      });
    }
    if (!served.has(model)) {
      throw new OpenAIError(
        404,
        "model_not_found",
        `The model '${model.slice(0, 200)}' does not exist on this node`,
        { param: "model" },
      );
    }
    return model;
  }

  async function generate(
    kind: Kind,
    body: OpenAIBody,
    signal: AbortSignal,
  ): Promise<Response> {
    let release: (() => void) | undefined;
    try {
      const model = modelOf(body);
      release = await limiter.acquire(signal);
      const stream = body.stream === true;
      const up: OpenAIBody = { ...body, model };
      if (stream) {
        up.stream_options = {
          ...(body.stream_options as object ?? {}),
          include_usage: true,
        };
      }
      const path = kind === "chat" ? "/chat/completions" : "/completions";
      const res = await post(path, up, signal).catch((err) => {
        if (signal.aborted) throw err;
        unreachable(err);
        throw new OpenAIError(503, "engine_unavailable", "Engine unreachable", {
          headers: { "retry-after": "1" },
        });
      });
      if (!res.ok) throw await upstreamError(res);
      const prompt = promptText(body);
      const asked = askedOf(body, kind);
      if (!stream || !res.body) {
        const { body: out, usage, estimated, logprobsMissing } =
          normaliseCompletion(await res.json(), kind, model, prompt, asked);
        meter.add(usage.completion_tokens);
        const h: Record<string, string> = {};
        if (estimated) h["x-orchard-usage"] = "estimated";
        if (logprobsMissing) h["x-orchard-logprobs"] = "missing";
        return Response.json(out, { headers: h });
      }
      const done = release;
      release = undefined; // the stream releases the slot when it ends
      let counted = 0;
      const sse = normaliseStream(res.body, kind, model, prompt, asked, {
        onTokens(n) {
          counted += n;
          meter.add(n);
        },
        onEnd(usage) {
          if (usage) meter.add(usage.completion_tokens - counted);
          done();
        },
      }, signal); // aborted: the upstream request closes as its slot is freed
      return new Response(sse, {
        headers: {
          "content-type": "text/event-stream",
          "cache-control": "no-cache",
        },
      });
    } catch (err) {
      if (err instanceof OpenAIError) return err.toResponse();
      throw err;
    } finally {
      release?.();
    }
  }

  return {
    kind: "openai",
    async start() {
      await refresh();
      if (!health.healthy) {
        throw new Error(`Cannot start the openai engine: ${health.detail}`);
      }
      schedule();
    },
    models() {
      return Promise.resolve([...served.values()]);
    },
    chatCompletions: (body, signal) => generate("chat", body, signal),
    completions: (body, signal) => generate("text", body, signal),
    async embeddings(body, signal) {
      let release: (() => void) | undefined;
      try {
        const model = modelOf(body);
        release = await limiter.acquire(signal);
        const res = await post("/embeddings", {
          ...body,
          model,
          encoding_format: "float",
        }, signal).catch((err) => {
          if (signal.aborted) throw err;
          unreachable(err);
          throw new OpenAIError(
            503,
            "engine_unavailable",
            "Engine unreachable",
          );
        });
        if (!res.ok) throw await upstreamError(res);
        const json = await res.json() as { data?: unknown[]; usage?: unknown };
        const base64 = body.encoding_format === "base64";
        const data = (json.data ?? []).map((d, i) => {
          const e = d as { index?: number; embedding?: number[] };
          const vec = Array.isArray(e.embedding) ? e.embedding : [];
          return {
            object: "embedding",
            index: typeof e.index === "number" ? e.index : i,
            embedding: base64 ? toBase64(vec) : vec,
          };
        });
        const u = normaliseUsage(json.usage);
        const p = u?.prompt_tokens ??
          Math.max(1, Math.ceil(promptText(body).length / 4));
        return Response.json({
          object: "list",
          data,
          model,
          usage: { prompt_tokens: p, total_tokens: p },
        });
      } catch (err) {
        if (err instanceof OpenAIError) return err.toResponse();
        throw err;
      } finally {
        release?.();
      }
    },
    stats(): EngineStats {
      return {
        inFlight: limiter.inFlight,
        queued: limiter.queued,
        slots: limiter.slots,
        tokensPerSecond: meter.rate(),
        ...health,
      };
    },
    close() {
      closed = true;
      clearTimeout(timer);
      life.abort();
      return Promise.resolve();
    },
  };
}

function toBase64(vec: number[]): string {
  const bytes = new Uint8Array(new Float32Array(vec).buffer);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin);
}
