/**
 * Messages between the llama engine (parent) and a model's child process,
 * one JSON object per line on the child's stdin and stdout.
 */

/** Sampling and stopping settings of one generation. */
export interface SamplingParams {
  maxTokens: number | null;
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  repeatPenalty: number;
  presencePenalty: number;
  frequencyPenalty: number;
  seed: number | null;
  stop: string[];
  /** A GBNF grammar the output must match (structured output, tool calls), or null. */
  grammar: GrammarSpec | null;
  /** Log-probabilities to report: null for none, else how many alternatives per token (0–20). */
  logprobs: number | null;
}

/** A grammar constraint: whole output, or only from the first match of a trigger pattern on (lazy). */
export interface GrammarSpec {
  gbnf: string;
  /** Regexes matched against the output from its start; the grammar applies from the first match group on. */
  triggers?: string[];
}

/** One generated token's log-probability and the most likely alternatives (OpenAI's shape, less `bytes` naming). */
export interface TokenLogprob {
  token: string;
  bytes: number[];
  logprob: number;
  top: { token: string; bytes: number[]; logprob: number }[];
}

/** A chat message already flattened to text. */
export interface ChatMessage {
  role: string;
  content: string;
}

/** Parent → child. */
export type ChildRequest =
  | {
    op: "load";
    path: string;
    ctxPerSeq: number;
    slots: number;
    threads: number;
    batch: number;
    /** Host memory for prefixes evicted from slots, bytes (0 or absent: none). */
    prefixCacheBytes?: number;
    /** Load across other nodes' memory through ggml RPC (a span's head). */
    rpc?: RpcLoad;
  }
  | {
    op: "generate";
    id: string;
    /** Rendered by llama.cpp's built-in template (fallback when Jinja cannot render). */
    messages?: ChatMessage[];
    prompt?: string;
    /** The prompt is a rendered chat template: parse control tokens, add no BOS. */
    templated?: boolean;
    /** Render control tokens as text (tool-call markers such as `[TOOL_CALLS]`). */
    renderSpecial?: boolean;
    params: SamplingParams;
  }
  /** Tokenizes a prompt exactly as `generate` would, without generating. */
  | {
    op: "count";
    id: string;
    messages?: ChatMessage[];
    prompt?: string;
    templated?: boolean;
  }
  | { op: "cancel"; id: string }
  | { op: "embed"; id: string; inputs: string[] };

/** Facts the child reports once the model is loaded. */
export interface LoadedModel {
  ctxPerSeq: number;
  ctxTrain: number;
  slots: number;
  vocab: number;
  embd: number;
  hasTemplate: boolean;
  threads: number;
  batch: number;
  /** Loaded across RPC servers: the split it used. */
  rpc?: {
    /** Each worker's device, in layer order, and its memory when loaded. */
    devices: {
      endpoint: string;
      name: string;
      freeBytes: number;
      totalBytes: number;
    }[];
    /** Share of the layers per member, head first, as applied. */
    split: number[];
    /** Layers the head kept on its own device (CPU or GPU). */
    headLayers: number;
  };
}

/** Why a generation ended. */
export type FinishReason = "stop" | "length";

/** Child → parent. */
export type ChildEvent =
  | { ev: "ready"; model: LoadedModel }
  | { ev: "fatal"; message: string }
  /** `cachedTokens`: prompt tokens reused from the slot's KV cache (not decoded again). */
  | { ev: "started"; id: string; promptTokens: number; cachedTokens: number }
  /** `tokens`: completion tokens generated so far (cumulative). */
  | {
    ev: "text";
    id: string;
    text: string;
    tokens: number;
    logprobs?: TokenLogprob[];
  }
  | {
    ev: "done";
    id: string;
    finish: FinishReason;
    promptTokens: number;
    cachedTokens: number;
    completionTokens: number;
    cancelled: boolean;
    /** Most sequences that shared one decode with this request (continuous batching at work). */
    peakBatch: number;
  }
  | { ev: "embedding"; id: string; vectors: number[][]; promptTokens: number }
  /** A `count` answer: the prompt's tokens and the context per slot. */
  | { ev: "count"; id: string; promptTokens: number; contextLength: number }
  | {
    ev: "error";
    id: string;
    status: number;
    code: string | null;
    message: string;
    param?: string | null;
    /** context_length_exceeded: the prompt's tokens, the context, the completion tokens asked for (null: the prompt alone is too long). */
    promptTokens?: number;
    contextLength?: number;
    completionTokens?: number | null;
  };

/** How a span's head loads its model across RPC servers (the workers'). */
export interface RpcLoad {
  /** `host:port` of each worker's ggml-rpc-server, in layer order. */
  endpoints: string[];
  /** Share of the layers per member, head first (null: by free memory). */
  split: number[] | null;
  /** The model's layer count (`block_count`). */
  layers: number;
}
