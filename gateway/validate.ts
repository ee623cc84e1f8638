/**
 * Validation of OpenAI request bodies: only what the gateway relies on or
 * what would otherwise reach a node as a type error. Unknown fields (tools,
 * tool_choice, response_format, …) pass through untouched.
 */
import { OpenAIError } from "../lib/openai_errors.ts";
import { type PromptSize, promptSize, textBytes } from "./tokens.ts";

/** The endpoints a body can be for. */
export type Endpoint = "chat" | "completions" | "embeddings";

/** A validated request, ready to admit and forward. */
export interface ParsedRequest {
  endpoint: Endpoint;
  model: string;
  stream: boolean;
  includeUsage: boolean;
  /** The client's completion cap (`max_tokens` or `max_completion_tokens`), if any. */
  maxTokens: number | null;
  prompt: PromptSize;
  /** The body to forward (normalised: `max_completion_tokens` → `max_tokens`). */
  body: Record<string, unknown>;
}

/** Longest model name accepted. */
export const MAX_MODEL_NAME = 256;
/** Most messages in one chat request. */
export const MAX_MESSAGES = 2048;
/** Most inputs in one embeddings request. */
export const MAX_INPUTS = 2048;

const ROLES = new Set([
  "system",
  "developer",
  "user",
  "assistant",
  "tool",
  "function",
]);

function bad(
  param: string,
  message: string,
  code = "invalid_value",
): OpenAIError {
  return new OpenAIError(400, code, message, { param });
}

const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);

/** Validates the `model` field. */
export function checkModel(body: Record<string, unknown>): string {
  const m = body.model;
  if (typeof m !== "string" || m.length === 0) {
    throw bad(
      "model",
      "you must provide a model parameter",
      "missing_required_parameter",
    );
  }
  if (m.length > MAX_MODEL_NAME) {
    throw bad("model", `model must be at most ${MAX_MODEL_NAME} characters`);
  }
  return m;
}

type Check = (v: unknown) => boolean;
const num: Check = (v) => typeof v === "number" && Number.isFinite(v);
const int: Check = (v) => Number.isSafeInteger(v);
const bool: Check = (v) => typeof v === "boolean";
const str: Check = (v) => typeof v === "string";
const stop: Check = (v) =>
  typeof v === "string" || (Array.isArray(v) && v.length <= 16 && v.every(str));

const SAMPLING: [string, Check, string][] = [
  ["temperature", num, "a number"],
  ["top_p", num, "a number"],
  ["presence_penalty", num, "a number"],
  ["frequency_penalty", num, "a number"],
  ["seed", int, "an integer"],
  ["stop", stop, "a string or an array of at most 16 strings"],
  ["logprobs", (v) => bool(v) || int(v), "a boolean"],
  ["top_logprobs", int, "an integer"],
  ["user", str, "a string"],
  ["stream", bool, "a boolean"],
];

function checkCommon(body: Record<string, unknown>): {
  stream: boolean;
  includeUsage: boolean;
  maxTokens: number | null;
} {
  for (const [name, ok, what] of SAMPLING) {
    const v = body[name];
    if (v !== undefined && v !== null && !ok(v)) {
      throw bad(name, `${name} must be ${what}`, "invalid_type");
    }
  }
  const n = body.n;
  if (n !== undefined && n !== null && n !== 1) {
    throw bad("n", "n must be 1: one choice per request is supported");
  }
  let maxTokens: number | null = null;
  for (const name of ["max_tokens", "max_completion_tokens"]) {
    const v = body[name];
    if (v === undefined || v === null) continue;
    if (!int(v) || (v as number) < 1 || (v as number) > 10_000_000) {
      throw bad(
        name,
        `${name} must be an integer from 1 to 10000000`,
        "invalid_type",
      );
    }
    maxTokens = maxTokens === null
      ? v as number
      : Math.min(maxTokens, v as number);
  }
  if ("max_completion_tokens" in body) {
    delete body.max_completion_tokens;
    if (maxTokens !== null) body.max_tokens = maxTokens;
  }
  const so = body.stream_options;
  if (so !== undefined && so !== null && !isObj(so)) {
    throw bad(
      "stream_options",
      "stream_options must be an object",
      "invalid_type",
    );
  }
  const stream = body.stream === true;
  const includeUsage = stream && isObj(so) && so.include_usage === true;
  return { stream, includeUsage, maxTokens };
}

