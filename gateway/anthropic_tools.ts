/**
 * An Anthropic request's tools as chat tools, with the two ways Claude Code
 * changes them during a conversation (betas `advanced-tool-use-2025-11-20`
 * and `mid-conversation-tool-changes-2026-07-01`):
 *
 * - Tool search: a tool with `defer_loading: true` is not shown to the
 *   model until a `tool_reference` block (in a `tool_result`, e.g. of
 *   Claude Code's ToolSearch) names it; then it is offered like the others,
 *   and the block reads "Tool loaded: NAME" in the tool result. Deferred
 *   tools never referenced (Claude Code's `DeferredToolPlaceholder`) are
 *   left out.
 * - `system` entries in `messages` with `tool_addition` blocks (a full
 *   definition) and `tool_removal` blocks (a reference by name), applied in
 *   order. Chat tools are one list for the whole prompt, so an added tool
 *   is offered and a removed one is not, wherever the entry stands.
 */
import {
  bad,
  cacheControl,
  isObj,
  refuse,
  textOf,
  toolName,
} from "./_anthropic_checks.ts";

type Obj = Record<string, unknown>;

/** One request's tool changes, gathered while its messages are translated. */
export class AnthropicTools {
  /** Deferred tools a `tool_reference` loaded. */
  readonly #referenced = new Set<string>();
  /** Tools added by `tool_addition` (by name), in order. */
  readonly #added = new Map<string, { def: Obj; at: string }>();
  /** Tools removed by `tool_removal`. */
  readonly #removed = new Set<string>();

  /** A `tool_result`'s content as text; `tool_reference` blocks load their tool. */
  resultText(content: unknown, at: string): string {
    return textOf(content, at, (b, where) => {
      if (b.type !== "tool_reference") return null;
      const name = toolName(b.tool_name ?? b.name, `${where}.tool_name`);
      this.#referenced.add(name);
      return `Tool loaded: ${name}\n`;
    });
  }

  /** A `system` entry's content as text; tool additions and removals are applied. */
  systemText(content: unknown, at: string): string {
    return textOf(content, at, (b, where) => {
      if (b.type === "tool_addition") {
        const t = b.tool;
        if (!isObj(t) || t.type !== "tool_definition" || !isObj(t.definition)) {
          throw bad(
            `${where}.tool`,
            'must be {"type": "tool_definition", "definition": {…}}',
          );
        }
        const def = t.definition;
        const name = toolName(def.name, `${where}.tool.definition.name`);
        this.#removed.delete(name);
        this.#added.set(name, { def, at: `${where}.tool.definition` });
        return "";
      }
      if (b.type === "tool_removal") {
        const t = b.tool;
        if (!isObj(t)) throw bad(`${where}.tool`, "must be a tool reference");
        const name = toolName(t.name ?? t.tool_name, `${where}.tool.name`);
        this.#added.delete(name);
        this.#removed.add(name);
        return "";
      }
      return null;
    });
  }

  /**
   * The chat `tools` for the request's `tools` and the changes seen; null
   * when there are none to offer.
   */
  chatTools(tools: unknown): Obj[] | null {
    if (tools !== undefined && tools !== null && !Array.isArray(tools)) {
      throw bad("tools", "must be an array");
    }
    const out = new Map<string, Obj>();
    for (const [i, t] of ((tools ?? []) as unknown[]).entries()) {
      const fn = chatTool(t, `tools.${i}`);
      const deferred = (t as Obj).defer_loading === true;
      const name = fn.function.name as string;
      if (deferred && !this.#referenced.has(name)) continue;
      out.set(name, fn);
    }
    for (const [name, { def, at }] of this.#added) {
      out.set(name, chatTool(def, at));
    }
    for (const name of this.#removed) out.delete(name);
    return out.size > 0 || Array.isArray(tools) ? [...out.values()] : null;
  }
}

/** One custom tool as a chat function tool. */
function chatTool(t: unknown, at: string): { type: string; function: Obj } {
  if (!isObj(t)) throw bad(at, "must be an object");
  if (t.type !== undefined && t.type !== null && t.type !== "custom") {
    throw refuse(
      `${at}.type`,
      `server tools (${
        String(t.type).slice(0, 64)
      }) are not supported; declare a custom tool`,
    );
  }
  if (t.input_schema !== undefined && !isObj(t.input_schema)) {
    throw bad(`${at}.input_schema`, "must be a JSON Schema object");
  }
  cacheControl(t.cache_control, at);
  for (const k of ["strict", "defer_loading"]) {
    if (t[k] !== undefined && t[k] !== null && typeof t[k] !== "boolean") {
      throw bad(`${at}.${k}`, "must be a boolean");
    }
  }
  const fn: Obj = { name: toolName(t.name, `${at}.name`) };
  if (typeof t.description === "string") fn.description = t.description;
  if (isObj(t.input_schema)) fn.parameters = t.input_schema;
  // strict: the arguments must match the schema exactly (no loosened grammar)
  if (t.strict === true) fn.strict = true;
  return { type: "function", function: fn };
}
