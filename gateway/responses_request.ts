/**
 * A Responses API request (`POST /v1/responses`) read and translated into
 * the chat request a node serves, as gateway/anthropic.ts does for
 * Anthropic Messages: `input` items (messages, `function_call`,
 * `function_call_output`, `reasoning`) become chat messages after
 * `instructions` as a system message; the tools (namespaces flattened,
 * built-in tools left out: responses_tools.ts), `tool_choice` and
 * `text.format` become chat's `tools`, `tool_choice` and `response_format`;
 * `max_output_tokens` becomes `max_tokens`. Every field is one of
 * RESPONSE_FIELDS or refused by name; input items and parts no engine can
 * serve are refused by their param path (`input[2].content[1].type`),
 * never ignored. Hints (`reasoning.effort`, `client_metadata`, built-in
 * tools offered) are accepted and given their local meaning.
 */
import {
  invalidParam as bad,
  OpenAIError,
  unsupportedParam,
} from "../protocol/openai/errors.ts";
import { RESPONSE_FIELDS } from "../protocol/openai/request_fields.ts";
import { MAX_MESSAGES } from "./validate_chat.ts";
import { checkFields } from "./validate_fields.ts";
import { checkModel } from "./validate.ts";
import {
  flatName,
  readToolChoice,
  readTools,
  type ToolNames,
} from "./responses_tools.ts";
import {
  given,
  isObj,
  name,
  nonEmpty,
  object,
  onlyKeys,
  str,
  typed,
} from "./_responses_checks.ts";

/** An item of a conversation, in the Responses shape. */
export type Item = Record<string, unknown>;

/** What the response object repeats of its request. */
export interface ResponseEcho {
  instructions: string | null;
  max_output_tokens: number | null;
  max_tool_calls: number | null;
  metadata: Record<string, string>;
  parallel_tool_calls: boolean;
  previous_response_id: string | null;
  prompt_cache_key: string | null;
  reasoning: { effort: string | null; summary: string | null };
  safety_identifier: string | null;
  store: boolean;
  temperature: number | null;
  text: { format: Record<string, unknown>; verbosity: "medium" };
  tool_choice: unknown;
  tools: Record<string, unknown>[];
  top_logprobs: number;
  top_p: number | null;
  user: string | null;
}

/** A validated Responses request. */
export interface ResponsesRequest {
  model: string;
  stream: boolean;
  store: boolean;
  previousId: string | null;
  instructions: string | null;
  /**
   * This request's input items, normalised; a `reasoning` item holds its
   * `text`, or the `sealed` encrypted_content still to open
   * (responses_reasoning.ts) with `at`, its index in `input`.
   */
  input: Item[];
  /** Whether output text carries logprobs. */
  logprobs: boolean;
  /** Flat names of namespaced functions → namespace and name. */
  names: ToolNames;
  /** Built-in tool types offered and left out of the prompt. */
  omitted: string[];
  /** Each chat tool's path in the request (`tools[1].tools[0]`), by chat index. */
  toolPaths: string[];
  /** `reasoning.effort`: reaches the engine where it has such a control (responses.ts). */
  effort: string | null;
  /** Whether reasoning goes out as summary parts (`reasoning.summary` asked). */
  summary: boolean;
  /** Whether reasoning items carry `encrypted_content` (`include`). */
  encrypted: boolean;
  /** The chat fields besides `model`, `messages` and `stream`. */
  chat: Record<string, unknown>;
  echo: ResponseEcho;
}

/** How a response id looks (`resp_` and up to 128 more characters). */
export const RESPONSE_ID = /^resp_[A-Za-z0-9_-]{1,128}$/;

const int = (v: unknown, lo: number, hi: number) =>
  Number.isSafeInteger(v) && (v as number) >= lo && (v as number) <= hi;

