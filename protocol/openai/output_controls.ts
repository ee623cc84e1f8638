/**
 * The chat fields that shape the output rather than sample it: `tools`,
 * `tool_choice`, `parallel_tool_calls` and `response_format`. One parser
 * for both sides of the wire: the gateway validates a client's request
 * with it (each 400 names the exact param path, as OpenAI does:
 * `tools[0].function.name`), and the llama engine reads the same fields
 * into `OutputControls` with it (grammars, templates, tool-call parsing).
 */
import { invalidParam as bad, unsupportedParam } from "./errors.ts";

/** Names of functions and JSON schemas, as OpenAI accepts them. */
export const NAME_PATTERN = /^[a-zA-Z0-9_-]{1,64}$/;
/** Most tools in one chat request (OpenAI's limit). */
export const MAX_TOOLS = 128;

/** A function the model may call. */
export interface ToolDef {
  name: string;
  description?: string;
  /** JSON Schema of the arguments object. */
  parameters: Record<string, unknown>;
  /** The arguments must match `parameters` exactly (OpenAI's `function.strict`, Anthropic's `strict`). */
  strict?: boolean;
}

/**
 * The response header naming tools whose argument schemas the grammar
 * could not enforce exactly and loosened (`loose=Name1,Name2`): set by the
 * llama engine, passed on to the client by the gateway.
 */
export const TOOL_GRAMMAR_HEADER = "x-orchard-tool-grammar";

/** The value of TOOL_GRAMMAR_HEADER for these tools. */
export function toolGrammarNote(loose: string[]): string {
  return `loose=${loose.join(",")}`;
}

/** Whether and which tool the model must call. */
export type ToolChoice = "auto" | "none" | "required" | { name: string };

/** The shape the assistant's text must take. */
export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object" }
  | { type: "json_schema"; name: string; schema: unknown; strict: boolean };

/** Everything that constrains what a chat generation may output. */
export interface OutputControls {
  tools: ToolDef[];
  toolChoice: ToolChoice;
  parallelToolCalls: boolean;
  responseFormat: ResponseFormat;
  /** `tools` as sent, for the chat template (null when no tool is offered). */
  rawTools: Record<string, unknown>[] | null;
}

const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);
const given = (v: unknown) => v !== undefined && v !== null;

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

/** Reads `tools`: function tools only, names unique. */
export function parseTools(v: unknown): ToolDef[] {
  if (!given(v)) return [];
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
  const seen = new Set<string>();
  return v.map((t, i) => {
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
    const where = `${at}.function`;
    const fn = object(tool.function, where);
    const n = name(fn.name, `${where}.name`);
    if (seen.has(n)) {
      throw bad(`${where}.name`, `${where}.name: ${n} is declared twice`);
    }
    seen.add(n);
    optional(
      fn,
      "description",
      where,
      (x) => typeof x === "string",
      "a string",
    );
    optional(fn, "parameters", where, isObj, "a JSON Schema object");
    optional(fn, "strict", where, (x) => typeof x === "boolean", "a boolean");
    return {
      name: n,
      ...(typeof fn.description === "string"
        ? { description: fn.description }
        : {}),
      parameters: (fn.parameters as Record<string, unknown> | undefined) ??
        { type: "object", properties: {} },
      ...(fn.strict === true ? { strict: true } : {}),
    };
  });
}

/** Reads `tool_choice` against the declared tools. */
export function parseToolChoice(v: unknown, tools: ToolDef[]): ToolChoice {
  if (!given(v)) return "auto";
  if (v === "none" || v === "auto") return v;
  if (v === "required") {
    if (tools.length > 0) return v;
    throw bad("tool_choice", 'tool_choice "required" needs at least one tool');
  }
  if (isObj(v) && v.type === "function") {
    const fn = object(v.function, "tool_choice.function");
    const n = name(fn.name, "tool_choice.function.name");
    if (tools.some((t) => t.name === n)) return { name: n };
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

/** Reads `response_format`. */
export function parseResponseFormat(v: unknown): ResponseFormat {
  if (!given(v)) return { type: "text" };
  const rf = object(v, "response_format");
  if (rf.type === "text" || rf.type === "json_object") return { type: rf.type };
  if (rf.type !== "json_schema") {
    throw bad(
      "response_format.type",
      'response_format.type must be "text", "json_object" or "json_schema"',
    );
  }
  const at = "response_format.json_schema";
  const js = object(rf.json_schema, at);
  const n = name(js.name, `${at}.name`);
  optional(js, "schema", at, isObj, "a JSON Schema object");
  optional(js, "strict", at, (x) => typeof x === "boolean", "a boolean");
  optional(js, "description", at, (x) => typeof x === "string", "a string");
  return {
    type: "json_schema",
    name: n,
    schema: js.schema ?? {},
    strict: js.strict === true,
  };
}

/** Reads (and so validates) the output-shaping fields of a chat body. */
export function parseOutputControls(
  body: Record<string, unknown>,
): OutputControls {
  const tools = parseTools(body.tools);
  const toolChoice = parseToolChoice(body.tool_choice, tools);
  const ptc = body.parallel_tool_calls;
  if (given(ptc) && typeof ptc !== "boolean") {
    throw bad(
      "parallel_tool_calls",
      "parallel_tool_calls must be a boolean",
      "invalid_type",
    );
  }
  const responseFormat = parseResponseFormat(body.response_format);
  const offered = tools.length > 0 && toolChoice !== "none";
  return {
    tools: offered ? tools : [],
    toolChoice: offered ? toolChoice : "none",
    parallelToolCalls: ptc !== false,
    responseFormat,
    rawTools: offered ? body.tools as Record<string, unknown>[] : null,
  };
}
