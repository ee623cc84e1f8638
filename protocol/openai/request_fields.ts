/**
 * The request fields of OpenAI's API reference (chat completions, legacy
 * completions, embeddings; as of 2025–2026), plus the sampling extensions
 * local engines accept (llama-server, vLLM, Ollama's OpenAI API), and what
 * Orchard does with each. One table, imported by the gateway's validation
 * and available to the engines, so the fields the gateway forwards and the
 * fields a node accepts are the same list.
 *
 * The product rule: never answer 200 to what was ignored. A field either
 * reaches something that honours it (the gateway or the node's engine, which
 * refuses what it cannot do), or it is refused up front with a 400
 * `unsupported_parameter` naming it.
 */

/**
 * What Orchard does with a field.
 * - `node`: forwarded unchanged; the node's engine honours it or answers 400.
 * - `gateway`: handled by the gateway (routing, limits, the stream's usage
 *   chunk); forwarded only where the entry says so.
 * - `default_only`: only the value that asks for nothing (OpenAI's default,
 *   or null) is accepted; the gateway strips it. Other values are refused.
 * - `refused`: no engine of Orchard's can honour it; any non-null value is
 *   refused (null is stripped: it asks for nothing).
 */
export type FieldUse = "node" | "gateway" | "default_only" | "refused";

/** One field of a request body. */
export interface FieldRule {
  use: FieldUse;
  /** Why a value is refused (for `default_only` and `refused`). */
  why?: string;
  /** For `default_only`: whether a value asks for nothing beyond the default. */
  isDefault?: (v: unknown) => boolean;
}

const node: FieldRule = { use: "node" };
const gateway: FieldRule = { use: "gateway" };
const refused = (why: string): FieldRule => ({ use: "refused", why });
const defaultOnly = (
  why: string,
  isDefault: (v: unknown) => boolean,
): FieldRule => ({ use: "default_only", why, isDefault });

/** Sampling extensions of local engines, passed on to the node. */
const LOCAL_SAMPLING: Record<string, FieldRule> = {
  top_k: node,
  min_p: node,
  repeat_penalty: node,
};

/** `POST /v1/chat/completions`. */
export const CHAT_FIELDS: Readonly<Record<string, FieldRule>> = {
  model: gateway,
  messages: node,
  audio: refused("audio output is not served by Orchard's engines"),
  frequency_penalty: node,
  function_call: refused("it is deprecated: use tool_choice"),
  functions: refused("it is deprecated: use tools"),
  logit_bias: node,
  logprobs: node,
  // Forwarded as `max_tokens` (the smaller of the two when both are given).
  max_completion_tokens: gateway,
  max_tokens: node,
  // Tags for stored completions: nothing is stored, so honouring is a no-op.
  metadata: node,
  modalities: defaultOnly(
    "only text output is served",
    (v) => Array.isArray(v) && v.length === 1 && v[0] === "text",
  ),
  n: node, // the gateway accepts only 1
  parallel_tool_calls: node,
  prediction: refused("predicted outputs are not supported"),
  presence_penalty: node,
  // Prefix reuse is automatic on nodes; the key routes one key's requests
  // to one node, where its prefix is cached (gateway/affinity.ts).
  prompt_cache_key: node,
  prompt_cache_retention: refused(
    "nodes keep prompt prefixes as memory allows; retention cannot be set",
  ),
  // The model's reasoning control: llama nodes set their chat template's
  // switch (node/llama/reasoning.ts) and refuse it for a model without one.
  reasoning_effort: node,
  response_format: node,
  // End-user identifiers: they ask for nothing the answer could show.
  safety_identifier: node,
  seed: node,
  service_tier: defaultOnly(
    "there is one service tier",
    (v) => v === "auto" || v === "default",
  ),
  stop: node,
  store: defaultOnly(
    "Orchard does not store completions",
    (v) => v === false,
  ),
  stream: node,
  // Rewritten: nodes always send usage; the gateway strips it unless asked.
  stream_options: gateway,
  temperature: node,
  tool_choice: node,
  tools: node,
  top_logprobs: node,
  top_p: node,
  user: node,
  verbosity: refused("no engine of Orchard's supports it"),
  web_search_options: refused("web search is not available"),
  ...LOCAL_SAMPLING,
};

