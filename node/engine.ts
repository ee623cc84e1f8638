/**
 * The engine contract every node engine implements (`llama` in process through
 * FFI, `openai` fronting a local OpenAI-compatible server).
 *
 * Engines speak OpenAI's HTTP shapes at their edge so the node server stays a
 * thin authenticated router: each method takes an already-parsed JSON body and
 * returns a `Response` whose body is exactly what an OpenAI client expects.
 *
 * Rules every engine follows:
 * - Non-stream responses are `application/json` with a `usage` object.
 * - Stream responses are `text/event-stream` of `chat.completion.chunk` (or
 *   `text_completion`) objects; the engine ALWAYS sends the final usage chunk
 *   (`choices: []`, `usage: {...}`) before `data: [DONE]`, whatever the client
 *   asked for (the gateway meters from it and strips it if not requested).
 * - An error before the first byte is an OpenAI error JSON with the right
 *   status (404 `model_not_found`, 400 `context_length_exceeded`, 503 with
 *   `retry-after` when the queue is full); an error after the first byte is a
 *   final `data: {"error":{...}}` frame followed by `data: [DONE]`.
 * - `signal` aborts when the caller goes away: the engine stops generating and
 *   frees the slot.
 * - Reasoning a model writes apart from its answer is `reasoning_content`
 *   (in the message, and in stream deltas), as vLLM and llama-server send it.
 */

/** A model an engine can serve. */
export interface EngineModel {
  /** Model id clients use (GGUF file name without extension, or upstream id). */
  id: string;
  /** Whether the model is loaded in memory right now. */
  loaded: boolean;
  /** "chat" models generate; "embedding" models only embed. */
  kind: "chat" | "embedding";
  /** Context length in tokens, when known. */
  contextLength?: number;
  /** Aliases that also resolve to this model. */
  aliases?: string[];
  /** A chat model that also serves `/v1/embeddings` (llama: mean pooling). */
  embeddings?: boolean;
  /** What the model's chat template adds to a conversation, when the engine knows it. */
  promptOverhead?: PromptOverhead;
  /**
   * How the model reasons, when the engine knows (llama: from its chat
   * template, node/llama/reasoning.ts): `control` is the template variable
   * chat `reasoning_effort` sets (`enable_thinking` on/off, or
   * `reasoning_effort` as is), null when the model has none and the field
   * is refused; `parses`: its `<think>…</think>` output comes back as
   * `reasoning_content`. The gateway passes an effort on only to models
   * with a control (or to openai engines).
   */
  reasoning?: {
    control: "enable_thinking" | "reasoning_effort" | null;
    parses: boolean;
  };
  /**
   * False for a model the engine lists but cannot serve now (an Exo model
   * card not downloaded, or not placed): nothing is routed to it, and the
   * gateway answers 503 `model_unavailable` for it rather than 404.
   * Absent: servable.
   */
  servable?: false;
}

/**
 * An upper bound on the bytes a chat template adds around the messages'
 * text (a token is at least one byte, so bytes bound tokens): `fixed` per
 * prompt (default system message, generation prompt), `perMessage`, and
 * `tools` once when tools are offered (the gateway adds twice each tool's
 * JSON length on top). The gateway caps billed prompt tokens at the bound.
 */
export interface PromptOverhead {
  fixed: number;
  perMessage: number;
  tools: number;
}

/** What `Engine.countTokens` answers. */
export interface TokenCount {
  /** Prompt tokens, as `usage.prompt_tokens` of the same request would say. */
  promptTokens: number;
  /** The model's context per request, tokens. */
  contextLength: number;
}

/** Load and health figures reported in each heartbeat. */
export interface EngineStats {
  /** Requests being generated right now. */
  inFlight: number;
  /** Requests admitted but waiting for a slot. */
  queued: number;
  /** Total concurrent sequences the engine serves. */
  slots: number;
  /** Generated tokens per second over the last few seconds, all streams. */
  tokensPerSecond: number;
  /** Whether the engine can serve requests now. */
  healthy: boolean;
  /** Human-readable reason when unhealthy. */
  detail?: string;
}

/**
 * Which llama.cpp a llama engine loaded: `built` from the pinned package's
 * own source with ggml's RPC backend (node/native/llama_build.ts), or the
 * npm package's `prebuilt` libraries, which have no RPC.
 */
