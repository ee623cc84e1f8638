/**
 * The chat-only shapes of a request: `messages` (with assistant `tool_calls`
 * and tool `tool_call_id`) and `logprobs`/`top_logprobs` (`tools`,
 * `tool_choice` and `response_format` are protocol/openai/output_controls.ts's,
 * shared with the engine). Each 400 names the exact param path, as OpenAI
 * does (`messages[2].tool_call_id`).
 */
import { invalidParam as bad } from "../protocol/openai/errors.ts";

/** Most messages in one chat request. */
export const MAX_MESSAGES = 2048;
/** Most `top_logprobs` OpenAI returns per token. */
export const MAX_TOP_LOGPROBS = 20;

const ROLES = new Set([
  "system",
  "developer",
  "user",
  "assistant",
  "tool",
  "function",
]);

const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);
const given = (v: unknown) => v !== undefined && v !== null;
const nonEmpty = (v: unknown): v is string =>
  typeof v === "string" && v.length > 0;

function object(v: unknown, at: string): Record<string, unknown> {
  if (!given(v)) {
    throw bad(at, `${at} is required`, "missing_required_parameter");
  }
  if (!isObj(v)) throw bad(at, `${at} must be an object`, "invalid_type");
  return v;
}

/** Validates `logprobs` (a boolean on chat) and `top_logprobs` (0–20, needs logprobs). */
export function checkLogprobs(logprobs: unknown, top: unknown): void {
  if (given(logprobs) && typeof logprobs !== "boolean") {
    throw bad("logprobs", "logprobs must be a boolean", "invalid_type");
  }
  if (!given(top)) return;
  if (
    !Number.isSafeInteger(top) || (top as number) < 0 ||
    (top as number) > MAX_TOP_LOGPROBS
  ) {
    throw bad(
      "top_logprobs",
      `top_logprobs must be an integer from 0 to ${MAX_TOP_LOGPROBS}`,
    );
  }
  if (logprobs !== true) {
    throw bad("top_logprobs", "top_logprobs needs logprobs: true");
  }
}

function checkToolCalls(v: unknown, at: string, ids: Set<string>): void {
  if (!Array.isArray(v) || v.length === 0) {
    throw bad(at, `${at} must be a non-empty array`, "invalid_type");
  }
  v.forEach((c, j) => {
    const call = object(c, `${at}[${j}]`);
    if (!nonEmpty(call.id)) {
      throw bad(`${at}[${j}].id`, `${at}[${j}].id must be a non-empty string`);
    }
    if (call.type !== "function") {
      throw bad(`${at}[${j}].type`, `${at}[${j}].type must be "function"`);
    }
    const fn = object(call.function, `${at}[${j}].function`);
    if (!nonEmpty(fn.name)) {
      throw bad(
        `${at}[${j}].function.name`,
        `${at}[${j}].function.name must be a non-empty string`,
      );
    }
    if (typeof fn.arguments !== "string") {
      throw bad(
        `${at}[${j}].function.arguments`,
        `${at}[${j}].function.arguments must be a JSON string`,
        "invalid_type",
      );
    }
    ids.add(call.id);
  });
}

/** Validates `messages`: roles, content, assistant tool calls and tool replies to them. */
export function checkMessages(msgs: unknown): unknown[] {
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
  const callIds = new Set<string>();
  msgs.forEach((m, i) => {
    const at = `messages[${i}]`;
    if (!isObj(m)) throw bad(at, `${at} must be an object`, "invalid_type");
    if (typeof m.role !== "string" || !ROLES.has(m.role)) {
      throw bad(
        `${at}.role`,
        `${at}.role must be one of ${[...ROLES].join(", ")}`,
      );
    }
    const c = m.content;
    const okContent = !given(c)
      ? m.role === "assistant"
      : typeof c === "string" ||
        (Array.isArray(c) &&
          c.every((p) => isObj(p) && typeof p.type === "string"));
    if (!okContent) {
      throw bad(
        `${at}.content`,
        `${at}.content must be a string or an array of content parts`,
        "invalid_type",
      );
    }
    if (given(m.tool_calls)) {
      if (m.role !== "assistant") {
        throw bad(
          `${at}.tool_calls`,
          `${at}.tool_calls is only allowed on assistant messages`,
        );
      }
      checkToolCalls(m.tool_calls, `${at}.tool_calls`, callIds);
    }
    if (m.role === "tool") {
      if (!nonEmpty(m.tool_call_id)) {
        throw bad(
          `${at}.tool_call_id`,
          `${at}.tool_call_id must be a non-empty string`,
          "missing_required_parameter",
        );
      }
      if (!callIds.has(m.tool_call_id)) {
        throw bad(
          `${at}.tool_call_id`,
          `${at} answers the tool call ${m.tool_call_id}, which no earlier assistant message made`,
        );
      }
    }
  });
  return msgs;
}
