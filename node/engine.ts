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
 *
 * What an engine reports (its models, load figures, token counts) crosses
 * the wire to the gateway, so those types live in the contract,
 * protocol/engine.ts; this file holds only what the node itself uses.
 */
import type {
  EngineKind,
  EngineModel,
  EngineStats,
  TokenCount,
} from "../protocol/engine.ts";
import type { PlacedModel, SpanAssignment } from "../protocol/placement.ts";

/** A loosely typed OpenAI request body, already parsed from JSON. */
export type OpenAIBody = Record<string, unknown>;

/** The interface implemented by every engine. */
export interface Engine {
  /** Engine kind, as given to `--engine`. */
  readonly kind: EngineKind;
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
  place?(desired: PlacedModel[] | null): void;
  /**
   * Applies this node's part in a spanning placement (null: none): a
   * worker runs ggml's RPC server for the head, a head loads the model
   * across the workers (llama engine only; node/llama/rpc_server.ts).
   * Called with every heartbeat answer, and with null when the gateway has
   * not answered for a while: cheap when nothing changed.
   */
  span?(assignment: SpanAssignment | null, nodeId: string): void;
  /**
   * What the engine adds to the node's hardware probe (top-level keys), as
   * the gateway shows it on /nodes: the llama engine reports which llama.cpp
   * it runs under `llama` (see protocol/engine.ts LlamaRuntime). Known once
   * `start` resolved.
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