/** The parts of a message's content, normalised; refuses what no engine reads. */
function contentParts(
  c: unknown,
  at: string,
  assistant: boolean,
): Record<string, unknown>[] {
  if (str(c)) {
    return [
      assistant
        ? { type: "output_text", text: c, annotations: [] }
        : { type: "input_text", text: c },
    ];
  }
  if (!Array.isArray(c)) {
    throw bad(
      at,
      `${at} must be a string or an array of content parts`,
      "invalid_type",
    );
  }
  return c.map((raw, j) => {
    const pat = `${at}[${j}]`;
    const part = object(raw, pat);
    const t = part.type;
    if (t === "input_text" || t === "output_text") {
      if (!str(part.text)) {
        throw bad(
          `${pat}.text`,
          `${pat}.text must be a string`,
          "invalid_type",
        );
      }
      return t === "output_text" || assistant
        ? { type: "output_text", text: part.text, annotations: [] }
        : { type: "input_text", text: part.text };
    }
    if (t === "refusal") {
      if (!str(part.refusal)) {
        throw bad(
          `${pat}.refusal`,
          `${pat}.refusal must be a string`,
          "invalid_type",
        );
      }
      return { type: "refusal", refusal: part.refusal };
    }
    if (t === "input_image" && !assistant) {
      if (given(part.file_id)) {
        throw unsupportedParam(
          `${pat}.file_id`,
          `${pat}.file_id: files are not stored here; send the image as image_url (a data: URL)`,
        );
      }
      if (!nonEmpty(part.image_url)) {
        throw bad(
          `${pat}.image_url`,
          `${pat}.image_url is required`,
          "missing_required_parameter",
        );
      }
      typed(part.detail, `${pat}.detail`, str(part.detail), "a string");
      return {
        type: "input_image",
        image_url: part.image_url,
        ...(str(part.detail) ? { detail: part.detail } : {}),
      };
    }
    throw unsupportedParam(
      `${pat}.type`,
      `${pat}.type: content parts of type ${
        String(t).slice(0, 64)
      } are not supported${assistant ? " in assistant messages" : ""}`,
    );
  });
}

const ROLES = ["user", "system", "developer", "assistant"];

/**
 * A `reasoning` item: its sealed `encrypted_content` (opened later), else
 * its `reasoning_text` content; null when it holds neither (a summary
 * alone is not what the model thought).
 */
function reasoningInput(item: Record<string, unknown>, at: string, i: number) {
  const sealed = item.encrypted_content;
  typed(sealed, `${at}.encrypted_content`, nonEmpty(sealed), "a string");
  if (nonEmpty(sealed)) return { type: "reasoning", sealed, at: i };
  const content = item.content;
  typed(content, `${at}.content`, Array.isArray(content), "an array");
  let text = "";
  (Array.isArray(content) ? content : []).forEach((raw, j) => {
    const part = object(raw, `${at}.content[${j}]`);
    if (part.type !== "reasoning_text" || !str(part.text)) {
      throw bad(
        `${at}.content[${j}]`,
        `${at}.content[${j}] must be a reasoning_text part with a string text`,
      );
    }
    text += part.text;
  });
  return text ? { type: "reasoning", text } : null;
}

