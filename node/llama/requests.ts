/**
 * OpenAI request bodies → generation requests for the llama engine, with
 * 400s in OpenAI's shape for anything malformed, and 400
 * `unsupported_parameter` for fields the engine cannot honour
 * (request_fields.ts): nothing is silently ignored.
 */
import { OpenAIError } from "../../protocol/openai/errors.ts";
import type { OpenAIBody } from "../engine.ts";
import type { ChatMessage, SamplingParams } from "./protocol.ts";
import { EFFORTS } from "./reasoning.ts";
import { refuseUnsupported } from "./request_fields.ts";
import {
  type OutputControls,
  parseOutputControls,
} from "../../protocol/openai/output_controls.ts";

/** A parsed generation request. */
export interface GenerationRequest {
  model: string;
  stream: boolean;
  /** Chat messages flattened to text (for llama.cpp's built-in templates). */
  messages?: ChatMessage[];
  /** Chat messages as the client sent them (for the model's Jinja template). */
  rawMessages?: Record<string, unknown>[];
  prompt?: string;
  /** Tools, tool choice, response format (chat only). */
  output: OutputControls;
  params: SamplingParams;
  /** Chat `reasoning_effort`, for the template's reasoning control (null: the template's default). */
  reasoningEffort?: string | null;
}

function bad(param: string, message: string, code = "invalid_value"): never {
  throw new OpenAIError(400, code, message, { param });
}

function modelOf(body: OpenAIBody): string {
  const m = body.model;
  if (typeof m !== "string" || m.length === 0) {
    bad("model", "`model` must be a non-empty string", "invalid_type");
  }
  if (m.length > 256) bad("model", "`model` is longer than 256 characters");
  return m;
}

function numberIn(
  body: OpenAIBody,
  key: string,
  min: number,
  max: number,
  fallback: number,
  integer = false,
): number {
  const v = body[key];
  if (v === undefined || v === null) return fallback;
  if (
    typeof v !== "number" || !Number.isFinite(v) ||
    (integer && !Number.isInteger(v))
  ) {
    bad(
      key,
      `\`${key}\` must be ${integer ? "an integer" : "a number"}`,
      "invalid_type",
    );
  }
  if (v < min || v > max) {
    bad(
      key,
      `\`${key}\` must be between ${min} and ${max}: current value is ${v}`,
    );
  }
  return v;
}

function sampling(body: OpenAIBody, logprobs: number | null): SamplingParams {
  const maxKey = body.max_completion_tokens !== undefined &&
      body.max_completion_tokens !== null
    ? "max_completion_tokens"
    : "max_tokens";
  const maxTokens = body[maxKey] === undefined || body[maxKey] === null
    ? null
    : numberIn(body, maxKey, 1, 1 << 24, 1, true);
  const n = numberIn(body, "n", 1, 128, 1, true);
  if (n !== 1) {
    bad("n", "This engine generates one choice per request: `n` must be 1");
  }
  let stop: string[] = [];
  const s = body.stop;
  if (typeof s === "string") stop = [s];
  else if (Array.isArray(s)) {
    if (
      s.length > 16 || s.some((x) => typeof x !== "string" || x.length > 256)
    ) {
      bad(
        "stop",
        "`stop` must be a string or up to 16 strings of at most 256 characters",
      );
    }
    stop = s as string[];
  } else if (s !== undefined && s !== null) {
    bad(
      "stop",
      "`stop` must be a string or an array of strings",
      "invalid_type",
    );
  }
  const seed = body.seed === undefined || body.seed === null
    ? null
    : numberIn(body, "seed", -(2 ** 53), 2 ** 53, 0, true);
  return {
    maxTokens,
    temperature: numberIn(body, "temperature", 0, 2, 1),
    topP: numberIn(body, "top_p", 0, 1, 1),
    topK: numberIn(body, "top_k", 0, 1 << 20, 0, true),
    minP: numberIn(body, "min_p", 0, 1, 0),
    repeatPenalty: numberIn(body, "repeat_penalty", 0.01, 10, 1),
    presencePenalty: numberIn(body, "presence_penalty", -2, 2, 0),
    frequencyPenalty: numberIn(body, "frequency_penalty", -2, 2, 0),
    seed: seed === null ? null : seed >>> 0,
    stop,
    grammar: null,
    logprobs,
  };
}

function streamOf(body: OpenAIBody): boolean {
  const s = body.stream;
  if (s === undefined || s === null) return false;
  if (typeof s !== "boolean") {
    bad("stream", "`stream` must be a boolean", "invalid_type");
  }
  return s;
}

