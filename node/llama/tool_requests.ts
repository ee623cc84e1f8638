/**
 * The chat fields that shape the output rather than sample it: `tools`,
 * `tool_choice`, `parallel_tool_calls` and `response_format`, validated into
 * one `OutputControls` (400s in OpenAI's shape naming the exact path).
 */
import { OpenAIError } from "../../lib/openai_errors.ts";
import type { OpenAIBody } from "../engine.ts";

/** A function the model may call. */
export interface ToolDef {
  name: string;
  description?: string;
  /** JSON Schema of the arguments object. */
  parameters: Record<string, unknown>;
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

function bad(param: string, message: string, code = "invalid_value"): never {
  throw new OpenAIError(400, code, message, { param });
}

const NAME = /^[a-zA-Z0-9_-]{1,64}$/;

function parseTools(v: unknown): ToolDef[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) {
    bad("tools", "`tools` must be an array", "invalid_type");
  }
  if (v.length > 128) bad("tools", "`tools` holds at most 128 functions");
  const seen = new Set<string>();
  return v.map((t, i) => {
    const at = `tools[${i}]`;
    if (!isObj(t) || t.type !== "function" || !isObj(t.function)) {
      bad(at, `${at} must be {"type":"function","function":{…}}`);
    }
    const f = t.function;
    if (typeof f.name !== "string" || !NAME.test(f.name)) {
      bad(
        `${at}.function.name`,
        "A function name must be 1 to 64 letters, digits, underscores or dashes",
      );
    }
    if (seen.has(f.name)) {
      bad(`${at}.function.name`, `Duplicate function name ${f.name}`);
    }
    seen.add(f.name);
    const params = f.parameters ?? { type: "object", properties: {} };
    if (!isObj(params)) {
      bad(
        `${at}.function.parameters`,
        "`parameters` must be a JSON Schema object",
      );
    }
    return {
      name: f.name,
      ...(typeof f.description === "string"
        ? { description: f.description }
        : {}),
      parameters: params,
    };
  });
}

function parseToolChoice(v: unknown, tools: ToolDef[]): ToolChoice {
  if (v === undefined || v === null) return "auto";
  if (v === "auto" || v === "none" || v === "required") {
    if (v === "required" && tools.length === 0) {
      bad("tool_choice", "`tool_choice: required` needs at least one tool");
    }
    return v;
  }
  if (
    isObj(v) && v.type === "function" && isObj(v.function) &&
    typeof v.function.name === "string"
  ) {
    const name = v.function.name;
    if (!tools.some((t) => t.name === name)) {
      bad(
        "tool_choice",
        `\`tool_choice\` names ${name}, which is not in \`tools\``,
      );
    }
    return { name };
  }
  bad(
    "tool_choice",
    '`tool_choice` must be "none", "auto", "required" or {"type":"function","function":{"name":…}}',
  );
}

function parseResponseFormat(v: unknown): ResponseFormat {
  if (v === undefined || v === null) return { type: "text" };
  if (!isObj(v)) {
    bad(
      "response_format",
      "`response_format` must be an object",
      "invalid_type",
    );
  }
  if (v.type === "text" || v.type === "json_object") return { type: v.type };
  if (v.type === "json_schema") {
    const js = v.json_schema;
    if (!isObj(js) || typeof js.name !== "string" || !NAME.test(js.name)) {
      bad(
        "response_format.json_schema.name",
        "`json_schema.name` must be 1 to 64 letters, digits, underscores or dashes",
      );
    }
    if (js.schema !== undefined && !isObj(js.schema)) {
      bad("response_format.json_schema.schema", "`schema` must be an object");
    }
    return {
      type: "json_schema",
      name: js.name,
      schema: js.schema ?? {},
      strict: js.strict === true,
    };
  }
  bad(
    "response_format.type",
    "`response_format.type` must be text, json_object or json_schema",
  );
}

/** Validates the output-shaping fields of a chat body. */
export function parseOutputControls(body: OpenAIBody): OutputControls {
  const tools = parseTools(body.tools);
  const toolChoice = parseToolChoice(body.tool_choice, tools);
  const ptc = body.parallel_tool_calls;
  if (ptc !== undefined && ptc !== null && typeof ptc !== "boolean") {
    bad(
      "parallel_tool_calls",
      "`parallel_tool_calls` must be a boolean",
      "invalid_type",
    );
  }
  const offered = tools.length > 0 && toolChoice !== "none";
  return {
    tools: offered ? tools : [],
    toolChoice: offered ? toolChoice : "none",
    parallelToolCalls: ptc !== false,
    responseFormat: parseResponseFormat(body.response_format),
    rawTools: offered ? body.tools as Record<string, unknown>[] : null,
  };
}
