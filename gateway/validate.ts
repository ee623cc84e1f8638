/**
 * Validation of OpenAI request bodies against the API reference. Every field
 * is one of the reference's (protocol/openai/request_fields.ts) or refused with
 * 400 `unsupported_parameter`; fields no engine of Orchard's can honour are
 * refused the same way; and the shapes the gateway or a node relies on are
 * checked, each 400 naming the exact param path (field checks in
 * validate_fields.ts, chat shapes in validate_chat.ts). Fields that pass
 * reach the node unchanged, except those the gateway handles itself.
 */
import { parseOutputControls } from "../protocol/openai/output_controls.ts";
import {
  invalidParam as bad,
  unsupportedParam,
} from "../protocol/openai/errors.ts";
import {
  CHAT_FIELDS,
  COMPLETION_FIELDS,
  EMBEDDING_FIELDS,
} from "../protocol/openai/request_fields.ts";
import { type PromptSize, promptSize, textBytes } from "./tokens.ts";
import { checkLogprobs, checkMessages } from "./validate_chat.ts";
import {
  CHAT_ONLY,
  checkFields,
  checkStreamOptions,
  checkTypes,
  COMMON,
  COMPLETION_ONLY,
  EMBEDDING_ONLY,
  int,
} from "./validate_fields.ts";

export { MAX_MESSAGES } from "./validate_chat.ts";

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
/** Most inputs in one embeddings request. */
export const MAX_INPUTS = 2048;

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

function checkCommon(body: Record<string, unknown>): {
  stream: boolean;
  includeUsage: boolean;
  maxTokens: number | null;
} {
  checkTypes(body, COMMON);
  const n = body.n;
  if (n !== undefined && n !== null && n !== 1) {
    throw unsupportedParam(
      "n",
      "n must be 1: one choice per request is supported",
    );
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
  const includeUsage = checkStreamOptions(body);
  return { stream: body.stream === true, includeUsage, maxTokens };
}

/** Validates a `/v1/chat/completions` body. */
export function parseChat(body: Record<string, unknown>): ParsedRequest {
  checkFields(body, CHAT_FIELDS);
  const model = checkModel(body);
  const msgs = checkMessages(body.messages);
  parseOutputControls(body); // tools, tool_choice, response_format
  checkLogprobs(body.logprobs, body.top_logprobs);
  checkTypes(body, CHAT_ONLY);
  const common = checkCommon(body);
  return {
    endpoint: "chat",
    model,
    ...common,
    prompt: promptSize(
      textBytes(msgs) + textBytes(body.tools ?? null),
      msgs.length,
      Array.isArray(body.tools) && body.tools.length
        ? JSON.stringify(body.tools).length
        : 0,
    ),
    body,
  };
}

/** Validates a `/v1/completions` body. */
export function parseCompletion(body: Record<string, unknown>): ParsedRequest {
  checkFields(body, COMPLETION_FIELDS);
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
  checkTypes(body, COMPLETION_ONLY);
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
  checkFields(body, EMBEDDING_FIELDS);
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
  checkTypes(body, EMBEDDING_ONLY);
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