/** Reads one input item; null for items that are dropped (empty reasoning). */
function inputItem(raw: unknown, at: string, i: number): Item | null {
  const item = object(raw, at);
  const type = item.type ?? (given(item.role) ? "message" : undefined);
  if (type === "message") {
    if (!ROLES.includes(item.role as string)) {
      throw bad(`${at}.role`, `${at}.role must be one of ${ROLES.join(", ")}`);
    }
    const assistant = item.role === "assistant";
    return {
      type: "message",
      role: item.role,
      content: contentParts(item.content, `${at}.content`, assistant),
    };
  }
  if (type === "function_call") {
    if (!nonEmpty(item.call_id)) {
      throw bad(
        `${at}.call_id`,
        `${at}.call_id must be a non-empty string`,
        "missing_required_parameter",
      );
    }
    if (!str(item.arguments)) {
      throw bad(
        `${at}.arguments`,
        `${at}.arguments must be a JSON string`,
        "invalid_type",
      );
    }
    // a namespaced function's call: the model knows it by its flat name
    const ns = item.namespace;
    typed(ns, `${at}.namespace`, nonEmpty(ns), "a non-empty string");
    if (nonEmpty(ns)) name(item.name, `${at}.name`);
    return {
      type: "function_call",
      call_id: item.call_id,
      name: name(
        nonEmpty(ns) ? flatName(ns, item.name as string) : item.name,
        nonEmpty(ns) ? `${at}.namespace` : `${at}.name`,
      ),
      arguments: item.arguments,
    };
  }
  if (type === "function_call_output") {
    if (!nonEmpty(item.call_id)) {
      throw bad(
        `${at}.call_id`,
        `${at}.call_id must be a non-empty string`,
        "missing_required_parameter",
      );
    }
    let output = item.output;
    if (Array.isArray(output)) {
      output = output.map((p, j) => {
        const pat = `${at}.output[${j}]`;
        const part = object(p, pat);
        if (part.type !== "input_text" || !str(part.text)) {
          throw unsupportedParam(
            `${pat}.type`,
            `${pat}: only input_text parts are supported in a function call's output`,
          );
        }
        return part.text;
      }).join("");
    }
    if (!str(output)) {
      throw bad(
        `${at}.output`,
        `${at}.output must be a string or input_text parts`,
        "invalid_type",
      );
    }
    return { type: "function_call_output", call_id: item.call_id, output };
  }
  if (type === "reasoning") return reasoningInput(item, at, i);
  throw unsupportedParam(
    `${at}.type`,
    `${at}.type: input items of type ${
      String(type).slice(0, 64)
    } are not supported (messages, function_call, function_call_output and reasoning are)`,
  );
}

function inputItems(v: unknown): Item[] {
  if (str(v)) {
    return [{
      type: "message",
      role: "user",
      content: [{ type: "input_text", text: v }],
    }];
  }
  if (!Array.isArray(v)) {
    throw bad(
      "input",
      "input must be a string or an array of input items",
      "invalid_type",
    );
  }
  if (v.length > MAX_MESSAGES) {
    throw bad(
      "input",
      `input must hold at most ${MAX_MESSAGES} items`,
      "array_above_max_length",
    );
  }
  const out: Item[] = [];
  v.forEach((raw, i) => {
    const item = inputItem(raw, `input[${i}]`, i);
    if (item) out.push(item);
  });
  return out;
}

/** Reads `text`: the format as echoed and as chat's response_format. */
function textFormat(v: unknown): {
  echo: Record<string, unknown>;
  chat: Record<string, unknown> | undefined;
} {
  const plain = { echo: { type: "text" }, chat: undefined };
  if (!given(v)) return plain;
  const text = object(v, "text");
  onlyKeys(text, "text", ["format", "verbosity"]);
  if (given(text.verbosity) && text.verbosity !== "medium") {
    throw unsupportedParam(
      "text.verbosity",
      `text.verbosity ${
        JSON.stringify(text.verbosity).slice(0, 64)
      } is not supported: no engine of Orchard's can set it`,
    );
  }
  if (!given(text.format)) return plain;
  const f = object(text.format, "text.format");
  if (f.type === "text" || f.type === "json_object") {
    return { echo: { type: f.type }, chat: { type: f.type } };
  }
  if (f.type !== "json_schema") {
    throw bad(
      "text.format.type",
      'text.format.type must be "text", "json_object" or "json_schema"',
    );
  }
  const n = name(f.name, "text.format.name");
  if (!isObj(f.schema)) {
    throw bad(
      "text.format.schema",
      "text.format.schema must be a JSON Schema object",
      given(f.schema) ? "invalid_type" : "missing_required_parameter",
    );
  }
  typed(
    f.strict,
    "text.format.strict",
    typeof f.strict === "boolean",
    "a boolean",
  );
  typed(
    f.description,
    "text.format.description",
    str(f.description),
    "a string",
  );
  const js: Record<string, unknown> = {
    name: n,
    schema: f.schema,
    strict: f.strict === true,
  };
  if (str(f.description)) js.description = f.description;
  return {
    echo: { type: "json_schema", ...js },
    chat: { type: "json_schema", json_schema: js },
  };
}

