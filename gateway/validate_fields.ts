/**
 * Field-level checks of request bodies: every field is one of the
 * endpoint's reference fields (protocol/openai/request_fields.ts) or refused with
 * 400 `unsupported_parameter`; fields that cannot be honoured are refused
 * the same way; scalar fields have the type and range OpenAI documents.
 */
import {
  invalidParam as bad,
  unsupportedParam,
} from "../protocol/openai/errors.ts";
import type { FieldRule } from "../protocol/openai/request_fields.ts";

/** Most `logprobs` on legacy completions (OpenAI's limit). */
export const MAX_COMPLETION_LOGPROBS = 5;

const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);

/**
 * Refuses fields outside the endpoint's reference list and fields that
 * cannot be honoured; strips those that ask for nothing (null on a refused
 * field, the default value of a `default_only` one).
 */
export function checkFields(
  body: Record<string, unknown>,
  fields: Readonly<Record<string, FieldRule>>,
): void {
  for (const key of Object.keys(body)) {
    const rule = Object.hasOwn(fields, key) ? fields[key] : undefined;
    if (!rule) {
      throw unsupportedParam(
        key.slice(0, 100),
        `Unrecognized request argument supplied: ${key.slice(0, 100)}`,
      );
    }
    if (rule.use !== "refused" && rule.use !== "default_only") continue;
    const v = body[key];
    if (v === null || (rule.isDefault?.(v) ?? false)) {
      delete body[key];
      continue;
    }
    throw unsupportedParam(
      key,
      rule.use === "refused"
        ? `${key} is not supported: ${rule.why}`
        : `${key} ${
          JSON.stringify(v).slice(0, 100)
        } is not supported: ${rule.why}`,
    );
  }
}

/** Whether a value is acceptable. */
export type Check = (v: unknown) => boolean;
const num: Check = (v) => typeof v === "number" && Number.isFinite(v);
export const int: Check = (v) => Number.isSafeInteger(v);
const bool: Check = (v) => typeof v === "boolean";
const str: Check = (v) => typeof v === "string";
const between = (lo: number, hi: number): Check => (v) =>
  num(v) && (v as number) >= lo && (v as number) <= hi;
const stop: Check = (v) =>
  typeof v === "string" || (Array.isArray(v) && v.length <= 16 && v.every(str));
const logitBias: Check = (v) =>
  isObj(v) &&
  Object.entries(v).every(([k, b]) =>
    /^\d{1,9}$/.test(k) && between(-100, 100)(b)
  );

const intIn = (lo: number, hi: number): Check => (v) =>
  int(v) && (v as number) >= lo && (v as number) <= hi;

/** Fields of chat and completions: name, check, what it must be. */
export const COMMON: [string, Check, string][] = [
  ["temperature", between(0, 2), "a number from 0 to 2"],
  ["top_p", between(0, 1), "a number from 0 to 1"],
  ["presence_penalty", between(-2, 2), "a number from -2 to 2"],
  ["frequency_penalty", between(-2, 2), "a number from -2 to 2"],
  ["top_k", intIn(-1, 2 ** 31), "an integer of -1 or more"],
  ["min_p", between(0, 1), "a number from 0 to 1"],
  ["repeat_penalty", (v) => num(v) && (v as number) > 0, "a positive number"],
  ["seed", int, "an integer"],
  ["stop", stop, "a string or an array of at most 16 strings"],
  ["logit_bias", logitBias, "an object of token ids to numbers -100..100"],
  ["user", str, "a string"],
  ["safety_identifier", str, "a string"],
  ["stream", bool, "a boolean"],
];

/** Fields of chat only (beyond validate_chat.ts's shapes). */
export const CHAT_ONLY: [string, Check, string][] = [
  ["parallel_tool_calls", bool, "a boolean"],
  ["reasoning_effort", str, "a string"],
  ["prompt_cache_key", str, "a string"],
  [
    "metadata",
    (v) =>
      isObj(v) && Object.keys(v).length <= 16 && Object.values(v).every(str),
    "an object of at most 16 string values",
  ],
];

/** Fields of legacy completions only. */
export const COMPLETION_ONLY: [string, Check, string][] = [
  [
    "logprobs",
    intIn(0, MAX_COMPLETION_LOGPROBS),
    `an integer from 0 to ${MAX_COMPLETION_LOGPROBS}`,
  ],
  ["echo", bool, "a boolean"],
  ["suffix", str, "a string"],
];

/** Fields of embeddings (beyond `input` and `encoding_format`). */
export const EMBEDDING_ONLY: [string, Check, string][] = [
  ["dimensions", intIn(1, 1 << 20), "a positive integer"],
  ["user", str, "a string"],
];

/** Checks the fields of a table that are present (null counts as absent). */
export function checkTypes(
  body: Record<string, unknown>,
  fields: [string, Check, string][],
): void {
  for (const [name, ok, what] of fields) {
    const v = body[name];
    if (v !== undefined && v !== null && !ok(v)) {
      throw bad(name, `${name} must be ${what}`, "invalid_type");
    }
  }
}

/** Validates `stream_options` (only with `stream: true`); returns whether usage was asked for. */
export function checkStreamOptions(body: Record<string, unknown>): boolean {
  const so = body.stream_options;
  if (so === undefined || so === null) return false;
  if (!isObj(so)) {
    throw bad(
      "stream_options",
      "stream_options must be an object",
      "invalid_type",
    );
  }
  if (body.stream !== true) {
    throw bad(
      "stream_options",
      "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
    );
  }
  for (const [k, v] of Object.entries(so)) {
    const at = `stream_options.${k.slice(0, 100)}`;
    if (k === "include_usage") {
      if (v !== null && !bool(v)) {
        throw bad(at, `${at} must be a boolean`, "invalid_type");
      }
    } else if (k === "include_obfuscation") {
      if (v === true) {
        throw unsupportedParam(at, `${at}: chunks are not obfuscated`);
      }
    } else {
      throw unsupportedParam(
        at,
        `Unrecognized request argument supplied: ${at}`,
      );
    }
  }
  return so.include_usage === true;
}
