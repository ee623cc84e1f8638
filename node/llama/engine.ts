/**
 * The `llama` engine: GGUF models from a directory, each served by its own
 * supervised child process (node/llama/child.ts) with continuous batching
 * over `slots` sequences, behind the OpenAI shapes of node/engine.ts.
 */
import { log } from "../../lib/log.ts";
import {
  ContextLengthError,
  OpenAIError,
} from "../../protocol/openai/errors.ts";
import type { Engine, OpenAIBody } from "../engine.ts";
import type {
  EngineModel,
  EngineStats,
  LlamaRuntime,
  PromptOverhead,
  ReasoningFacts,
  TokenCount,
} from "../../protocol/engine.ts";
import type { PlacedModel, SpanAssignment } from "../../protocol/placement.ts";
import type {
  InstanceMember,
  SpanningInstance,
} from "../../protocol/engine.ts";
import { rpcServerPath } from "./rpc.ts";
import { RpcServerProcess } from "./rpc_server.ts";
import { readLlamaManifest } from "../native/llama_build.ts";
import { SlotLimiter, TokenMeter } from "../engines/_load.ts";
import {
  availableMemory,
  memoryBytes,
  type MemorySpec,
} from "../memory_spec.ts";
import { defaultContext } from "./kv_budget.ts";
import { type CatalogEntry, resolveModel, scanModels } from "./catalog.ts";
import {
  ChatTemplate,
  measureOverhead,
  TemplateError,
} from "./chat_template.ts";
import { ChoiceOutput } from "./choice_output.ts";
import { HarmonySplitter } from "./harmony.ts";
import {
  grammarAfterThinking,
  opensThinking,
  reasoningSplitter,
  reasoningVars,
} from "./reasoning.ts";
import { outputGrammar } from "./constraints.ts";
import {
  TOOL_GRAMMAR_HEADER,
  toolGrammarNote,
} from "../../protocol/openai/output_controls.ts";
import { checkLibraries, ModelProcess } from "./process.ts";
import type { LoadedModel, RpcLoad } from "./protocol.ts";
import {
  type GenerationRequest,
  parseChat,
  parseCompletion,
  parseEmbeddings,
} from "./requests.ts";
import {
  completeResponse,
  embeddingResponse,
  EventQueue,
  type Kind,
  streamResponse,
} from "./responses.ts";
import { detectToolFamily, ToolCallParser } from "./tool_calls.ts";

/** Options of `createLlamaEngine`. */
export interface LlamaEngineOptions {
  /** Folder of `*.gguf` files (and optional `<id>.json` sidecars). */
  modelsDir: string;
  /** Concurrent sequences per model (default 4). */
  slots?: number;
  /** CPU threads per model (default: all cores). */
  threads?: number;
  /**
   * Context tokens per sequence (default: the model's trained context,
   * bounded by `kvMemory`: see kv_budget.ts).
   */
  contextSize?: number;
  /**
   * Most tokens one request generates, and what it generates when it names
   * no `max_tokens` (llama-server's `--n-predict`); default: up to the
   * context. A model's sidecar `maxOutputTokens` overrides it.
   */
  maxOutputTokens?: number | null;
  /** Memory all slots' KV caches of one model may take (default 50 % of what is available after its weights). */
  kvMemory?: MemorySpec;
  /** Host memory for KV-cache prefixes evicted from slots, per model (default 2 GiB of what is available, 0: none). */
  prefixCacheMemory?: MemorySpec;
  /** Requests waiting for a slot per model before 503 (default 4 × slots). */
  maxQueue?: number;
  /** Unload a model after this long without requests (default 15 min; 0 never). */
  idleUnloadMs?: number;
  /** Load every model at start instead of on first use. */
  preload?: boolean;
}

interface Loaded {
  entry: CatalogEntry;
  limiter: SlotLimiter;
  proc: ModelProcess | null;
  loading: Promise<ModelProcess> | null;
  lastUsed: number;
  restarts: number;
  /** Times of recent crashes, for restart back-off. */
  crashes: number[];
  /** The span layout the running process was loaded with (spanKey), if any. */
  spanKey?: string | null;
  /** What its process reported of the RPC split once loaded. */
  spanLoaded?: LoadedModel["rpc"] | null;
  /** The GGUF's Jinja chat template, compiled (null: none, or one our renderer cannot parse). */
  template?: ChatTemplate | null;
}

/** Creates the llama engine; `start()` checks the libraries and scans the models. */
export function createLlamaEngine(opts: LlamaEngineOptions): LlamaEngine {
  return new LlamaEngine(opts);
}

