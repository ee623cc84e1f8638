/**
 * Anthropic's context editing (`context_management.edits`, beta
 * `context-management-2025-06-27`), applied by the gateway to the Messages
 * request before it is translated, as Anthropic applies it server-side: the
 * client keeps its full history, the model sees the edited one, and the
 * answer reports `context_management.applied_edits`.
 *
 * - `clear_tool_uses_20250919`: once the prompt passes `trigger` (input
 *   tokens, the gateway's estimate: about 4 bytes a token; default 100 000;
 *   or a number of tool uses), the results of all but the `keep` most
 *   recent tool uses (default 3) are replaced by a placeholder, oldest
 *   first, except for tools in `exclude_tools`; `clear_tool_inputs` (true,
 *   or tool names) empties their `tool_use` inputs too. With
 *   `clear_at_least`, nothing is cleared unless that many tokens can be.
 * - `clear_thinking_20251015`: thinking blocks of all but the `keep` most
 *   recent assistant turns with thinking (default 1; `"all"` keeps every
 *   one). The translation leaves earlier turns' thinking out of the prompt
 *   anyway; this edit reports the turns it would clear.
 *
 * Compaction (`compact_20260112`) returns a summary block this gateway
 * cannot write: it is refused with a 400 naming it.
 */
import { OpenAIError, unsupportedParam } from "../protocol/openai/errors.ts";
import { promptSize, textBytes } from "./tokens.ts";

/** What replaces a cleared tool result (the model learns it was removed). */
export const CLEARED_RESULT = "[Tool result cleared to save context]";

/** One entry of `context_management.applied_edits`, in Anthropic's shape. */
export type AppliedEdit =
  | {
    type: "clear_tool_uses_20250919";
    cleared_tool_uses: number;
    cleared_input_tokens: number;
  }
  | {
    type: "clear_thinking_20251015";
    cleared_thinking_turns: number;
    cleared_input_tokens: number;
  };

/** A request's messages after its edits, and what the edits cleared. */
export interface ContextEdits {
  messages: unknown[];
  /** Edits that cleared something (Anthropic lists only those). */
  applied: AppliedEdit[];
}

type Obj = Record<string, unknown>;

const isObj = (v: unknown): v is Obj =>
  v !== null && typeof v === "object" && !Array.isArray(v);

function bad(param: string, message: string): OpenAIError {
  return new OpenAIError(400, "invalid_value", `${param}: ${message}`, {
    param,
  });
}

/** Typical tokens of a JSON value's text (the gateway's estimate: 4 bytes a token). */
const tokensOf = (v: unknown) => Math.ceil(textBytes(v) / 4);

/** `{type, value}` with one of `types` and a non-negative integer value. */
function counter(
  v: unknown,
  at: string,
  types: string[],
  fallback: { type: string; value: number },
): { type: string; value: number } {
  if (v === undefined || v === null) return fallback;
  if (!isObj(v) || !types.includes(String(v.type))) {
    throw bad(
      at,
      `must be {"type": ${types.map((t) => `"${t}"`).join(" | ")}, "value": …}`,
    );
  }
  if (!Number.isSafeInteger(v.value) || (v.value as number) < 0) {
    throw bad(`${at}.value`, "must be an integer ≥ 0");
  }
  return { type: v.type as string, value: v.value as number };
}

function names(v: unknown, at: string): Set<string> {
  if (v === undefined || v === null) return new Set();
  if (!Array.isArray(v) || !v.every((x) => typeof x === "string")) {
    throw bad(at, "must be an array of tool names");
  }
  return new Set(v as string[]);
}

function onlyKeys(o: Obj, at: string, keys: string[]) {
  for (const k of Object.keys(o)) {
    if (!keys.includes(k) && o[k] !== undefined) {
      throw unsupportedParam(`${at}.${k}`, `${at}.${k}: is not a known field`);
    }
  }
}

/** One tool use in the conversation: where its call and its result are. */
interface ToolUse {
  id: string;
  name: string;
  call: Obj;
  results: Obj[];
}

/** The conversation's tool uses, oldest first (blocks are the messages' own, to be replaced). */
function toolUses(messages: Obj[]): ToolUse[] {
  const uses: ToolUse[] = [];
  const byId = new Map<string, ToolUse>();
  for (const m of messages) {
    if (!Array.isArray(m.content)) continue;
    for (const b of m.content) {
      if (!isObj(b)) continue;
      if (b.type === "tool_use" && m.role === "assistant") {
        const u = {
          id: String(b.id ?? ""),
          name: String(b.name ?? ""),
          call: b,
          results: [],
        };
        uses.push(u);
        if (u.id) byId.set(u.id, u);
      } else if (b.type === "tool_result") {
        byId.get(String(b.tool_use_id ?? ""))?.results.push(b);
      }
    }
  }
  return uses;
}

const loadsTools = (b: unknown) => isObj(b) && b.type === "tool_reference";

/** Copies the messages deep enough that blocks can be replaced without touching the client's body. */
function copyMessages(messages: unknown[]): Obj[] {
  return messages.map((m) =>
    isObj(m) && Array.isArray(m.content)
      ? { ...m, content: m.content.map((b) => isObj(b) ? { ...b } : b) }
      : m
  ) as Obj[];
}