/** Validates a `/v1/chat/completions` body. */
export function parseChat(body: Record<string, unknown>): ParsedRequest {
  const model = checkModel(body);
  const msgs = body.messages;
  if (!Array.isArray(msgs) || msgs.length === 0) {
    throw bad("messages", "messages must be a non-empty array", "invalid_type");
  }
  if (msgs.length > MAX_MESSAGES) {
    throw bad(
      "messages",
      `messages must hold at most ${MAX_MESSAGES} items`,
      "array_above_max_length",
    );
  }
  for (let i = 0; i < msgs.length; i++) {
    const m = msgs[i];
    if (!isObj(m)) {
      throw bad(
        `messages[${i}]`,
        `messages[${i}] must be an object`,
        "invalid_type",
      );
    }
    if (typeof m.role !== "string" || !ROLES.has(m.role)) {
      throw bad(
        `messages[${i}].role`,
        `messages[${i}].role must be one of ${[...ROLES].join(", ")}`,
      );
    }
    const c = m.content;
    const okContent = c === null || c === undefined
      ? m.role === "assistant"
      : typeof c === "string" ||
        (Array.isArray(c) &&
          c.every((p) => isObj(p) && typeof p.type === "string"));
    if (!okContent) {
      throw bad(
        `messages[${i}].content`,
        `messages[${i}].content must be a string or an array of content parts`,
        "invalid_type",
      );
    }
  }
  const common = checkCommon(body);
  return {
    endpoint: "chat",
    model,
    ...common,
    prompt: promptSize(
      textBytes(msgs) + textBytes(body.tools ?? null),
      msgs.length,
    ),
    body,
  };
}

/** Validates a `/v1/completions` body. */
export function parseCompletion(body: Record<string, unknown>): ParsedRequest {
  const model = checkModel(body);
  let p = body.prompt;
  if (Array.isArray(p) && p.length === 1 && typeof p[0] === "string") p = p[0];
  if (typeof p !== "string") {
    throw bad(
      "prompt",
      "prompt must be a string (or an array of one string)",
      "invalid_type",
    );
  }
  body.prompt = p;
  const common = checkCommon(body);
  return {
    endpoint: "completions",
    model,
    ...common,
    prompt: promptSize(textBytes(p), 0),
    body,
  };
}

/** Validates a `/v1/embeddings` body. */
export function parseEmbeddings(
  body: Record<string, unknown>,
): ParsedRequest & {
  encoding: "float" | "base64";
  inputs: number;
} {
  const model = checkModel(body);
  const input = body.input;
  const list = Array.isArray(input) ? input : [input];
  const okItem = (x: unknown) =>
    (typeof x === "string" && x.length > 0) ||
    (Array.isArray(x) && x.length > 0 && x.every(int));
  const tokenArray = Array.isArray(input) && input.length > 0 &&
    input.every(int);
  if (list.length === 0 || (!tokenArray && !list.every(okItem))) {
    throw bad(
      "input",
      "input must be a non-empty string, an array of non-empty strings, or token arrays",
      "invalid_type",
    );
  }
  const inputs = tokenArray ? 1 : list.length;
  if (inputs > MAX_INPUTS) {
    throw bad(
      "input",
      `input must hold at most ${MAX_INPUTS} items`,
      "array_above_max_length",
    );
  }
  const enc = body.encoding_format ?? "float";
  if (enc !== "float" && enc !== "base64") {
    throw bad("encoding_format", "encoding_format must be float or base64");
  }
  if (
    body.dimensions !== undefined && body.dimensions !== null &&
    !int(body.dimensions)
  ) {
    throw bad("dimensions", "dimensions must be an integer", "invalid_type");
  }
  delete body.encoding_format; // nodes always answer floats; base64 is built here
  const tokens = tokenArray ? input.length : list.reduce(
    (n: number, x) =>
      n + (typeof x === "string" ? textBytes(x) : (x as unknown[]).length),
    0,
  );
  return {
    endpoint: "embeddings",
    model,
    stream: false,
    includeUsage: false,
    maxTokens: 0,
    prompt: promptSize(tokens, inputs),
    body,
    encoding: enc,
    inputs,
  };
}