/** The llama engine; beyond `Engine`, it reports batching and its processes. */
export class LlamaEngine implements Engine {
  readonly kind = "llama" as const;
  #opts:
    & Required<
      Omit<
        LlamaEngineOptions,
        "contextSize" | "kvMemory" | "prefixCacheMemory" | "maxOutputTokens"
      >
    >
    & Pick<
      LlamaEngineOptions,
      "contextSize" | "kvMemory" | "prefixCacheMemory" | "maxOutputTokens"
    >;
  /** Default context per catalog entry (path:mtime:slots), computed once. */
  #contexts = new Map<string, number>();
  #catalog = new Map<string, CatalogEntry>();
  #scannedAt = 0;
  #state = new Map<string, Loaded>();
  #templateFactsCache = new Map<
    string,
    Pick<EngineModel, "promptOverhead" | "reasoning">
  >();
  #meter = new TokenMeter();
  #peakBatch = 0;
  #healthy = false;
  #detail: string | undefined = "not started";
  #timer: ReturnType<typeof setInterval> | undefined;
  #closed = false;
  /** The operator's placement: model id → pinned; null when none applies. */
  #desired: Map<string, boolean> | null = null;
  /** Why a pinned model failed to load, and when (retried after PLACE_RETRY_MS). */
  #placeErrors = new Map<string, { error: string; at: number }>();
  /** Which llama.cpp `start` found. */
  #runtime: LlamaRuntime | null = null;
  #libDir: string | null = null;
  /** This node's part in a spanning placement (head or worker), and its id. */
  #span: { a: SpanAssignment; nodeId: string } | null = null;
  /** The worker role's RPC server, while placed as a worker. */
  #rpcServer: RpcServerProcess | null = null;
  #rpcStarting: Promise<void> | null = null;
  #rpcError: string | null = null;

