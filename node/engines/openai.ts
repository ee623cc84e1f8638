/**
 * The `openai` engine: fronts an OpenAI-compatible server on the Mac (Exo,
 * mlx_lm.server, llama-server, Ollama, vLLM). It discovers the upstream's
 * models and serves only those that actually answer a probe; one listed
 * that does not (Exo lists every model card it knows, downloaded or not) is
 * reported as not servable and probed again with backoff (_probes.ts). It
 * forwards requests with a slot limit, and returns exact OpenAI shapes (see
 * openai_shapes.ts and openai_stream.ts), with usage counted with the
 * model's tokenizer (or estimated) when the upstream reports none
 * (tokens.ts).
 *
 * Request fields reach the upstream unchanged (`tools`, `tool_choice`,
 * `parallel_tool_calls`, `response_format`, `logprobs`, `top_logprobs`, …;
 * only `stream_options.include_usage` is forced on for streams). What the
 * upstream cannot do is its answer to give: a 4xx from it is passed on as
 * an OpenAI error, and logprobs it does not send come back null (with an
 * `x-orchard-logprobs: missing` header or an SSE comment) rather than made up.
 */
import { Http1Client, type Http1Response } from "../../lib/http1_client.ts";
import { log } from "../../lib/log.ts";
import { OpenAIError } from "../../protocol/openai/errors.ts";
import {
  type Engine,
  type OpenAIBody,
  StreamWatch,
  watchedResponse,
} from "../engine.ts";
import type { EngineModel, EngineStats } from "../../protocol/engine.ts";
import { SlotLimiter, TokenMeter } from "./_load.ts";
import {
  listingSignature,
  ProbeBackoff,
  type ProbeBackoffOptions,
} from "./_probes.ts";
import {
  askedOf,
  hasUsage,
  type Json,
  type Kind,
  normaliseCompletion,
  normaliseUsage,
  upstreamError,
} from "./openai_shapes.ts";
import { normaliseStream } from "./openai_stream.ts";
import { exoInstances, parseExoNodeId } from "./exo_state.ts";
import type { SpanningInstance } from "../../protocol/engine.ts";
import { ESTIMATOR, TokenCounters, type TokenizerSearch } from "./tokens.ts";

/** Most models reported to the gateway (the heartbeat's limit): servable ones first. */
const MAX_REPORTED_MODELS = 256;

/** Options of `createOpenAIEngine`. */
export interface OpenAIEngineOptions {
  /** Base URL of the upstream, with or without `/v1`. */
  upstreamUrl: string;
  /** Bearer key for the upstream, if it wants one. */
  apiKey?: string;
  /** Concurrent upstream requests (default: what the engine reports, else DEFAULT_SLOTS). */
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
  /**
   * Re-probing of a listed model whose probe failed (default: after 30 s,
   * then doubling up to 10 min), and the clock it uses.
   */
  probeBackoff?: ProbeBackoffOptions;
  /** Where models' tokenizers are looked for (default: tokens.ts `defaultTokenizerSearch`). */
  tokenizerSearch?: TokenizerSearch;
}

/**
 * Slots when neither `--slots` nor the engine says: the engines a node
 * fronts batch or queue requests themselves (Exo, MLX, vLLM, Ollama), so
 * the node lets enough through that its own queue is not where clients
 * wait (with 4, 32 concurrent streams waited 850 ms for a first byte).
 */
const DEFAULT_SLOTS = 16;

/**
 * The parallel sequences the engine reports, where it does: llama-server's
 * `GET /props` (`total_slots`, its `--parallel`). Null when it does not say.
 */
async function engineSlots(
  client: Http1Client,
  base: string,
  headers: Record<string, string>,
  life: AbortSignal,
): Promise<number | null> {
  const root = base.replace(/\/v1$/, "");
  try {
    const res = await client.request(root, "/props", {
      method: "GET",
      headers,
      signal: AbortSignal.any([life, AbortSignal.timeout(5000)]),
    });
    if (!ok(res)) {
      res.cancel();
      return null;
    }
    const props = await json(res) as { total_slots?: unknown };
    const n = props.total_slots;
    return typeof n === "number" && Number.isInteger(n) && n >= 1 && n <= 256
      ? n
      : null;
  } catch {
    return null;
  }
}

/** Largest Exo `/state` body read (it carries every node's profile, downloads and tasks). */
const MAX_EXO_STATE_BYTES = 16 * 1024 * 1024;

/**
 * Exo's instances by model id when the upstream is Exo (it answers
 * `GET /node_id` and `GET /state`: exo_state.ts), else null.
 */