function clearToolUses(
  e: Obj,
  at: string,
  messages: Obj[],
  inputTokens: number,
): AppliedEdit | null {
  onlyKeys(e, at, [
    "type",
    "trigger",
    "keep",
    "clear_at_least",
    "exclude_tools",
    "clear_tool_inputs",
  ]);
  const trigger = counter(e.trigger, `${at}.trigger`, [
    "input_tokens",
    "tool_uses",
  ], { type: "input_tokens", value: 100_000 });
  const keep = counter(e.keep, `${at}.keep`, ["tool_uses"], {
    type: "tool_uses",
    value: 3,
  });
  const atLeast = counter(e.clear_at_least, `${at}.clear_at_least`, [
    "input_tokens",
  ], { type: "input_tokens", value: 0 });
  const excluded = names(e.exclude_tools, `${at}.exclude_tools`);
  const cti = e.clear_tool_inputs;
  if (
    cti !== undefined && cti !== null && typeof cti !== "boolean" &&
    !(Array.isArray(cti) && cti.every((x) => typeof x === "string"))
  ) {
    throw bad(`${at}.clear_tool_inputs`, "must be a boolean or tool names");
  }
  const clearInput = (name: string) =>
    cti === true || (Array.isArray(cti) && cti.includes(name));
  const uses = toolUses(messages);
  const fired = trigger.type === "input_tokens"
    ? inputTokens > trigger.value
    : uses.length > trigger.value;
  if (!fired) return null;
  const cleared = uses.slice(0, Math.max(0, uses.length - keep.value))
    .filter((u) => !excluded.has(u.name));
  let tokens = 0;
  let count = 0;
  const edits: (() => void)[] = [];
  for (const u of cleared) {
    let freed = 0;
    for (const r of u.results) {
      // a tool search's result loads deferred tools (anthropic_tools.ts): kept
      if (Array.isArray(r.content) && r.content.some(loadsTools)) continue;
      const before = tokensOf(r.content ?? "");
      if (before <= tokensOf(CLEARED_RESULT)) continue;
      freed += before - tokensOf(CLEARED_RESULT);
      edits.push(() => (r.content = CLEARED_RESULT));
    }
    if (clearInput(u.name) && tokensOf(u.call.input ?? {}) > 0) {
      freed += tokensOf(u.call.input);
      edits.push(() => (u.call.input = {}));
    }
    if (freed > 0) {
      tokens += freed;
      count++;
    }
  }
  if (count === 0 || tokens < atLeast.value) return null;
  for (const edit of edits) edit();
  return {
    type: "clear_tool_uses_20250919",
    cleared_tool_uses: count,
    cleared_input_tokens: tokens,
  };
}

function clearThinking(
  e: Obj,
  at: string,
  messages: Obj[],
): AppliedEdit | null {
  onlyKeys(e, at, ["type", "keep"]);
  const k = e.keep;
  let keep = 1;
  if (k === "all" || (isObj(k) && k.type === "all")) keep = Infinity;
  else if (k !== undefined && k !== null) {
    keep = counter(k, `${at}.keep`, ["thinking_turns"], {
      type: "thinking_turns",
      value: 1,
    }).value;
  }
  const thinking = (b: unknown) =>
    isObj(b) && (b.type === "thinking" || b.type === "redacted_thinking");
  const turns = messages.filter((m) =>
    m.role === "assistant" && Array.isArray(m.content) &&
    m.content.some(thinking)
  );
  const cleared = turns.slice(0, Math.max(0, turns.length - keep));
  if (cleared.length === 0) return null;
  let tokens = 0;
  for (const m of cleared) {
    const blocks = m.content as unknown[];
    for (const b of blocks.filter(thinking) as Obj[]) {
      tokens += tokensOf(b.thinking ?? b.data ?? "");
    }
    m.content = blocks.filter((b) => !thinking(b));
  }
  return {
    type: "clear_thinking_20251015",
    cleared_thinking_turns: cleared.length,
    cleared_input_tokens: tokens,
  };
}

/** The estimated input tokens of a Messages body (system, messages, tools). */
export function estimateInput(body: Obj, messages: unknown[]): number {
  const bytes = textBytes(body.system ?? null) + textBytes(messages) +
    textBytes(body.tools ?? null);
  return promptSize(bytes, messages.length + (body.system ? 1 : 0)).estimate;
}

/**
 * Applies `context_management` to the body's messages; null when the
 * request has none. Throws a 400 naming the field for a malformed or
 * unsupported edit.
 */
export function applyContextManagement(body: Obj): ContextEdits | null {
  const cm = body.context_management;
  if (cm === undefined || cm === null) return null;
  if (!isObj(cm)) throw bad("context_management", "must be an object");
  onlyKeys(cm, "context_management", ["edits"]);
  const edits = cm.edits ?? [];
  if (!Array.isArray(edits)) {
    throw bad("context_management.edits", "must be an array");
  }
  const source = Array.isArray(body.messages) ? body.messages : [];
  const messages = copyMessages(source);
  let tokens = estimateInput(body, source);
  const applied: AppliedEdit[] = [];
  edits.forEach((e, i) => {
    const at = `context_management.edits.${i}`;
    if (!isObj(e)) throw bad(at, "must be an object");
    let done: AppliedEdit | null;
    if (e.type === "clear_tool_uses_20250919") {
      done = clearToolUses(e, at, messages, tokens);
    } else if (e.type === "clear_thinking_20251015") {
      done = clearThinking(e, at, messages);
    } else {
      throw unsupportedParam(
        `${at}.type`,
        `${at}.type: ${
          String(e.type).slice(0, 40)
        } is not supported; clear_tool_uses_20250919 and clear_thinking_20251015 are`,
      );
    }
    if (done) {
      applied.push(done);
      tokens = Math.max(0, tokens - done.cleared_input_tokens);
    }
  });
  return { messages, applied };
}
