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
