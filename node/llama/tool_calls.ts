/**
 * Tool calls in generated text: which format a model writes (its family),
 * and an incremental parser that splits the output into content and calls
 * while it streams.
 *
 * - hermes (Qwen, Hermes, most fine-tunes): `<tool_call>\n{"name": "f",
 *   "arguments": {…}}\n</tool_call>`, several, after text or not.
 * - llama3: `{"name": "f", "parameters": {…}}`, optionally after
 *   `<|python_tag|>`, several joined by `;`; only when the output starts
 *   with it (after whitespace).
 * - mistral: `[TOOL_CALLS][{"name": "f", "arguments": {…}}, …]`, or the
 *   newer `[TOOL_CALLS]f[ARGS]{…}` (optionally `[CALL_ID]id` before
 *   `[ARGS]`), after text or not.
 *
 * A call is committed (`call_start`) once its name is known and its
 * arguments object has begun; until then its text is held, and released as
 * text if it turns out not to be a call. Whitespace around calls is not
 * content. The special tokens above must reach the parser as text.
 */
export { ToolCallParser } from "./tool_call_parser.ts";

export type ToolFamily = "hermes" | "llama3" | "mistral";

/** Picks the family from the template source (and model name as a hint); hermes by default. */
export function detectToolFamily(
  template: string | null,
  modelName?: string,
): ToolFamily {
  const t = template ?? "";
  if (t.includes("[TOOL_CALLS]")) return "mistral";
  if (t.includes("<tool_call>")) return "hermes";
  if (
    t.includes("<|python_tag|>") ||
    (t.includes("<|start_header_id|>") && t.includes('"parameters"'))
  ) return "llama3";
  const name = (modelName ?? "").toLowerCase();
  if (/mistral|mixtral|ministral|codestral|devstral|magistral/.test(name)) {
    return "mistral";
  }
  return /llama[-_ ]?3/.test(name) ? "llama3" : "hermes";
}

/** How a family writes one call, for building a constraining grammar: text before the JSON object, after it, the key holding the arguments, and what separates several calls. */
export interface ToolCallFormat {
  open: string;
  close: string;
  argsKey: "arguments" | "parameters";
  separator: string;
  /** For mistral: the whole list is wrapped, e.g. "[TOOL_CALLS][" … "]". */
  listOpen?: string;
  listClose?: string;
}

export const TOOL_CALL_FORMATS: Record<ToolFamily, ToolCallFormat> = {
  hermes: {
    open: "<tool_call>\n",
    close: "\n</tool_call>",
    argsKey: "arguments",
    separator: "\n",
  },
  llama3: { open: "", close: "", argsKey: "parameters", separator: "; " },
  mistral: {
    open: "",
    close: "",
    argsKey: "arguments",
    separator: ", ",
    listOpen: "[TOOL_CALLS][",
    listClose: "]",
  },
};

export type ToolParseEvent =
  | { type: "text"; text: string }
  | { type: "call_start"; index: number; id: string; name: string }
  | { type: "call_args"; index: number; delta: string }
  /** `error`: "truncated" when generation ended inside the arguments, "invalid_arguments" when they are not a JSON object. */
  | {
    type: "call_end";
    index: number;
    error?: "truncated" | "invalid_arguments";
  };