function metadata(v: unknown): Record<string, string> {
  if (!given(v)) return {};
  const ok = isObj(v) && Object.keys(v).length <= 16 &&
    Object.entries(v).every(([key, x]) =>
      key.length <= 64 && str(x) && x.length <= 512
    );
  if (!ok) {
    throw bad(
      "metadata",
      "metadata must be an object of at most 16 keys (≤ 64 characters) with string values (≤ 512 characters)",
      "invalid_type",
    );
  }
  return v as Record<string, string>;
}

const SUMMARIES = ["auto", "concise", "detailed"];

/** Reads `reasoning`: `effort` (a hint) and `summary` (how reasoning is shown). */
function reasoning(
  v: unknown,
): { effort: string | null; summary: string | null } {
  if (!given(v)) return { effort: null, summary: null };
  const r = object(v, "reasoning");
  onlyKeys(r, "reasoning", ["effort", "summary", "generate_summary"]);
  typed(r.effort, "reasoning.effort", str(r.effort), "a string");
  for (const key of ["summary", "generate_summary"]) {
    const x = r[key];
    if (given(x) && !SUMMARIES.includes(x as string)) {
      throw bad(
        `reasoning.${key}`,
        `reasoning.${key} must be one of ${SUMMARIES.join(", ")} or null`,
      );
    }
  }
  const summary = r.summary ?? r.generate_summary;
  return {
    effort: str(r.effort) ? r.effort : null,
    summary: str(summary) ? summary : null,
  };
}

const LOGPROBS = "message.output_text.logprobs";
const ENCRYPTED = "reasoning.encrypted_content";
/**
 * `include` values that ask for data of built-in tools' calls or of input
 * images: they add to items this gateway never makes (built-in tools are
 * left out) or to nothing it returns, so they ask for nothing it lacks.
 */
const INCLUDE_NOTHING_MORE = [
  "file_search_call.results",
  "web_search_call.results",
  "web_search_call.action.sources",
  "message.input_image.image_url",
  "computer_call_output.output.image_url",
  "code_interpreter_call.outputs",
];

/** Reads `include`: whether logprobs and encrypted reasoning are asked. */
function include(v: unknown): { logprobs: boolean; encrypted: boolean } {
  const out = { logprobs: false, encrypted: false };
  if (!given(v)) return out;
  if (!Array.isArray(v)) {
    throw bad("include", "include must be an array of strings", "invalid_type");
  }
  for (const x of v) {
    if (x === LOGPROBS) out.logprobs = true;
    else if (x === ENCRYPTED) out.encrypted = true;
    else if (!INCLUDE_NOTHING_MORE.includes(x)) {
      throw bad(
        "include",
        `include ${JSON.stringify(x).slice(0, 64)} is not supported: use ${
          [LOGPROBS, ENCRYPTED, ...INCLUDE_NOTHING_MORE].join(", ")
        }`,
      );
    }
  }
  return out;
}

/**
 * Checks `client_metadata` (an object of strings, as Codex CLI sends its
 * session and turn ids): accepted, never echoed, logged or put in a prompt.
 */
function clientMetadata(v: unknown): void {
  if (!given(v)) return;
  const ok = isObj(v) && Object.keys(v).length <= 64 &&
    Object.entries(v).every(([key, x]) =>
      key.length <= 256 && str(x) && x.length <= 16_384
    );
  if (!ok) {
    throw bad(
      "client_metadata",
      "client_metadata must be an object of at most 64 keys (≤ 256 characters) with string values (≤ 16384 characters)",
      "invalid_type",
    );
  }
}

/** Fields copied to the chat request as they are (the chat validation checks them). */
const PASSED = [
  "temperature",
  "top_p",
  "parallel_tool_calls",
  "user",
  "safety_identifier",
  "prompt_cache_key",
  "seed",
  "presence_penalty",
  "frequency_penalty",
  "top_k",
  "min_p",
  "repeat_penalty",
];

