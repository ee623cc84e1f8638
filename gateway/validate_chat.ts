/**
 * The chat-only shapes of a request: `messages` (with assistant `tool_calls`
 * and tool `tool_call_id`), `tools`, `tool_choice`, `response_format` and
 * `logprobs`/`top_logprobs`. Each 400 names the exact param path, as OpenAI
 * does (`tools[0].function.name`, `messages[2].tool_call_id`).
 */
import { invalidParam as bad, unsupportedParam } from "../lib/openai_errors.ts";

/** Most messages in one chat request. */
export const MAX_MESSAGES = 2048;
/** Most tools in one chat request (OpenAI's limit). */
export const MAX_TOOLS = 128;
/** Names of functions and JSON schemas, as OpenAI accepts them. */
export const NAME_PATTERN = /^[a-zA-Z0-9_-]{1,64}$/;
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

function name(v: unknown, at: string): string {
  if (typeof v !== "string" || !NAME_PATTERN.test(v)) {
    throw bad(at, `${at} must match ${NAME_PATTERN.source}`);
  }
  return v;
}

function optional(
  o: Record<string, unknown>,
  key: string,
  at: string,
  ok: (v: unknown) => boolean,
  what: string,
): void {
  if (given(o[key]) && !ok(o[key])) {
    throw bad(`${at}.${key}`, `${at}.${key} must be ${what}`, "invalid_type");
  }
}

/** Validates `tools`; returns the names of the declared functions. */
export function checkTools(v: unknown): Set<string> {
  const names = new Set<string>();
  if (!given(v)) return names;
  if (!Array.isArray(v)) {
    throw bad("tools", "tools must be an array of tools", "invalid_type");
  }
  if (v.length > MAX_TOOLS) {
    throw bad(
      "tools",
      `tools must hold at most ${MAX_TOOLS} items`,
      "array_above_max_length",
    );
  }
  v.forEach((t, i) => {
    const at = `tools[${i}]`;
    const tool = object(t, at);
    if (tool.type === "custom") {
      throw unsupportedParam(
        `${at}.type`,
        `${at}.type: custom tools are not supported; declare a function tool`,
      );
    }
    if (tool.type !== "function") {
      throw bad(`${at}.type`, `${at}.type must be "function"`);
    }
    const fn = object(tool.function, `${at}.function`);
    names.add(name(fn.name, `${at}.function.name`));
    const where = `${at}.function`;
    optional(
      fn,
      "description",
      where,
      (x) => typeof x === "string",
      "a string",
    );
    optional(fn, "parameters", where, isObj, "a JSON Schema object");
    optional(fn, "strict", where, (x) => typeof x === "boolean", "a boolean");
  });
  return names;
}

/** Validates `tool_choice` against the declared function names. */
export function checkToolChoice(v: unknown, declared: Set<string>): void {
  if (!given(v) || v === "none" || v === "auto") return;
  if (v === "required") {
    if (declared.size > 0) return;
    throw bad("tool_choice", 'tool_choice "required" needs at least one tool');
  }
  if (isObj(v) && v.type === "function") {
    const fn = object(v.function, "tool_choice.function");
    const n = name(fn.name, "tool_choice.function.name");
    if (declared.has(n)) return;
    throw bad(
      "tool_choice.function.name",
      `tool_choice names the function ${n}, which is not among tools`,
    );
  }
  if (isObj(v) && (v.type === "allowed_tools" || v.type === "custom")) {
    throw unsupportedParam(
      "tool_choice.type",
      `tool_choice of type ${v.type} is not supported; use "auto", "required" or a function`,
    );
  }
  throw bad(
    "tool_choice",
    'tool_choice must be "none", "auto", "required" or {"type":"function","function":{"name":…}}',
  );
}

/** Validates `response_format`. */
export function checkResponseFormat(v: unknown): void {
  if (!given(v)) return;
  const rf = object(v, "response_format");
  if (rf.type === "text" || rf.type === "json_object") return;
  if (rf.type !== "json_schema") {
    throw bad(
      "response_format.type",
      'response_format.type must be "text", "json_object" or "json_schema"',
    );
  }
  const at = "response_format.json_schema";
  const js = object(rf.json_schema, at);
  name(js.name, `${at}.name`);
  optional(js, "schema", at, isObj, "a JSON Schema object");
  optional(js, "strict", at, (x) => typeof x === "boolean", "a boolean");
  optional(js, "description", at, (x) => typeof x === "string", "a string");
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