/** `POST /v1/completions` (legacy). */
export const COMPLETION_FIELDS: Readonly<Record<string, FieldRule>> = {
  model: gateway,
  prompt: node,
  best_of: defaultOnly(
    "one completion is generated per request",
    (v) => v === 1,
  ),
  echo: node,
  frequency_penalty: node,
  logit_bias: node,
  logprobs: node,
  max_tokens: node,
  n: node, // the gateway accepts only 1
  presence_penalty: node,
  seed: node,
  stop: node,
  stream: node,
  stream_options: gateway,
  suffix: node,
  temperature: node,
  top_p: node,
  user: node,
  ...LOCAL_SAMPLING,
};

/** `POST /v1/embeddings`. */
export const EMBEDDING_FIELDS: Readonly<Record<string, FieldRule>> = {
  model: gateway,
  input: node,
  dimensions: node,
  // Nodes always answer floats; base64 is encoded by the gateway.
  encoding_format: gateway,
  user: node,
};

/**
 * `POST /v1/responses`: translated by the gateway into a chat request
 * (gateway/responses_request.ts); `node` fields reach the engine under
 * their chat names.
 */
export const RESPONSE_FIELDS: Readonly<Record<string, FieldRule>> = {
  model: gateway,
  input: gateway, // → messages
  instructions: gateway, // → a system message first
  max_output_tokens: gateway, // → max_tokens
  temperature: node,
  top_p: node,
  // function tools and namespaces of them → chat tools; built-in tools are
  // left out (named in x-orchard-tools-omitted) unless tool_choice needs one
  tools: gateway,
  tool_choice: gateway,
  parallel_tool_calls: node,
  text: gateway, // format → response_format; verbosity: the default only
  stream: node,
  stream_options: gateway,
  store: gateway,
  previous_response_id: gateway,
  metadata: gateway, // kept with the response
  // The client's own ids (Codex CLI's session and turn): accepted, never
  // echoed, logged or put in a prompt.
  client_metadata: gateway,
  user: node,
  safety_identifier: node,
  // Also the routing affinity: one key's requests go to one node (gateway/affinity.ts).
  prompt_cache_key: node,
  // effort → reasoning_effort where the engine has that control, else a
  // hint with nothing to set; summary: reasoning as summary_text parts
  reasoning: gateway,
  // logprobs, reasoning.encrypted_content (sealed reasoning), and the
  // built-in tools' includes (nothing to add: those tools are left out)
  include: gateway,
  top_logprobs: gateway, // → logprobs + top_logprobs
  // It bounds calls to built-in tools, of which there are none here.
  max_tool_calls: gateway,
  background: defaultOnly(
    "responses run in the foreground",
    (v) => v === false,
  ),
  truncation: defaultOnly(
    "an input longer than the model's context is refused, not truncated",
    (v) => v === "disabled",
  ),
  service_tier: defaultOnly(
    "there is one service tier",
    (v) => v === "auto" || v === "default",
  ),
  conversation: refused(
    "conversations are not stored; use previous_response_id",
  ),
  prompt: refused("prompt templates are not stored"),
  prompt_cache_retention: refused(
    "nodes keep prompt prefixes as memory allows; retention cannot be set",
  ),
  prompt_cache_options: refused(
    "nodes keep prompt prefixes as memory allows; caching cannot be set",
  ),
  context_management: refused("context compaction is not available"),
  moderation: refused("moderation is not available"),
  access_programs: refused("no access programs are offered"),
  image: refused("image options are not available"),
  // Extensions, as on chat: seeds and local engines' sampling.
  seed: node,
  presence_penalty: node,
  frequency_penalty: node,
  ...LOCAL_SAMPLING,
};
