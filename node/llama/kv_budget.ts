/**
 * A slot's default context: the model's trained context (n_ctx_train),
 * bounded by the memory the node gives the KV cache of all its slots.
 *
 *     KV bytes per token = Σ layers n_head_kv × (key_length + value_length) × 2 (f16)
 *     budget             = --kv-memory (default 50 %) of the memory available
 *                          when the model is first listed, less its weights (the file size)
 *     context per slot   = min(n_ctx_train, budget ÷ (KV bytes per token × slots)),
 *                          rounded down to a multiple of 256, at least min(n_ctx_train, 1024)
 *
 * A model whose header lacks the attention facts gets min(n_ctx_train, 4096).
 */
import { memoryBytes, type MemorySpec } from "../memory_spec.ts";

/** The default budget: half the memory available after the weights. */
export const DEFAULT_KV_MEMORY: MemorySpec = { share: 0.5 };

/** Smallest default context (when the model allows it), however little memory there is. */
const MIN_CONTEXT = 1024;
/** Default context of a model whose KV size is unknown. */
const UNKNOWN_KV_CONTEXT = 4096;

/** What a default context is computed from. */
export interface ContextInputs {
  /** The model's trained context (null: unknown). */
  trainContext: number | null;
  /** f16 KV bytes per token (null: unknown). */
  kvBytesPerToken: number | null;
  slots: number;
  /** The model file's size, bytes (its weights). */
  weightsBytes: number;
  /** Memory available now, bytes. */
  availableBytes: number;
  kvMemory?: MemorySpec;
}

/** Bytes the KV caches of all slots may take. */
export function kvBudgetBytes(i: ContextInputs): number {
  const spec = i.kvMemory ?? DEFAULT_KV_MEMORY;
  return "bytes" in spec
    ? spec.bytes
    : memoryBytes(spec, i.availableBytes - i.weightsBytes);
}

/** The default context tokens per slot (see the module comment). */
export function defaultContext(i: ContextInputs): number {
  const train = i.trainContext && i.trainContext > 0 ? i.trainContext : 4096;
  if (!i.kvBytesPerToken) return Math.min(train, UNKNOWN_KV_CONTEXT);
  const fits = Math.floor(
    kvBudgetBytes(i) / (i.kvBytesPerToken * Math.max(1, i.slots)),
  );
  const rounded = Math.floor(fits / 256) * 256;
  return Math.min(train, Math.max(rounded, MIN_CONTEXT));
}