export interface LlamaRuntime {
  build: "built" | "prebuilt";
  /** `llama_version()`. */
  version: string;
  /** The release tag and commit built (built only). */
  tag: string | null;
  commit: string | null;
  /** Whether ggml's RPC backend is in (a model can use other nodes' memory). */
  rpc: boolean;
  /** Whether ggml-rpc's RDMA transport was compiled in (false for prebuilt). */
  rdma: boolean;
}

/** A model the operator placed on this node (fleet/placement.ts). */
export interface DesiredModel {
  id: string;
  /** Keep it loaded: load it now, never unload it when idle. */
  pinned: boolean;
}

/** A loosely typed OpenAI request body, already parsed from JSON. */
export type OpenAIBody = Record<string, unknown>;

/** The interface implemented by every engine. */
export interface Engine {
  /** Engine kind, as given to `--engine`. */
  readonly kind: "llama" | "openai";
  /** Prepares the engine (discovers models, loads libraries); throws with a clear message on failure. */
  start(): Promise<void>;
  /** Lists the models this engine can serve. */
  models(): Promise<EngineModel[]>;
  /** `POST /v1/chat/completions`. */
  chatCompletions(body: OpenAIBody, signal: AbortSignal): Promise<Response>;
  /** `POST /v1/completions`. */
  completions(body: OpenAIBody, signal: AbortSignal): Promise<Response>;
  /** `POST /v1/embeddings` (float; base64 is produced by the gateway or here when asked). */
  embeddings(body: OpenAIBody, signal: AbortSignal): Promise<Response>;
  /** Current load and health. */
  stats(): EngineStats;
  /**
   * The prompt tokens a `/v1/chat/completions` body would be billed,
   * rendered (chat template, tools) and tokenized exactly as a generation
   * does, and the model's context per request. Engines that cannot know
   * leave it out (the gateway then estimates).
   */
  countTokens?(body: OpenAIBody, signal: AbortSignal): Promise<TokenCount>;
  /**
   * Applies the operator's placement (null: none, serve every model):
   * load pinned models and keep them loaded, unload and stop serving the
   * others. Engines that cannot load or unload (a fronted server) leave it
   * out; the node then only reports how the engine's models differ.
   * Called with every heartbeat answer: cheap when nothing changed.
   */
  place?(desired: DesiredModel[] | null): void;
  /**
   * What the engine adds to the node's hardware probe (top-level keys), as
   * the gateway shows it on /nodes: the llama engine reports which llama.cpp
   * it runs under `llama` (see LlamaRuntime). Known once `start` resolved.
   */
  facts?(): Record<string, unknown>;
  /** Why placed models failed to load, by model id (engines with `place`). */
  placementErrors?(): Record<string, string>;
  /** Stops the engine and frees everything; idempotent. */
  close(): Promise<void>;
}

/** What the node's server learns of a streamed answer as it is sent. */
export interface BodyWatcher {
  /** Its first piece went out. */
  first(): void;
  /** Whoever read it went away before its end (called before `done`). */
  cancelled(): void;
  /** It ended: read to its end, failed or cancelled. */
  done(): void;
}

/**
 * A stream an engine made itself reports its first piece, its end and its
 * cancellation here, and the server watches it through `watchBody` instead
 * of reading it through a wrapping stream (~50–80 µs a stream, a fifth of
 * what streaming added to a node's CPU). What happens before the server
 * attaches is replayed to it.
 */
export class StreamWatch {
  #watcher: BodyWatcher | null = null;
  #first = false;
  #cancelled = false;
  #done = false;

  first(): void {
    if (this.#first) return;
    this.#first = true;
    this.#watcher?.first();
  }

  cancelled(): void {
    if (this.#cancelled || this.#done) return;
    this.#cancelled = true;
    this.#watcher?.cancelled();
  }

  done(): void {
    if (this.#done) return;
    this.#done = true;
    this.#watcher?.done();
  }

  attach(w: BodyWatcher): void {
    this.#watcher = w;
    if (this.#first) w.first();
    if (this.#cancelled) w.cancelled();
    if (this.#done) w.done();
  }
}

const watches = new WeakMap<Response, StreamWatch>();

/** Marks `res` as reporting to `watch` (see StreamWatch). */
export function watchedResponse(res: Response, watch: StreamWatch): Response {
  watches.set(res, watch);
  return res;
}

/** Attaches `w` to the response's StreamWatch; false when it has none (then the server wraps its body). */
export function watchBody(res: Response, w: BodyWatcher): boolean {
  const watch = watches.get(res);
  if (!watch) return false;
  watches.delete(res);
  watch.attach(w);
  return true;
}
