/**
 * What a node says about its engine, on the wire: the engine kinds, the
 * models an engine serves (with what its chat template adds and how it
 * reasons), its load and health figures, and which llama.cpp it runs.
 * The node's engines produce these (node/engine.ts is the interface they
 * implement); the gateway stores and routes on them (store/nodes.ts,
 * fleet/registry.ts). Each fact is spelled once here, and every union
 * and zod enum derives from the constants below.
 */

/** The engine kinds a node runs (`--engine`). */
export const ENGINE_KINDS = ["llama", "openai"] as const;
/** One of ENGINE_KINDS. */
export type EngineKind = typeof ENGINE_KINDS[number];

/** Whether `v` is one of ENGINE_KINDS. */
export function isEngineKind(v: unknown): v is EngineKind {
  return (ENGINE_KINDS as readonly unknown[]).includes(v);
}

/** What a model does: "chat" models generate; "embedding" models only embed. */
export const MODEL_KINDS = ["chat", "embedding"] as const;
/** One of MODEL_KINDS. */
export type ModelKind = typeof MODEL_KINDS[number];

/**
 * The chat template variable `reasoning_effort` sets: `enable_thinking`
 * (on/off) or `reasoning_effort` (passed as is).
 */
export const REASONING_CONTROLS = [
  "enable_thinking",
  "reasoning_effort",
] as const;
/** One of REASONING_CONTROLS. */
export type ReasoningControl = typeof REASONING_CONTROLS[number];

/** How a model reasons (EngineModel.reasoning). */
export interface ReasoningFacts {
  /** The template variable chat `reasoning_effort` sets; null: none, the field is refused. */
  control: ReasoningControl | null;
  /** Its `<think>…</think>` output comes back as `reasoning_content`. */
  parses: boolean;
}

/** A model an engine can serve. */
export interface EngineModel {
  /** Model id clients use (GGUF file name without extension, or upstream id). */
  id: string;
  /** Whether the model is loaded in memory right now. */
  loaded: boolean;
  /** "chat" models generate; "embedding" models only embed. */
  kind: ModelKind;
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
  reasoning?: ReasoningFacts;
  /**
   * False for a model the engine lists but cannot serve now (an Exo model
   * card not downloaded, or not placed): nothing is routed to it, and the
   * gateway answers 503 `model_unavailable` for it rather than 404.
   * Absent: servable.
   */
  servable?: false;
  /**
   * The instance this model runs as when it spans several machines (a
   * llama.cpp RPC split, or an Exo instance sharded across Macs): every
   * node that hosts or fronts it reports the same `id`, and the gateway
   * counts it as one unit of capacity, routes only to the nodes whose
   * `serves` is true, and bills every member's time (fleet/instances.ts).
   * Absent: the model runs on this node alone.
   */
  instance?: SpanningInstance;
  /**
   * What loading it takes, bytes (llama: the GGUF's weights, and the KV
   * cache of every slot at its context): the gateway refuses a spanning
   * placement whose members' free memory cannot hold both.
   */
  needs?: { weightsBytes: number; kvBytes: number };
}

/** How a spanning instance is built: ggml RPC (an Orchard head and workers), or an Exo cluster. */
export const INSTANCE_KINDS = ["rpc", "exo"] as const;
export type InstanceKind = typeof INSTANCE_KINDS[number];

/** What a spanning instance is doing. */
export const INSTANCE_STATES = [
  "loading",
  "ready",
  "degraded",
  "stopped",
] as const;
export type InstanceState = typeof INSTANCE_STATES[number];

/** One model instance spanning several machines, as a node reports it. */
export interface SpanningInstance {
  /** Stable across its members: `rpc:<placement id>`, or `exo:<Exo instance id>`. */
  id: string;
  kind: InstanceKind;
  /** Every machine it runs on, this node included. */
  members: InstanceMember[];
  /** Whether this node takes requests for it (rpc: the head only; exo: every fronting node). */
  serves: boolean;
  state: InstanceState;
  /** Why it is degraded or stopped, when it is. */
  detail?: string;
}

/**
 * A machine an instance runs on. Orchard nodes are named by `nodeId`; an
 * Exo member is named by its Exo id with the addresses and host name it
 * reports, which the gateway matches to an Orchard node's (none: the
 * member is unmanaged).
 */
export interface InstanceMember {
  nodeId?: string;
  exoNodeId?: string;
  addresses?: string[];
  hostname?: string;
  /** rpc: the head loads the model, workers lend their memory. */
  role?: "head" | "worker";
  /** Bytes of the model (weights and KV) this member holds, when known. */
  memoryBytes?: number;
  /** How the head reaches this member's memory, when known. */
  transport?: "rdma" | "tcp" | null;
  /**
   * This member is the reporting node's own machine (exo: the Exo node its
   * upstream answers `GET /node_id` with): the gateway maps it to the
   * reporting node before any address or host name match.
   */
  self?: boolean;
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