async function readExo(
  client: Http1Client,
  root: string,
  headers: Record<string, string>,
  life: AbortSignal,
): Promise<Map<string, SpanningInstance> | null> {
  const get = async (path: string, max: number): Promise<unknown> => {
    const res = await client.request(root, path, {
      method: "GET",
      headers,
      signal: AbortSignal.any([life, AbortSignal.timeout(10_000)]),
    });
    const length = Number(res.headers.get("content-length") ?? NaN);
    if (!ok(res) || length > max) {
      res.cancel();
      return undefined;
    }
    const text = await res.text();
    return text.length > max ? undefined : JSON.parse(text);
  };
  try {
    const selfId = parseExoNodeId(await get("/node_id", 1024));
    if (selfId === null) return null;
    const state = await get("/state", MAX_EXO_STATE_BYTES);
    return state === undefined ? null : exoInstances(state, selfId);
  } catch {
    return null;
  }
}

const ok = (res: Http1Response) => res.status >= 200 && res.status < 300;
const json = async (res: Http1Response): Promise<unknown> =>
  JSON.parse(await res.text());

/** Creates the engine (call `start()` before use). */
export function createOpenAIEngine(opts: OpenAIEngineOptions): Engine {
  const base = opts.upstreamUrl.replace(/\/+$/, "").replace(/\/v1$/, "") +
    "/v1";
  const limiter = new SlotLimiter(
    opts.slots ?? DEFAULT_SLOTS,
    opts.maxQueue ?? 4 * (opts.slots ?? DEFAULT_SLOTS),
  );
  const meter = new TokenMeter();
  const refreshMs = opts.refreshMs ?? 30_000;
  const recheckMs = opts.recheckMs ?? 1000;
  const probeTimeoutMs = opts.probeTimeoutMs ?? 30_000;
  const verify = opts.verifyModels ?? true;
  let served = new Map<string, EngineModel>();
  /** Exo's running instances by model id (null: the upstream is not Exo). */
  let exo: Map<string, SpanningInstance> | null = null;
  /** Listed but not answering: reported as not servable. */
  let unservable = new Map<string, EngineModel>();
  /** Each listed model's names a tokenizer may be found under (its id, the repo ids its entry gives). */
  let names = new Map<string, string[]>();
  const verified = new Map<string, EngineModel["kind"]>();
  const backoff = new ProbeBackoff(opts.probeBackoff);
  const now = opts.probeBackoff?.now ?? Date.now;
  const counters = new TokenCounters({ search: opts.tokenizerSearch, now });
  let health: { healthy: boolean; detail?: string } = {
    healthy: false,
    detail: "not started",
  };
  let timer: ReturnType<typeof setTimeout> | undefined;
  let closed = false;
  const life = new AbortController();

  // The gateway's HTTP/1.1 client (lib/http1_client.ts), not fetch: per
  // request it costs the node ~200 µs of CPU less at 200 streams/s (a
  // stream's pieces reach the SSE reader without a ReadableStream under
  // them), and every engine fronted here speaks HTTP/1.1.
  const client = new Http1Client();
  const headers: Record<string, string> = {
    "content-type": "application/json",
    ...(opts.apiKey ? { authorization: `Bearer ${opts.apiKey}` } : {}),
  };

  function post(
    path: string,
    body: unknown,
    signal: AbortSignal,
  ): Promise<Http1Response> {
    return client.request(base, path, {
      headers,
      body: JSON.stringify(body),
      signal,
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
      res?.cancel();
      if (res && ok(res)) return kind;
    }
    return null;
  }

  async function discover(): Promise<void> {
    const res = await client.request(base, "/models", {
      method: "GET",
      headers,
      signal: AbortSignal.any([life.signal, AbortSignal.timeout(10_000)]),
    });
    if (!ok(res)) {
      res.cancel();
      throw new Error(`GET /v1/models answered ${res.status}`);
    }
    const listing = await json(res) as { data?: unknown };
    const entries = new Map<string, Json>();
    for (const m of Array.isArray(listing.data) ? listing.data : []) {
      const e = (m ?? {}) as Json;
      if (typeof e.id === "string" && e.id.length > 0 && !entries.has(e.id)) {
        entries.set(e.id, e);
      }
    }
    backoff.retain(new Set(entries.keys()));
    const next = new Map<string, EngineModel>();
    const notServed = new Map<string, EngineModel>();
    const nextNames = new Map<string, string[]>();
    for (const [id, entry] of entries) {
      nextNames.set(id, namesOf(id, entry));
      let kind = verified.get(id) ?? (verify ? null : "chat");
      const listing = listingSignature(entry);
      if (!kind && backoff.due(id, listing)) {
        const wasFailing = backoff.failing(id);
        kind = await probe(id);
        if (closed) return;
        if (kind) {
          verified.set(id, kind);
          backoff.succeeded(id);
          if (wasFailing) log.info("upstream model is servable now", { id });
        } else {
          const failures = backoff.failed(id, listing);
          const nextProbeInS = Math.round(
            ((backoff.nextProbeAt(id) ?? now()) - now()) / 1000,
          );
          // said once: Exo lists every model card it knows
          if (failures === 1) {
            log.info("upstream model is listed but not servable", {
              id,
              nextProbeInS,
            });
          } else {
            log.debug("upstream model still not servable", {
              id,
              failures,
              nextProbeInS,
            });
          }
        }
      }
      if (kind) next.set(id, { id, loaded: true, kind });
      else {
        notServed.set(id, {
          id,
          loaded: false,
          kind: /embed/i.test(id) ? "embedding" : "chat",
          servable: false,
        });
      }
    }
    for (const id of verified.keys()) if (!next.has(id)) verified.delete(id);
    served = next;
    unservable = notServed;
    names = nextNames;
    counters.retain(new Set(next.keys()));
  }

  /** The names a model's tokenizer may be found under: its id, and the repo ids its listing gives (Exo's `hugging_face_id`, vLLM's `root`). */
  function namesOf(id: string, entry: Json): string[] {
    const out = [id];
    for (const k of ["hugging_face_id", "huggingface_id", "root"]) {
      const v = entry[k];
      if (typeof v === "string" && v && !out.includes(v)) out.push(v);
    }
    return out;
  }

  function counterOf(model: string) {
    return counters.get(model, names.get(model) ?? [model]);
  }

  async function refresh(): Promise<void> {
    try {
      await discover();
      exo = await readExo(
        client,
        base.replace(/\/v1$/, ""),
        headers,
        life.signal,
      );
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
    if (unservable.has(model)) {
      const at = backoff.nextProbeAt(model) ?? now();
      const wait = Math.min(600, Math.max(1, Math.ceil((at - now()) / 1000)));
      throw new OpenAIError(
        503,
        "model_unavailable",
        `The model '${
          model.slice(0, 200)
        }' is listed by this node's engine but cannot be served now (not downloaded or not loaded)`,
        { type: "server_error", headers: { "retry-after": String(wait) } },
      );
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
      if (!ok(res)) throw await upstreamError(res);
      const asked = askedOf(body, kind);
      if (!stream) {
        const answer = await json(res) as Json;
        // the tokenizer is loaded only when the upstream reports no usage
        const counter = hasUsage(answer) ? ESTIMATOR : await counterOf(model);
        const { body: out, usage, basis, logprobsMissing } =
          normaliseCompletion(answer, kind, model, body, asked, counter);
        meter.add(usage.completion_tokens);
        const h: Record<string, string> = {};
        if (basis) h["x-orchard-usage"] = basis;
        if (logprobsMissing) h["x-orchard-logprobs"] = "missing";
        return Response.json(out, { headers: h });
      }
      const done = release;
      release = undefined; // the stream releases the slot when it ends
      const watch = new StreamWatch();
      let counted = 0;
      const sse = normaliseStream(res.reader(), {
        kind,
        model,
        request: body,
        asked,
        counter: () => counterOf(model),
      }, {
        onTokens(n) {
          counted += n;
          meter.add(n);
        },
        onEnd(usage) {
          if (usage) meter.add(usage.completion_tokens - counted);
          done();
          watch.done();
        },
        onFirst: () => watch.first(),
        onCancel: () => watch.cancelled(),
      }, signal); // aborted: the upstream request closes as its slot is freed
      return watchedResponse(
        new Response(sse, {
          headers: {
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
          },
        }),
        watch,
      );
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
      if (opts.slots === undefined) {
        const reported = await engineSlots(client, base, headers, life.signal);
        if (reported !== null) {
          limiter.resize(reported, opts.maxQueue ?? 4 * reported);
          log.info("slots from the engine", { slots: reported });
        }
      }
      schedule();
    },
    models() {
      const room = Math.max(0, MAX_REPORTED_MODELS - served.size);
      const instances = exo;
      return Promise.resolve([
        ...(instances
          ? [...served.values()].map((m) => {
            const instance = instances.get(m.id);
            return instance ? { ...m, instance } : m;
          })
          : served.values()),
        ...[...unservable.values()].slice(0, room),
      ]);
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
        if (!ok(res)) throw await upstreamError(res);
        const answer = await json(res) as {
          data?: unknown[];
          usage?: unknown;
        };
        const base64 = body.encoding_format === "base64";
        const data = (answer.data ?? []).map((d, i) => {
          const e = d as { index?: number; embedding?: number[] };
          const vec = Array.isArray(e.embedding) ? e.embedding : [];
          return {
            object: "embedding",
            index: typeof e.index === "number" ? e.index : i,
            embedding: base64 ? toBase64(vec) : vec,
          };
        });
        const u = normaliseUsage(answer.usage);
        const counter = u ? null : await counterOf(model);
        const p = u?.prompt_tokens ?? counter!.prompt(body, "embedding");
        return Response.json({
          object: "list",
          data,
          model,
          usage: {
            prompt_tokens: p,
            total_tokens: p,
            ...(counter ? { orchard_usage: counter.basis } : {}),
          },
        }, {
          headers: counter ? { "x-orchard-usage": counter.basis } : {},
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
      client.closeIdle();
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