/** Chat `logprobs` (boolean) + `top_logprobs` (0–20): alternatives per token, or null. */
function chatLogprobs(body: OpenAIBody): number | null {
  const lp = body.logprobs;
  const top = body.top_logprobs;
  if (lp !== undefined && lp !== null && typeof lp !== "boolean") {
    bad("logprobs", "`logprobs` must be a boolean", "invalid_type");
  }
  const n = numberIn(body, "top_logprobs", 0, 20, 0, true);
  if (top !== undefined && top !== null && lp !== true) {
    bad("top_logprobs", "`top_logprobs` needs `logprobs: true`");
  }
  return lp === true ? n : null;
}

function textOf(content: unknown, i: number): string {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) {
    bad(
      `messages[${i}].content`,
      "`content` must be a string or an array of parts",
      "invalid_type",
    );
  }
  let out = "";
  for (const part of content) {
    const p = part as Record<string, unknown>;
    if (p?.type === "text" && typeof p.text === "string") out += p.text;
    else {
      bad(
        `messages[${i}].content`,
        `Content parts of type ${
          JSON.stringify(p?.type ?? null)
        } are not supported by this engine; send text`,
      );
    }
  }
  return out;
}

/** `POST /v1/chat/completions`. */
export function parseChat(body: OpenAIBody): GenerationRequest {
  refuseUnsupported(body, "chat");
  const model = modelOf(body);
  const raw = body.messages;
  if (!Array.isArray(raw) || raw.length === 0) {
    bad("messages", "`messages` must be a non-empty array", "invalid_type");
  }
  if (raw.length > 10_000) {
    bad("messages", "`messages` has more than 10,000 entries");
  }
  const messages = raw.map((m, i): ChatMessage => {
    const msg = m as Record<string, unknown>;
    if (
      typeof msg !== "object" || msg === null || typeof msg.role !== "string"
    ) {
      bad(
        `messages[${i}]`,
        "Each message needs a string `role`",
        "invalid_type",
      );
    }
    const role = msg.role === "developer" ? "system" : msg.role as string;
    if (!/^[a-z_]{1,32}$/.test(role)) {
      bad(`messages[${i}].role`, `Unknown role ${JSON.stringify(role)}`);
    }
    return { role, content: textOf(msg.content, i) };
  });
  return {
    model,
    stream: streamOf(body),
    messages,
    rawMessages: raw as Record<string, unknown>[],
    output: parseOutputControls(body),
    params: sampling(body, chatLogprobs(body)),
    reasoningEffort: effortOf(body),
  };
}

/** Chat `reasoning_effort`: one of EFFORTS, or null. */
function effortOf(body: OpenAIBody): string | null {
  const e = body.reasoning_effort;
  if (e === undefined || e === null) return null;
  if (typeof e !== "string" || !EFFORTS.includes(e)) {
    bad(
      "reasoning_effort",
      `\`reasoning_effort\` must be one of ${EFFORTS.join(", ")}`,
    );
  }
  return e;
}

/** `POST /v1/completions`. */
export function parseCompletion(body: OpenAIBody): GenerationRequest {
  refuseUnsupported(body, "completions");
  const model = modelOf(body);
  let prompt = body.prompt;
  if (
    Array.isArray(prompt) && prompt.length === 1 &&
    typeof prompt[0] === "string"
  ) prompt = prompt[0];
  if (typeof prompt !== "string") {
    bad(
      "prompt",
      "`prompt` must be a string (token arrays and batches are not supported)",
      "invalid_type",
    );
  }
  // the legacy API's `logprobs` is the number of alternatives (0–5)
  const lp = body.logprobs === undefined || body.logprobs === null
    ? null
    : numberIn(body, "logprobs", 0, 5, 0, true);
  return {
    model,
    stream: streamOf(body),
    prompt,
    output: parseOutputControls({}),
    params: sampling(body, lp),
  };
}

/** `POST /v1/embeddings`: the inputs as strings. */
export function parseEmbeddings(
  body: OpenAIBody,
): { model: string; inputs: string[]; base64: boolean } {
  refuseUnsupported(body, "embeddings");
  const model = modelOf(body);
  const input = body.input;
  const inputs = typeof input === "string" ? [input] : input;
  if (
    !Array.isArray(inputs) || inputs.length === 0 ||
    inputs.some((x) => typeof x !== "string")
  ) {
    bad(
      "input",
      "`input` must be a string or a non-empty array of strings",
      "invalid_type",
    );
  }
  if (inputs.length > 2048) bad("input", "`input` has more than 2048 entries");
  const fmt = body.encoding_format ?? "float";
  if (fmt !== "float" && fmt !== "base64") {
    bad("encoding_format", "`encoding_format` must be float or base64");
  }
  return { model, inputs: inputs as string[], base64: fmt === "base64" };
}
