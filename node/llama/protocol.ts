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
  }
  | {
    op: "generate";
    id: string;
    messages?: ChatMessage[];
    prompt?: string;
    params: SamplingParams;
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
}

/** Why a generation ended. */
export type FinishReason = "stop" | "length";

/** Child → parent. */
export type ChildEvent =
  | { ev: "ready"; model: LoadedModel }
  | { ev: "fatal"; message: string }
  | { ev: "started"; id: string; promptTokens: number }
  /** `tokens`: completion tokens generated so far (cumulative). */
  | { ev: "text"; id: string; text: string; tokens: number }
  | {
    ev: "done";
    id: string;
    finish: FinishReason;
    promptTokens: number;
    completionTokens: number;
    cancelled: boolean;
    /** Most sequences that shared one decode with this request (continuous batching at work). */
    peakBatch: number;
  }
  | { ev: "embedding"; id: string; vectors: number[][]; promptTokens: number }
  | {
    ev: "error";
    id: string;
    status: number;
    code: string | null;
    message: string;
    param?: string | null;
  };