/** Validates a Responses request body. */
export function parseResponses(
  body: Record<string, unknown>,
): ResponsesRequest {
  checkFields(body, RESPONSE_FIELDS);
  const model = checkModel(body);
  typed(body.stream, "stream", typeof body.stream === "boolean", "a boolean");
  const stream = body.stream === true;
  const so = body.stream_options;
  if (given(so)) {
    if (!stream) {
      throw bad(
        "stream_options",
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
      );
    }
    onlyKeys(object(so, "stream_options"), "stream_options", []);
  }
  typed(body.store, "store", typeof body.store === "boolean", "a boolean");
  const prev = body.previous_response_id;
  if (given(prev) && !(str(prev) && RESPONSE_ID.test(prev))) {
    throw bad(
      "previous_response_id",
      "previous_response_id must be the id of a response (resp_…)",
    );
  }
  typed(
    body.instructions,
    "instructions",
    str(body.instructions),
    "a string",
  );
  if (!given(body.input) && !given(prev)) {
    throw bad(
      "input",
      "input is required (a string or an array of input items)",
      "missing_required_parameter",
    );
  }
  const input = given(body.input) ? inputItems(body.input) : [];
  const maxOut = body.max_output_tokens;
  if (given(maxOut) && !int(maxOut, 1, 10_000_000)) {
    throw bad(
      "max_output_tokens",
      "max_output_tokens must be an integer from 1 to 10000000",
      "invalid_type",
    );
  }
  const mtc = body.max_tool_calls;
  typed(mtc, "max_tool_calls", int(mtc, 1, 1 << 20), "a positive integer");
  const top = body.top_logprobs;
  if (given(top) && !int(top, 0, 20)) {
    throw bad("top_logprobs", "top_logprobs must be an integer from 0 to 20");
  }
  const t = readTools(body.tools);
  const tc = readToolChoice(body.tool_choice, t.callable, t.omitted);
  const fmt = textFormat(body.text);
  const meta = metadata(body.metadata);
  clientMetadata(body.client_metadata);
  const rs = reasoning(body.reasoning);
  const inc = include(body.include);
  // top_logprobs: 0 is the default and asks for nothing
  const logprobs = inc.logprobs || (top as number) > 0;
  const chat: Record<string, unknown> = {};
  for (const f of PASSED) if (given(body[f])) chat[f] = body[f];
  if (given(maxOut)) chat.max_tokens = maxOut;
  if (t.chat.length > 0) chat.tools = t.chat;
  if (tc.chat !== undefined) chat.tool_choice = tc.chat;
  if (fmt.chat) chat.response_format = fmt.chat;
  if (logprobs) {
    chat.logprobs = true;
    if (given(top)) chat.top_logprobs = top;
  }
  const store = body.store !== false;
  const orNull = <T>(v: unknown, ok: (x: unknown) => boolean) =>
    given(v) && ok(v) ? v as T : null;
  return {
    model,
    stream,
    store,
    previousId: given(prev) ? prev as string : null,
    instructions: orNull<string>(body.instructions, str),
    input,
    logprobs,
    names: t.names,
    omitted: t.omitted,
    toolPaths: t.paths,
    effort: rs.effort,
    summary: rs.summary !== null,
    encrypted: inc.encrypted,
    chat,
    echo: {
      instructions: orNull<string>(body.instructions, str),
      max_output_tokens: given(maxOut) ? maxOut as number : null,
      max_tool_calls: given(mtc) ? mtc as number : null,
      metadata: meta,
      parallel_tool_calls: body.parallel_tool_calls !== false,
      previous_response_id: given(prev) ? prev as string : null,
      prompt_cache_key: orNull<string>(body.prompt_cache_key, str),
      reasoning: rs,
      safety_identifier: orNull<string>(body.safety_identifier, str),
      store,
      temperature: orNull<number>(
        body.temperature,
        (x) => typeof x === "number",
      ),
      text: { format: fmt.echo, verbosity: "medium" },
      tool_choice: tc.echo,
      tools: t.echo,
      top_logprobs: given(top) ? top as number : 0,
      top_p: orNull<number>(body.top_p, (x) => typeof x === "number"),
      user: orNull<string>(body.user, str),
    },
  };
}

