/**
 * The Responses API's tools as the model sees them, and its calls as the
 * client expects them back. Two kinds of tool are not plain functions:
 *
 * - `namespace` tools group function tools (Codex CLI sends its sub-agent
 *   tools as `multi_agent_v1`). The model sees each as one function named
 *   `<namespace>__<name>`, Codex's own flat spelling of a namespaced tool;
 *   a call to it goes back as a `function_call` item with `namespace` and
 *   the bare `name`, as OpenAI answers, and such an item sent as input is
 *   joined again. Names are restored through the map of the tools actually
 *   flattened, never by splitting at `__` (a namespace may hold it too).
 * - built-in tools that run on OpenAI's servers or have call items of their
 *   own (`web_search`, `file_search`, `code_interpreter`, …): no node can
 *   run them, so they are left out of what the model sees and named in the
 *   `x-orchard-tools-omitted` response header; a `tool_choice` that
 *   requires one is refused (responses_request.ts).
 */

import {
  invalidParam as bad,
  unsupportedParam,
} from "../protocol/openai/errors.ts";
import { MAX_TOOLS } from "../protocol/openai/output_controls.ts";
import {
  given,
  isObj,
  name,
  object,
  onlyKeys,
  str,
  typed,
} from "./_responses_checks.ts";

/** Built-in tool types: offered, they are left out of the prompt (see above). */
export const BUILT_IN_TOOL =
  /^(?:web_search(?:_preview)?(?:_\d{4}_\d{2}_\d{2})?|file_search|code_interpreter|computer(?:_use(?:_preview)?)?|image_generation|local_shell|shell|apply_patch|mcp|tool_search|programmatic_tool_calling)$/;

/** Where a namespaced function came from: its namespace and bare name. */
export interface Namespaced {
  namespace: string;
  name: string;
}

/** Flat names of namespaced functions → their namespace and name. */
export type ToolNames = ReadonlyMap<string, Namespaced>;

/**
 * The name the model sees for `name` in `namespace`: Codex's canonical flat
 * name (the namespace's trailing and the name's leading underscores
 * trimmed, joined by `__`).
 */
export function flatName(namespace: string, name: string): string {
  return `${namespace.replace(/_+$/, "")}__${name.replace(/^_+/, "")}`;
}

/**
 * A call's name as the client declared it: `{name, namespace}` for a
 * flattened namespaced function, `{name}` otherwise.
 */
export function restoreName(
  names: ToolNames,
  flat: string,
): { name: string; namespace?: string } {
  const n = names.get(flat);
  return n ? { name: n.name, namespace: n.namespace } : { name: flat };
}

/** The tools of a request, as echoed and as chat tools. */
export interface Tools {
  echo: Record<string, unknown>[];
  chat: Record<string, unknown>[];
  /** Every name the model may call (flat for namespaced functions). */
  callable: Set<string>;
  names: Map<string, Namespaced>;
  omitted: string[];
  /** Each chat tool's path in the request (`tools[1].tools[0]`), by chat index. */
  paths: string[];
}

/** Reads one function tool (in a namespace when `ns` is given) into `out`. */
function functionTool(
  t: Record<string, unknown>,
  at: string,
  out: Tools,
  ns: string | null,
): Record<string, unknown> {
  onlyKeys(t, at, ["type", "name", "description", "parameters", "strict"]);
  const bare = name(t.name, `${at}.name`);
  const n = ns === null ? bare : name(flatName(ns, bare), `${at}.name`);
  if (out.callable.has(n)) {
    throw bad(`${at}.name`, `${at}.name: ${n} is declared twice`);
  }
  out.callable.add(n);
  if (ns !== null) out.names.set(n, { namespace: ns, name: bare });
  typed(t.description, `${at}.description`, str(t.description), "a string");
  typed(
    t.parameters,
    `${at}.parameters`,
    isObj(t.parameters),
    "a JSON Schema object",
  );
  typed(t.strict, `${at}.strict`, typeof t.strict === "boolean", "a boolean");
  const fn: Record<string, unknown> = { name: n };
  if (str(t.description)) fn.description = t.description;
  if (isObj(t.parameters)) fn.parameters = t.parameters;
  if (typeof t.strict === "boolean") fn.strict = t.strict;
  out.chat.push({ type: "function", function: fn });
  out.paths.push(at);
  return {
    type: "function",
    name: bare,
    description: str(t.description) ? t.description : null,
    parameters: isObj(t.parameters) ? t.parameters : null,
    strict: typeof t.strict === "boolean" ? t.strict : null,
  };
}