  constructor(o: LlamaEngineOptions) {
    const slots = o.slots ?? 4;
    if (!(Number.isInteger(slots) && slots >= 1 && slots <= 256)) {
      throw new RangeError(
        `Cannot create llama engine: slots must be 1 to 256: current value is ${slots}`,
      );
    }
    const threads = o.threads ??
      Math.max(1, navigator.hardwareConcurrency || 1);
    if (!(Number.isInteger(threads) && threads >= 1)) {
      throw new RangeError(
        `Cannot create llama engine: threads must be ≥ 1: current value is ${threads}`,
      );
    }
    this.#opts = {
      modelsDir: o.modelsDir,
      slots,
      threads,
      contextSize: o.contextSize,
      maxOutputTokens: o.maxOutputTokens ?? null,
      kvMemory: o.kvMemory,
      prefixCacheMemory: o.prefixCacheMemory,
      maxQueue: o.maxQueue ?? slots * 4,
      idleUnloadMs: o.idleUnloadMs ?? 15 * 60_000,
      preload: o.preload ?? false,
    };
  }

  async start(): Promise<void> {
    const lib = await checkLibraries();
    const built = lib.build === "built" ? readLlamaManifest(lib.libDir) : null;
    this.#libDir = lib.libDir;
    this.#runtime = {
      build: built ? "built" : "prebuilt",
      version: lib.version,
      tag: built?.tag ?? null,
      commit: built?.commit ?? null,
      rpc: !!built?.rpc,
      rdma: !!built?.rdma.enabled,
    };
    log.info("llama.cpp ready", {
      version: lib.version,
      libDir: lib.libDir,
      build: this.#runtime.build,
      ...(built ? { rpc: true, rdma: built.rdma.detail } : {
        hint:
          "prebuilt package libraries, without RPC: `deno task build:native` builds llama.cpp with RPC",
      }),
      threads: this.#opts.threads,
    });
    await this.#rescan(true);
    if (this.#catalog.size === 0) {
      log.info("no GGUF models yet", {
        modelsDir: this.#opts.modelsDir,
        hint:
          "copy *.gguf files there (picked up within seconds), or `deno task fixture:model " +
          `${this.#opts.modelsDir}/tiny.gguf\` for a test model`,
      });
    }
    this.#healthy = true;
    this.#detail = undefined;
    if (this.#opts.idleUnloadMs > 0) {
      const timer = setInterval(
        () => this.#unloadIdle(),
        Math.min(15_000, this.#opts.idleUnloadMs),
      );
      Deno.unrefTimer(timer);
      this.#timer = timer;
    }
    if (this.#opts.preload) {
      for (const e of this.#catalog.values()) {
        if (!e.error) await this.#process(this.#loaded(e));
      }
    }
  }

  async models(): Promise<EngineModel[]> {
    await this.#rescan(false);
    const out: EngineModel[] = [];
    for (const e of this.#catalog.values()) {
      if (e.error || !e.facts) continue;
      out.push({
        id: e.id,
        loaded: !!this.#state.get(e.id)?.proc?.alive,
        kind: e.facts.embeddingOnly ? "embedding" : "chat",
        embeddings: true,
        contextLength: this.#contextOf(e),
        aliases: e.sidecar.aliases ?? [],
        ...this.#templateFacts(e),
        ...(this.#isPlaced(e.id) ? {} : { servable: false as const }),
        needs: {
          weightsBytes: e.size,
          kvBytes: (e.facts.kvBytesPerToken ?? 0) * this.#contextOf(e) *
            (e.sidecar.slots ?? this.#opts.slots),
        },
      });
    }
    return this.#withSpan(out);
  }

  /**
   * Adds this node's spanning instance to its model list: the head's
   * model (servable only once loaded across every worker), or the model a
   * worker lends its memory to (never servable here).
   */
  #withSpan(models: EngineModel[]): EngineModel[] {
    const span = this.#span;
    if (!span) return models;
    const { a, nodeId } = span;
    const instance = this.#instance(a, nodeId);
    const i = models.findIndex((m) => m.id === a.model);
    if (a.role === "head") {
      if (i < 0) return models; // reported as missing by the placement
      const m = models[i]!;
      models[i] = {
        ...m,
        instance,
        ...(instance.state === "ready" ? {} : { servable: false as const }),
      };
      return models;
    }
    const entry: EngineModel = {
      ...(i >= 0 ? models[i]! : { id: a.model, kind: "chat" as const }),
      loaded: false,
      servable: false,
      instance,
    };
    if (i >= 0) models[i] = entry;
    else models.push(entry);
    return models;
  }

  /** The spanning instance as this node sees it. */
  #instance(a: SpanAssignment, nodeId: string): SpanningInstance {
    if (a.role === "worker") {
      const srv = this.#rpcServer;
      const ready = !!srv?.alive && !this.#rpcStarting;
      return {
        id: a.instance,
        kind: "rpc",
        serves: false,
        state: ready ? "ready" : this.#rpcError ? "degraded" : "loading",
        ...(this.#rpcError && !ready ? { detail: this.#rpcError } : {}),
        members: [
          { nodeId: a.head, role: "head" },
          {
            nodeId,
            role: "worker",
            transport: a.transport,
            ...(ready ? { addresses: [srv!.endpoint] } : {}),
          },
        ],
      };
    }
    const st = this.#state.get(a.model);
    const key = spanKey(a);
    const loaded = !!st?.proc?.alive && st.spanKey === key;
    const waiting = a.workers.filter((w) => !w.endpoint).map((w) => w.nodeId);
    const rpc = loaded ? st!.spanLoaded : null;
    const members: InstanceMember[] = [
      { nodeId, role: "head", transport: null },
      ...a.workers.map((w, i) => ({
        nodeId: w.nodeId,
        role: "worker" as const,
        transport: w.transport,
        ...(w.endpoint ? { addresses: [w.endpoint] } : {}),
        ...(rpc?.devices[i]
          ? {
            memoryBytes: Math.round(
              st!.entry.size * (rpc.split[i + 1] ?? 0),
            ),
          }
          : {}),
      })),
    ];
    if (rpc) {
      members[0]!.memoryBytes = Math.round(st!.entry.size * rpc.split[0]!);
    }
    const error = this.#placeErrors.get(a.model)?.error;
    return {
      id: a.instance,
      kind: "rpc",
      serves: true,
      state: loaded
        ? "ready"
        : waiting.length || error
        ? "degraded"
        : "loading",
      ...(waiting.length
        ? { detail: `waiting for worker ${waiting.join(", ")}` }
        : !loaded && error
        ? { detail: error }
        : {}),
      members,
    };
  }

  /**
   * Applies this node's part in a spanning placement (the heartbeat
   * answer's `span`; null: none). A worker runs its RPC server bound to
   * the head-facing address, and stops it when the placement ends or the
   * head goes away (the gateway then sends no span). A head loads the model
   * across the workers once every worker listens, and unloads it when a
   * worker goes away, so that requests fail at once instead of hanging on a
   * dead connection.
   */
  span(a: SpanAssignment | null, nodeId: string): void {
    if (this.#closed) return;
    const prev = this.#span?.a ?? null;
    this.#span = a ? { a, nodeId } : null;
    if (a?.role === "worker") this.#worker(a);
    else if (this.#rpcServer || this.#rpcStarting) this.#stopRpcServer();
    if (a?.role !== "worker") this.#rpcError = null;
    // the head: drop a process loaded for another layout (or none)
    const model = a?.role === "head" ? a.model : null;
    for (const st of this.#state.values()) {
      if (!st.proc?.alive) continue;
      if (st.entry.id === model) {
        if (st.spanKey === spanKey(a!)) continue;
      } else if (!st.spanKey) continue;
      log.info("unloading a model loaded across workers", {
        model: st.entry.id,
        why: st.entry.id === model
          ? "the workers changed"
          : "the spanning placement ended",
      });
      st.proc.kill();
      st.proc = null;
    }
    if (a?.role === "head" && a.workers.every((w) => w.endpoint)) {
      const e = this.#catalog.get(a.model);
      if (!e || e.error) return;
      const st = this.#loaded(e);
      if (st.proc?.alive || st.loading) return;
      const failed = this.#placeErrors.get(a.model);
      if (
        failed && prev && spanKey(prev) === spanKey(a) &&
        Date.now() - failed.at < PLACE_RETRY_MS
      ) return;
      log.info("loading a model across workers", {
        model: a.model,
        instance: a.instance,
        workers: a.workers.map((w) => `${w.nodeId}@${w.endpoint}`),
      });
      this.#process(st).then(
        () => this.#placeErrors.delete(a.model),
        (err) =>
          this.#placeErrors.set(a.model, {
            error: String((err as Error).message ?? err).slice(0, 400),
            at: Date.now(),
          }),
      );
    }
  }

  /** Starts (or restarts) the worker role's RPC server for this assignment. */
  #worker(a: Extract<SpanAssignment, { role: "worker" }>) {
    const cur = this.#rpcServer;
    const want = { instance: a.instance, bind: a.bind, transport: a.transport };
    if (
      cur && cur.alive && cur.spec.instance === want.instance &&
      cur.spec.bind === want.bind && cur.spec.transport === want.transport
    ) return;
    if (this.#rpcStarting) return;
    this.#rpcStarting = (async () => {
      if (cur) await cur.stop();
      this.#rpcServer = null;
      const program = this.#libDir ? rpcServerPath(this.#libDir) : null;
      if (!program) {
        throw new Error(
          "Cannot lend memory: this node's llama.cpp has no RPC server (the prebuilt package; run `deno task build:native`)",
        );
      }
      const srv = RpcServerProcess.start(program, want, this.#opts.threads);
      await srv.ready;
      if (this.#span?.a.instance !== want.instance || this.#closed) {
        await srv.stop();
        return;
      }
      this.#rpcServer = srv;
      this.#rpcError = null;
    })().catch((err) => {
      this.#rpcError = String((err as Error).message ?? err).slice(0, 400);
      log.warn("RPC server failed", {
        instance: a.instance,
        error: this.#rpcError,
      });
    }).finally(() => this.#rpcStarting = null);
  }

  #stopRpcServer() {
    const srv = this.#rpcServer;
    this.#rpcServer = null;
    const starting = this.#rpcStarting;
    if (srv) {
      log.info("stopping the RPC server", { instance: srv.spec.instance });
      void srv.stop();
    }
    // one still starting sees the placement gone and stops itself
    void starting;
  }

  /** The worker role's RPC server process id, or null when none runs. */
  rpcServerPid(): number | null {
    return this.#rpcServer?.alive ? this.#rpcServer.pid : null;
  }

  /** How the head loads `e` across its workers, or null when it is not a span head for it. */
  #spanLoad(
    e: CatalogEntry,
  ): { rpc: RpcLoad; key: string; env: Record<string, string> } | null {
    const a = this.#span?.a;
    if (a?.role !== "head" || a.model !== e.id) return null;
    const waiting = a.workers.filter((w) => !w.endpoint);
    if (waiting.length) {
      throw new OpenAIError(
        503,
        "model_unavailable",
        `The model \`${e.id}\` spans other nodes; waiting for worker ${
          waiting.map((w) => w.nodeId).join(", ")
        }`,
        { param: "model", headers: { "retry-after": "5" } },
      );
    }
    return {
      rpc: {
        endpoints: a.workers.map((w) => w.endpoint!),
        split: a.split,
        layers: e.facts?.blockCount ?? 1,
      },
      key: spanKey(a),
      // RDMA only where every worker's link test passed over it: ggml-rpc
      // negotiates per connection but the switch is per process
      // ggml aborts this process when a worker is lost: no gdb backtrace
      // on the protocol pipe
      env: {
        GGML_NO_BACKTRACE: "1",
        ...(a.workers.every((w) => w.transport === "rdma")
          ? {}
          : { GGML_RPC_NO_RDMA: "1" }),
      },
    };
  }

  chatCompletions(body: OpenAIBody, signal: AbortSignal): Promise<Response> {
    return this.#generate(parseChat(body), "chat", signal);
  }

  completions(body: OpenAIBody, signal: AbortSignal): Promise<Response> {
    return this.#generate(parseCompletion(body), "text", signal);
  }

  async embeddings(body: OpenAIBody, signal: AbortSignal): Promise<Response> {
    const req = parseEmbeddings(body);
    const st = await this.#entry(req.model);
    const proc = await this.#process(st);
    signal.throwIfAborted(); // an embedding batch is short: once sent, it runs to the end
    st.lastUsed = Date.now();
    const id = crypto.randomUUID();
    const q = new EventQueue();
    proc.request({ op: "embed", id, inputs: req.inputs }, (e) => q.push(e));
    const e = await q.next();
    if (e.ev === "embedding") {
      return embeddingResponse(
        st.entry.id,
        e.vectors,
        e.promptTokens,
        req.base64,
      );
    }
    if (e.ev === "error") throw errorOf(e);
    throw new OpenAIError(
      500,
      "engine_error",
      "Unexpected answer from the model process",
    );
  }

  async countTokens(
    body: OpenAIBody,
    signal: AbortSignal,
  ): Promise<TokenCount> {
    const req = parseChat(body);
    const st = await this.#entry(req.model);
    if (st.entry.facts?.embeddingOnly) {
      throw new OpenAIError(
        400,
        "invalid_model",
        `${st.entry.id} is an embedding model; it has no chat prompt`,
        { param: "model" },
      );
    }
    const { request } = this.#prepare(st, req, "chat");
    const proc = await this.#process(st);
    signal.throwIfAborted();
    st.lastUsed = Date.now();
    const q = new EventQueue();
    proc.request({
      op: "count",
      id: crypto.randomUUID(),
      messages: request.messages,
      prompt: request.prompt,
      templated: request.templated,
    }, (e) => q.push(e));
    const e = await q.next();
    if (e.ev === "count") {
      return { promptTokens: e.promptTokens, contextLength: e.contextLength };
    }
    if (e.ev === "error") throw errorOf(e);
    throw new OpenAIError(
      500,
      "engine_error",
      "Unexpected answer from the model process",
    );
  }

  /** `{ llama: LlamaRuntime }` once started. */
  facts(): Record<string, unknown> {
    return this.#runtime ? { llama: { ...this.#runtime } } : {};
  }

  stats(): EngineStats {
    let inFlight = 0;
    let queued = 0;
    for (const s of this.#state.values()) {
      inFlight += s.limiter.inFlight;
      queued += s.limiter.queued;
    }
    return {
      inFlight,
      queued,
      slots: this.#opts.slots,
      tokensPerSecond: this.#meter.rate(),
      healthy: this.#healthy && !this.#closed,
      detail: this.#detail,
    };
  }

  /**
   * Applies the operator's placement: pinned models load now and stay
   * loaded; models not placed here are unloaded (once their requests end)
   * and listed as not servable, so the gateway routes none to them.
   */
  place(desired: PlacedModel[] | null): void {
    if (this.#closed) return;
    this.#desired = desired
      ? new Map(desired.map((d) => [d.id, d.pinned]))
      : null;
    if (!this.#desired) this.#placeErrors.clear();
    this.#applyPlacement();
  }

  placementErrors(): Record<string, string> {
    return Object.fromEntries(
      [...this.#placeErrors].map(([id, e]) => [id, e.error]),
    );
  }

  /** Most requests that have shared one decode step since start. */
  get peakBatch(): number {
    return this.#peakBatch;
  }

  /** Running model processes: model id → pid and how often it was restarted after a crash. */
  processes(): Record<string, { pid: number | null; restarts: number }> {
    const out: Record<string, { pid: number | null; restarts: number }> = {};
    for (const [id, st] of this.#state) {
      out[id] = {
        pid: st.proc?.alive ? st.proc.pid : null,
        restarts: st.restarts,
      };
    }
    return out;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#timer);
    const procs = [...this.#state.values()].map((s) => s.proc).filter((p) =>
      p !== null
    );
    for (const p of procs) p.kill();
    const srv = this.#rpcServer;
    this.#rpcServer = null;
    await Promise.all([
      ...procs.map((p) => p.closed()),
      srv?.stop(),
      this.#rpcStarting,
    ]);
  }

  async #generate(
    req: GenerationRequest,
    kind: Kind,
    signal: AbortSignal,
  ): Promise<Response> {
    const st = await this.#entry(req.model);
    if (st.entry.facts?.embeddingOnly) {
      throw new OpenAIError(
        400,
        "invalid_model",
        `${st.entry.id} is an embedding model; use /v1/embeddings`,
        {
          param: "model",
        },
      );
    }
    const prepared = this.#prepare(st, req, kind);
    const release = await st.limiter.acquire(signal);
    let proc: ModelProcess;
    try {
      proc = await this.#process(st);
    } catch (err) {
      release();
      throw err;
    }
    st.lastUsed = Date.now();
    const id = crypto.randomUUID();
    const q = new EventQueue();
    let produced = 0;
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      signal.removeEventListener("abort", onAbort);
      release();
      st.lastUsed = Date.now();
    };
    const onAbort = () => proc.cancel(id);
    signal.addEventListener("abort", onAbort, { once: true });
    proc.request({ op: "generate", id, ...prepared.request }, (e) => {
      if (e.ev === "text") {
        this.#meter.add(e.tokens - produced);
        produced = e.tokens;
      }
      if (e.ev === "done") {
        this.#peakBatch = Math.max(this.#peakBatch, e.peakBatch);
      }
      if (e.ev === "done" || e.ev === "error") end();
      q.push(e);
    });
    const first = await q.next();
    if (first.ev === "error") throw errorOf(first);
    if (first.ev !== "started") {
      throw new OpenAIError(
        500,
        "engine_error",
        "Unexpected answer from the model process",
      );
    }
    const model = st.entry.id;
    const notes: Record<string, string> = prepared.loose.length > 0
      ? { [TOOL_GRAMMAR_HEADER]: toolGrammarNote(prepared.loose) }
      : {};
    if (req.stream) {
      return streamResponse(
        prepared.output,
        model,
        q,
        () => proc.cancel(id),
        notes,
      );
    }
    return await completeResponse(prepared.output, model, q, notes);
  }

  /**
   * Renders the prompt (the GGUF's Jinja template, else llama.cpp's
   * built-ins), builds the output grammar and the tool-call parser.
   */
  #prepare(st: Loaded, req: GenerationRequest, kind: Kind): {
    request: {
      messages?: GenerationRequest["messages"];
      prompt?: string;
      templated?: boolean;
      renderSpecial?: boolean;
      params: GenerationRequest["params"];
    };
    output: ChoiceOutput;
    /** Tools whose argument schemas the grammar loosened. */
    loose: string[];
  } {
    const o = req.output;
    const facts = st.entry.facts;
    const family = detectToolFamily(facts?.chatTemplate ?? null, st.entry.id);
    const built = kind === "chat" ? outputGrammar(o, family) : null;
    const cap = st.entry.sidecar.maxOutputTokens ??
      this.#opts.maxOutputTokens ?? null;
    const params = {
      ...req.params,
      maxTokens: cap === null
        ? req.params.maxTokens
        : Math.min(req.params.maxTokens ?? cap, cap),
      grammar: built?.spec ?? null,
    };
    const loose = built?.loose ?? [];
    const parser = o.tools.length
      ? new ToolCallParser(family, { names: o.tools.map((t) => t.name) })
      : null;
    const output = new ChoiceOutput(kind, parser, params.logprobs !== null);
    if (kind !== "chat") {
      return { request: { prompt: req.prompt, params }, output, loose: [] };
    }
    const builtIn = () => {
      if (o.rawTools) {
        throw new OpenAIError(
          400,
          "unsupported_parameter",
          `The model \`${st.entry.id}\` has no chat template this engine can render with tools`,
          { param: "tools" },
        );
      }
      return { request: { messages: req.messages, params }, output, loose };
    };
    const template = this.#template(st);
    const effort = req.reasoningEffort ?? null;
    if (effort !== null && !template?.reasoning.control) {
      throw new OpenAIError(
        400,
        "unsupported_parameter",
        `Unsupported parameter: 'reasoning_effort' (the model \`${st.entry.id}\` has no reasoning control in its chat template).`,
        { param: "reasoning_effort" },
      );
    }
    if (!template) return builtIn();
    try {
      const prompt = template.render(req.rawMessages ?? [], {
        tools: o.rawTools,
        addGenerationPrompt: true,
        extra: reasoningVars(template.reasoning.control, effort),
      });
      const splitter = reasoningSplitter(facts?.chatTemplate ?? "", prompt);
      const harmony = splitter instanceof HarmonySplitter;
      // Mistral's and Llama's call markers are control tokens, and
      // Harmony's channel markers
      const renderSpecial = (parser !== null && family !== "hermes") ||
        harmony;
      if (!splitter) {
        return {
          request: { prompt, templated: true, renderSpecial, params },
          output,
          loose,
        };
      }
      const opened = opensThinking(prompt);
      return {
        request: {
          prompt,
          templated: true,
          renderSpecial,
          params: params.grammar && !harmony
            ? {
              ...params,
              grammar: grammarAfterThinking(params.grammar, opened),
            }
            : params,
        },
        output: new ChoiceOutput(kind, parser, output.logprobs, splitter),
        loose,
      };
    } catch (err) {
      if (!(err instanceof TemplateError)) throw err;
      if (!err.raised) return builtIn(); // the template, not the request, failed
      throw new OpenAIError(
        400,
        "invalid_value",
        `The model's chat template refused these messages: ${err.message}`,
        { param: "messages" },
      );
    }
  }

  /**
   * What a catalog entry's template adds around a conversation, and its
   * reasoning facts (node/llama/reasoning.ts), read once per file version.
   */
  #templateFacts(
    e: CatalogEntry,
  ): Pick<EngineModel, "promptOverhead" | "reasoning"> {
    const key = `${e.path}:${e.mtime}`;
    let got = this.#templateFactsCache.get(key);
    if (got === undefined) {
      let overhead: PromptOverhead | null = null;
      let reasoning: ReasoningFacts = { control: null, parses: false };
      if (e.facts?.chatTemplate) {
        try {
          const t = new ChatTemplate(e.facts.chatTemplate, {
            bosToken: e.facts.bosToken,
            eosToken: e.facts.eosToken,
          });
          reasoning = t.reasoning;
          overhead = measureOverhead(t);
        } catch {
          /* rendered by llama.cpp's built-ins: the generic bound applies */
        }
      }
      got = { ...(overhead ? { promptOverhead: overhead } : {}), reasoning };
      this.#templateFactsCache.set(key, got);
    }
    return got;
  }

  /** The model's compiled Jinja template, or null to use llama.cpp's built-ins. */
  #template(st: Loaded): ChatTemplate | null {
    if (st.template !== undefined) return st.template;
    const f = st.entry.facts;
    st.template = null;
    if (f?.chatTemplate) {
      try {
        st.template = new ChatTemplate(f.chatTemplate, {
          bosToken: f.bosToken,
          eosToken: f.eosToken,
        });
      } catch (err) {
        log.warn("chat template not renderable; using llama.cpp's built-ins", {
          model: st.entry.id,
          error: String((err as Error).message).slice(0, 300),
        });
      }
    }
    return st.template;
  }

  async #entry(name: string): Promise<Loaded> {
    let e = resolveModel(this.#catalog, name);
    if (!e) {
      await this.#rescan(true);
      e = resolveModel(this.#catalog, name);
    }
    if (!e) {
      throw new OpenAIError(
        404,
        "model_not_found",
        `The model \`${name}\` does not exist on this node`,
        {
          param: "model",
        },
      );
    }
    if (e.error) {
      throw new OpenAIError(
        503,
        "model_unavailable",
        `The model \`${e.id}\` cannot be served: ${e.error}`,
        {
          param: "model",
        },
      );
    }
    if (!this.#isPlaced(e.id)) {
      throw new OpenAIError(
        503,
        "model_unavailable",
        `The model \`${e.id}\` is not placed on this node`,
        { param: "model", headers: { "retry-after": "5" } },
      );
    }
    return this.#loaded(e);
  }

  #loaded(e: CatalogEntry): Loaded {
    let st = this.#state.get(e.id);
    if (!st || st.entry.path !== e.path || st.entry.mtime !== e.mtime) {
      st?.proc?.kill();
      const slots = e.sidecar.slots ?? this.#opts.slots;
      st = {
        entry: e,
        limiter: new SlotLimiter(slots, this.#opts.maxQueue),
        proc: null,
        loading: null,
        lastUsed: Date.now(),
        restarts: 0,
        crashes: [],
      };
      this.#state.set(e.id, st);
    }
    return st;
  }

  /** Context tokens per slot: the sidecar's, the flag's, else sized to memory (kv_budget.ts). */
  #contextOf(e: CatalogEntry): number {
    const fixed = e.sidecar.contextSize ?? this.#opts.contextSize;
    if (fixed !== undefined) return fixed;
    const slots = e.sidecar.slots ?? this.#opts.slots;
    const key = `${e.path}:${e.mtime}:${slots}`;
    let ctx = this.#contexts.get(key);
    if (ctx === undefined) {
      ctx = defaultContext({
        trainContext: e.facts?.contextLength ?? null,
        kvBytesPerToken: e.facts?.kvBytesPerToken ?? null,
        slots,
        weightsBytes: e.size,
        availableBytes: availableMemory(),
        kvMemory: this.#opts.kvMemory,
      });
      this.#contexts.set(key, ctx);
    }
    return ctx;
  }

  /** Host memory for one model's evicted prefixes: the flag's, else 2 GiB or a quarter of what is available, whichever is less. */
  #prefixCacheBytes(): number {
    const spec = this.#opts.prefixCacheMemory;
    const available = availableMemory();
    return spec
      ? memoryBytes(spec, available)
      : Math.min(2 * 1024 ** 3, Math.floor(available / 4));
  }

  /** The model's running process, starting (or restarting) it if needed. */
  async #process(st: Loaded): Promise<ModelProcess> {
    if (st.proc?.alive) return st.proc;
    if (st.loading) return await st.loading;
    const e = st.entry;
    const span = this.#spanLoad(e);
    st.loading = (async () => {
      const started = performance.now();
      const proc = ModelProcess.spawn({
        path: e.path,
        ctxPerSeq: this.#contextOf(e),
        slots: st.limiter.slots,
        threads: this.#opts.threads,
        batch: 512,
        prefixCacheBytes: this.#prefixCacheBytes(),
        ...(span ? { rpc: span.rpc, env: span.env } : {}),
      }, (why) => {
        if (st.proc === proc) st.proc = null;
        if (!this.#closed && !proc.expectedExit) {
          st.restarts++;
          log.warn("model process ended", {
            model: e.id,
            why,
            restarts: st.restarts,
            log: proc.stderrTail(),
          });
          this.#restartSoon(st);
        }
      });
      try {
        const info = await proc.ready;
        st.proc = proc;
        st.spanKey = span?.key ?? null;
        st.spanLoaded = info.rpc ?? null;
        log.debug("llama.cpp load log", {
          model: e.id,
          log: proc.stderrTail(),
        });
        log.info("model loaded", {
          model: e.id,
          ms: Math.round(performance.now() - started),
          ...info,
        });
        return proc;
      } catch (err) {
        proc.kill();
        throw new OpenAIError(
          503,
          "model_unavailable",
          `The model \`${e.id}\` failed to load: ${(err as Error).message}`,
          {
            headers: { "retry-after": "5" },
          },
        );
      }
    })();
    try {
      return await st.loading;
    } finally {
      st.loading = null;
    }
  }

  /**
   * Brings a crashed model back so the next request finds it warm; after
   * 3 crashes within a minute it waits for a request instead (a model that
   * crashes on load must not spin).
   */
  #restartSoon(st: Loaded) {
    const now = Date.now();
    st.crashes = [...st.crashes.filter((t) => now - t < 60_000), now];
    if (st.crashes.length > 3) return;
    const t = setTimeout(() => {
      if (this.#closed || st.proc?.alive || st.loading) return;
      if (this.#state.get(st.entry.id) !== st) return;
      this.#process(st).catch((err) =>
        log.warn("model restart failed", {
          model: st.entry.id,
          error: String(err?.message ?? err),
        })
      );
    }, 250);
    Deno.unrefTimer(t);
  }

  async #rescan(force: boolean) {
    if (!force && Date.now() - this.#scannedAt < 5000) return;
    this.#scannedAt = Date.now();
    this.#catalog = await scanModels(this.#opts.modelsDir, this.#catalog);
  }

  /** Whether the placement lets this node serve the model (no placement: every model). */
  #isPlaced(id: string): boolean {
    const a = this.#span?.a;
    if (a?.role === "head" && a.model === id) return true;
    if (a?.role === "worker" && a.model === id) return false;
    return !this.#desired || this.#desired.has(id);
  }

  /** Unloads idle models not placed here; loads pinned ones not running. */
  #applyPlacement() {
    const desired = this.#desired;
    if (!desired) return;
    for (const st of this.#state.values()) {
      if (this.#isPlaced(st.entry.id) || !st.proc) continue;
      if (st.limiter.inFlight || st.limiter.queued) continue; // next time
      log.info("unloading a model not placed on this node", {
        model: st.entry.id,
      });
      st.proc.kill();
      st.proc = null;
    }
    const now = Date.now();
    for (const [id, pinned] of desired) {
      if (!pinned) continue;
      const e = this.#catalog.get(id);
      if (!e) continue; // reported as missing
      if (e.error) {
        this.#placeErrors.set(id, { error: e.error, at: now });
        continue;
      }
      const st = this.#loaded(e);
      if (st.proc?.alive || st.loading) continue;
      const failed = this.#placeErrors.get(id);
      if (failed && now - failed.at < PLACE_RETRY_MS) continue;
      log.info("loading a pinned model", { model: id });
      this.#process(st).then(
        () => this.#placeErrors.delete(id),
        (err) =>
          this.#placeErrors.set(id, {
            error: String((err as Error).message ?? err).slice(0, 400),
            at: Date.now(),
          }),
      );
    }
  }

  #unloadIdle() {
    const now = Date.now();
    for (const st of this.#state.values()) {
      if (this.#desired?.get(st.entry.id) === true) continue; // pinned
      if (st.spanKey) continue; // a span's model stays loaded while placed
      if (!st.proc || st.limiter.inFlight || st.limiter.queued) continue;
      if (now - st.lastUsed < this.#opts.idleUnloadMs) continue;
      log.info("unloading idle model", { model: st.entry.id });
      st.proc.kill();
      st.proc = null;
    }
  }
}

/** What identifies a head's layout: the workers' endpoints, transports and the split. */
function spanKey(a: SpanAssignment): string {
  return a.role === "head"
    ? JSON.stringify([a.instance, a.workers, a.split])
    : a.instance;
}

/** How long after a pinned model failed to load it is tried again. */
const PLACE_RETRY_MS = 30_000;

function errorOf(
  e: {
    status: number;
    code: string | null;
    message: string;
    param?: string | null;
    promptTokens?: number;
    contextLength?: number;
    completionTokens?: number | null;
  },
): OpenAIError {
  if (
    e.code === "context_length_exceeded" && e.promptTokens !== undefined &&
    e.contextLength !== undefined
  ) {
    return new ContextLengthError(
      e.promptTokens,
      e.contextLength,
      e.completionTokens ?? null,
      e.param ?? null,
    );
  }
  return new OpenAIError(e.status, e.code, e.message, {
    param: e.param ?? null,
    headers: e.status === 503 ? { "retry-after": "1" } : {},
  });
}