function partsText(parts: unknown): string {
  let s = "";
  for (const p of parts as Record<string, unknown>[]) {
    if (str(p.text)) s += p.text;
    else if (str(p.refusal)) s += p.refusal;
  }
  return s;
}

/** A user, system or developer message's chat content: a string when all text. */
function chatContent(parts: Record<string, unknown>[]): unknown {
  if (parts.every((p) => p.type === "input_text" || p.type === "output_text")) {
    return parts.length === 1 ? parts[0]!.text : parts.map((p) => ({
      type: "text",
      text: p.text,
    }));
  }
  return parts.map((p) =>
    p.type === "input_image"
      ? {
        type: "image_url",
        image_url: {
          url: p.image_url,
          ...(str(p.detail) ? { detail: p.detail } : {}),
        },
      }
      : { type: "text", text: str(p.text) ? p.text : p.refusal }
  );
}

/**
 * The chat messages of a conversation: `instructions` first, then the
 * items (earlier turns' items, then `fresh` ones: the request's input).
 * A `function_call` joins the assistant message just before it (one
 * message holds a turn's text and its parallel calls); a
 * `function_call_output` must answer an earlier call (400 naming
 * `input[i].call_id` otherwise). A `reasoning` item's text becomes the
 * `reasoning_content` of the assistant turn after it (templates that know
 * it, as Qwen3's, render it; others leave it out); reasoning with no
 * assistant turn after it is dropped.
 */
export function chatMessages(
  instructions: string | null,
  items: Item[],
  fresh: number,
): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  if (instructions) out.push({ role: "system", content: instructions });
  const calls = new Set<string>();
  const first = items.length - fresh;
  let thought: string | null = null; // reasoning waiting for its assistant turn
  const assistant = (m: Record<string, unknown>) => {
    if (thought !== null) m.reasoning_content = thought;
    thought = null;
    return m;
  };
  items.forEach((item, i) => {
    if (item.type === "reasoning") {
      if (str(item.text)) {
        thought = thought === null ? item.text : `${thought}\n${item.text}`;
      }
    } else if (item.type === "message") {
      const parts = item.content as Record<string, unknown>[];
      if (item.role !== "assistant") thought = null;
      out.push(
        item.role === "assistant"
          ? assistant({ role: "assistant", content: partsText(parts) })
          : { role: item.role, content: chatContent(parts) },
      );
    } else if (item.type === "function_call") {
      const call = {
        id: item.call_id,
        type: "function",
        function: { name: item.name, arguments: item.arguments },
      };
      calls.add(item.call_id as string);
      const last = out[out.length - 1];
      if (last?.role === "assistant") {
        ((last.tool_calls ??= []) as unknown[]).push(call);
        if (thought !== null && last.reasoning_content === undefined) {
          assistant(last);
        }
      } else {
        out.push(
          assistant({ role: "assistant", content: null, tool_calls: [call] }),
        );
      }
    } else if (item.type === "function_call_output") {
      thought = null;
      if (!calls.has(item.call_id as string)) {
        const at = `input[${Math.max(0, i - first)}].call_id`;
        throw bad(
          at,
          `No tool call found for function call output with call_id ${
            String(item.call_id).slice(0, 128)
          }.`,
        );
      }
      out.push({
        role: "tool",
        tool_call_id: item.call_id,
        content: item.output,
      });
    }
  });
  if (out.length === (instructions ? 1 : 0)) {
    throw new OpenAIError(
      400,
      "missing_required_parameter",
      "input must hold at least one message or item",
      { param: "input" },
    );
  }
  return out;
}
