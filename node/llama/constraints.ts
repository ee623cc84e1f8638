/**
 * The grammar a chat generation must follow, from its output controls:
 *
 * | tool_choice          | response_format | grammar                                   |
 * | -------------------- | --------------- | ----------------------------------------- |
 * | required / named     | any             | one call (or several, if parallel)        |
 * | auto                 | text            | lazy: calls, from the family's opener on  |
 * | auto                 | json            | a call list or the JSON value             |
 * | none / no tools      | json            | the JSON value                            |
 * | none / no tools      | text            | none                                      |
 *
 * `response_format` shapes the assistant's content; a forced tool call
 * carries no content, so it is not constrained by the format. Calls are
 * written in the model family's own format (tool_calls.ts), with each
 * function's `parameters` schema enforced on its arguments: exactly where
 * the converter can; for a tool that is not `strict`, a schema it cannot
 * enforce is loosened (the keywords it cannot follow are dropped, see
 * GbnfBuilder.looseSchema) and the tool named in `loose`, since offering a
 * tool does not decide the answer. A `strict` tool's schema, and
 * `response_format`, are enforced exactly or refused with a 400.
 */
import { OpenAIError } from "../../protocol/openai/errors.ts";
import {
  GbnfBuilder,
  JSON_OBJECT_GBNF,
  SchemaError,
} from "./json_schema_grammar.ts";
import type { GrammarSpec } from "./protocol.ts";
import { TOOL_CALL_FORMATS, type ToolFamily } from "./tool_calls.ts";
import type {
  OutputControls,
  ToolDef,
} from "../../protocol/openai/output_controls.ts";

/** Escapes text for a regex. */
function re(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

function schemaError(err: unknown, param: string): never {
  if (err instanceof SchemaError) {
    throw new OpenAIError(
      400,
      "unsupported_parameter",
      `Cannot enforce the JSON Schema at ${param}${
        err.path ? `.${err.path}` : ""
      }: ${err.message}`,
      { param },
    );
  }
  throw err;
}

/** Adds the rule for a sequence of calls to `tools` in `family`'s format; returns its name. */
function callsRule(
  g: GbnfBuilder,
  family: ToolFamily,
  tools: ToolDef[],
  parallel: boolean,
  loose: string[],
): string {
  const f = TOOL_CALL_FORMATS[family];
  // the envelope is literal text: the parameters schema converts on its
  // own, so its `$ref`s resolve against itself
  const key = (k: string) => `${g.literal(JSON.stringify(k))} space ":" space`;
  const alts = tools.map((t, i) => {
    let args: string;
    try {
      args = g.schema(t.parameters, `tool-${i}`);
    } catch (err) {
      if (t.strict || !(err instanceof SchemaError)) {
        schemaError(err, `tools[${i}].function.parameters`);
      }
      args = g.looseSchema(t.parameters, `tool-${i}`).rule;
      loose.push(t.name);
    }
    return g.rule(
      `call-${i}`,
      `"{" space ${key("name")} ${
        g.literal(JSON.stringify(t.name))
      } space "," space ${key(f.argsKey)} ${args} space "}"`,
    );
  });
  const one = g.rule(
    "tool-call",
    `${g.literal(f.open)} (${alts.join(" | ")}) ${g.literal(f.close)}`,
  );
  const seq = parallel ? `${one} (${g.literal(f.separator)} ${one})*` : one;
  return g.rule(
    "tool-calls",
    f.listOpen
      ? `${g.literal(f.listOpen)} ${seq} ${g.literal(f.listClose ?? "")}`
      : seq,
  );
}

/** The JSON rule for a response format, or null for plain text. */
function formatRule(g: GbnfBuilder, o: OutputControls): string | null {
  const rf = o.responseFormat;
  if (rf.type === "text") return null;
  const schema = rf.type === "json_object" ? { type: "object" } : rf.schema;
  try {
    return g.schema(schema, "answer", {
      strict: rf.type === "json_schema" && rf.strict,
    });
  } catch (err) {
    schemaError(err, "response_format.json_schema.schema");
  }
}

/** A chat request's grammar, and the tools whose argument schemas it loosened. */
export interface OutputGrammar {
  /** Null when the output is free text. */
  spec: GrammarSpec | null;
  /** Names of the tools whose schemas could not be enforced exactly. */
  loose: string[];
}

/** Builds the grammar for a chat request. */
export function outputGrammar(
  o: OutputControls,
  family: ToolFamily,
): OutputGrammar {
  const loose: string[] = [];
  return { spec: grammarSpec(o, family, loose), loose };
}

function grammarSpec(
  o: OutputControls,
  family: ToolFamily,
  loose: string[],
): GrammarSpec | null {
  const forced = o.toolChoice === "required" ||
    typeof o.toolChoice === "object";
  const tools = typeof o.toolChoice === "object"
    ? o.tools.filter((t) => t.name === (o.toolChoice as { name: string }).name)
    : o.tools;
  const g = new GbnfBuilder();
  const parallel = o.parallelToolCalls;
  if (tools.length > 0 && forced) {
    return { gbnf: g.build(callsRule(g, family, tools, parallel, loose)) };
  }
  if (tools.length > 0) {
    const calls = callsRule(g, family, tools, parallel, loose);
    const json = formatRule(g, o);
    if (json) return { gbnf: g.build(`${calls} | ${json}`) };
    const f = TOOL_CALL_FORMATS[family];
    const opener = (f.listOpen ?? f.open).trimEnd() || f.open;
    // the output is free text until the family's call opener appears
    return {
      gbnf: g.build(calls),
      triggers: family === "llama3"
        ? [`^\\s*(\\{\\s*"name"[\\s\\S]*)`]
        : [`[\\s\\S]*?(${re(opener)}[\\s\\S]*)`],
    };
  }
  if (o.responseFormat.type === "json_object") {
    return { gbnf: JSON_OBJECT_GBNF };
  }
  const json = formatRule(g, o);
  return json ? { gbnf: g.build(json) } : null;
}