/**
 * Reads the tools: function tools, namespaces of them (flattened), and
 * built-in tools (left out, their types listed in `omitted`).
 */
export function readTools(v: unknown): Tools {
  const out: Tools = {
    echo: [],
    chat: [],
    callable: new Set(),
    names: new Map(),
    omitted: [],
    paths: [],
  };
  if (!given(v)) return out;
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
  v.forEach((raw, i) => {
    const at = `tools[${i}]`;
    const t = object(raw, at);
    if (t.type === "function") {
      out.echo.push(functionTool(t, at, out, null));
    } else if (t.type === "namespace") {
      onlyKeys(t, at, ["type", "name", "description", "tools"]);
      const ns = name(t.name, `${at}.name`);
      typed(
        t.description,
        `${at}.description`,
        str(t.description),
        "a string",
      );
      if (!Array.isArray(t.tools) || t.tools.length === 0) {
        throw bad(
          `${at}.tools`,
          `${at}.tools must be a non-empty array of function tools`,
          "invalid_type",
        );
      }
      const inner = t.tools.map((x, j) => {
        const f = object(x, `${at}.tools[${j}]`);
        if (f.type !== "function") {
          throw unsupportedParam(
            `${at}.tools[${j}].type`,
            `${at}.tools[${j}].type: only function tools are supported in a namespace`,
          );
        }
        return functionTool(f, `${at}.tools[${j}]`, out, ns);
      });
      out.echo.push({
        type: "namespace",
        name: ns,
        description: str(t.description) ? t.description : "",
        tools: inner,
      });
    } else if (str(t.type) && BUILT_IN_TOOL.test(t.type)) {
      if (!out.omitted.includes(t.type)) out.omitted.push(t.type);
      out.echo.push(t);
    } else {
      throw unsupportedParam(
        `${at}.type`,
        `${at}.type: the tool ${
          String(t.type).slice(0, 64)
        } is not supported; declare a function tool`,
      );
    }
  });
  if (out.chat.length > MAX_TOOLS) {
    throw bad(
      "tools",
      `tools must hold at most ${MAX_TOOLS} functions, namespaces' included`,
      "array_above_max_length",
    );
  }
  return out;
}

/** Reads `tool_choice`: its echo and chat form. */
export function readToolChoice(
  v: unknown,
  names: Set<string>,
  omitted: string[],
): { echo: unknown; chat: unknown } {
  if (!given(v) || v === "auto" || v === "none") {
    return { echo: v ?? "auto", chat: v ?? undefined };
  }
  if (v === "required") {
    if (names.size === 0) {
      // only built-in tools (left out), or none at all
      throw (omitted.length > 0 ? unsupportedParam : bad)(
        "tool_choice",
        omitted.length > 0
          ? `tool_choice "required" needs a function tool; the built-in tools offered (${
            omitted.join(", ")
          }) cannot run here`
          : 'tool_choice "required" needs at least one tool',
      );
    }
    return { echo: v, chat: v };
  }
  if (isObj(v) && v.type === "function") {
    const n = name(v.name, "tool_choice.name");
    if (!names.has(n)) {
      throw bad(
        "tool_choice.name",
        `tool_choice names the function ${n}, which is not among tools`,
      );
    }
    return {
      echo: { type: "function", name: n },
      chat: { type: "function", function: { name: n } },
    };
  }
  if (isObj(v) && str(v.type) && BUILT_IN_TOOL.test(v.type)) {
    throw unsupportedParam(
      "tool_choice",
      `tool_choice requires the built-in tool ${v.type}, which no node can run`,
    );
  }
  if (isObj(v) && str(v.type)) {
    throw unsupportedParam(
      "tool_choice.type",
      `tool_choice of type ${
        v.type.slice(0, 64)
      } is not supported; use "auto", "none", "required" or {"type":"function","name":…}`,
    );
  }
  throw bad(
    "tool_choice",
    'tool_choice must be "auto", "none", "required" or {"type":"function","name":…}',
  );
}
