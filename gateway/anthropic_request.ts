/**
 * Anthropic Messages requests → OpenAI chat bodies, with one table of what
 * is honoured. Coding agents (Claude Code above all) send more than the
 * basic fields: `cache_control` on blocks and tools, `metadata.user_id`,
 * `thinking` and earlier turns' thinking blocks, `system` entries inside
 * `messages`, `service_tier`, `context_management`, `output_config`,
 * `safeguards`. Each is either honoured (translated or, where it only
 * permits or hints, satisfied as it stands), accepted as a hint this
 * gateway cannot act on and reported (`ignored`, sent back in the
 * `x-orchard-ignored` header), or refused with a 400 naming it; never
 * dropped without a word.
 */
import { openAIId } from "./normalise.ts";
import {
  bad,
  cacheControl,
  isObj,
  refuse,
  textOf,
  toolName,
} from "./_anthropic_checks.ts";
import { AnthropicTools } from "./anthropic_tools.ts";
import { type Hints, readHints } from "./anthropic_hints.ts";
import {
  type AppliedEdit,
  applyContextManagement,
} from "./anthropic_context.ts";
import {
  checkModel,
  MAX_MESSAGES,
  parseChat,
  type ParsedRequest,
} from "./validate.ts";

/**
 * Top-level fields; what becomes of each (README's Anthropic field table):
 * - `metadata`, `thinking`, `output_config`, `safeguards`: hints, read in
 *   anthropic_hints.ts (`metadata.user_id` is the chat `user`, Claude
 *   Code's session id the `prompt_cache_key`; `output_config.format` an
 *   enforced `response_format`; `thinking` and `output_config.effort` a
 *   `reasoning_effort` where the model has a reasoning control, else
 *   reported as ignored, as `safeguards` is).
 * - `context_management`: applied here, before translation
 *   (anthropic_context.ts).
 * - `tools`: anthropic_tools.ts (tool search, tool changes).
 * - `service_tier`: every request here is served at the one standard tier.
 */
const FIELDS = new Set([
  "model",
  "messages",
  "system",
  "max_tokens",
  "stop_sequences",
  "stream",
  "temperature",
  "top_p",
  "top_k",
  "tools",
  "tool_choice",
  "metadata",
  "thinking",
  "service_tier",
  "context_management",
  "output_config",
  "safeguards",
]);

/**
 * A system text block that changes on every request and says nothing to
 * the model: Claude Code's billing line (`x-anthropic-billing-header:
 * cc_version=…; cc_entrypoint=…; cch=…;`), the first system block. Left out
 * so the prompt's prefix (and the node's prefix cache) stays the same.
 */
const VOLATILE_SYSTEM = /^x-anthropic-billing-header:/;

/** An Anthropic request as a chat request, and what the answer reports. */
export interface AnthropicRequest {
  chat: ParsedRequest;
  /** `context_management.applied_edits` (null: the request had no `context_management`). */
  applied: AppliedEdit[] | null;
  /** The prompt's estimated tokens before context edits (for count_tokens). */
  originalTokens: number;
  /** Hints accepted that had no effect here, by request path. */
  ignored: string[];
  /** Reasoning asked for: see `Hints` in anthropic_hints.ts. */
  effort: string | null;
  effortPaths: string[];
  thinking: Hints["thinking"];
}

/** Block types in `messages[].content`; `thinking` ones are dropped (see `block`). */
const BLOCKS = new Set([
  "text",
  "image",
  "tool_use",
  "tool_result",
  "thinking",
  "redacted_thinking",
]);

/** `system` as text, without the volatile billing line. */
function systemText(content: unknown, at: string): string {
  if (typeof content === "string") {
    const nl = content.indexOf("\n");
    const first = nl < 0 ? content : content.slice(0, nl);
    return VOLATILE_SYSTEM.test(first)
      ? (nl < 0 ? "" : content.slice(nl + 1))
      : content;
  }
  if (!Array.isArray(content)) return textOf(content, at);
  const all = textOf(content, at); // validates every block, at its own path
  const blocks = content as { text: string }[];
  return blocks.some((b) => VOLATILE_SYSTEM.test(b.text))
    ? blocks.filter((b) => !VOLATILE_SYSTEM.test(b.text)).map((b) => b.text)
      .join("")
    : all;
}

function image(b: Record<string, unknown>, at: string): unknown {
  const s = b.source;
  if (isObj(s) && s.type === "base64" && typeof s.data === "string") {
    return {
      type: "image_url",
      image_url: { url: `data:${s.media_type};base64,${s.data}` },
    };
  }
  if (isObj(s) && s.type === "url" && typeof s.url === "string") {
    return { type: "image_url", image_url: { url: s.url } };
  }
  throw bad(`${at}.source`, "must be a base64 or url image source");
}

/** One message's content blocks → OpenAI messages (tool results become their own). */
function message(
  m: Record<string, unknown>,
  i: number,
  out: Record<string, unknown>[],
  tools: AnthropicTools,
): void {
  const c = m.content;
  if (typeof c === "string") {
    out.push({ role: m.role, content: c });
    return;
  }
  if (!Array.isArray(c)) {
    throw bad(
      `messages.${i}.content`,
      "must be a string or an array of blocks",
    );
  }
  const toolCalls: unknown[] = [];
  const parts: unknown[] = [];
  for (const [j, b] of c.entries()) {
    const at = `messages.${i}.content.${j}`;
    if (!isObj(b) || typeof b.type !== "string") {
      throw bad(at, "blocks must be objects with a type");
    }
    if (!BLOCKS.has(b.type)) {
      throw refuse(
        `${at}.type`,
        `${b.type.slice(0, 40)} blocks are not supported`,
      );
    }
    cacheControl(b.cache_control, at);
    if (b.type === "text") {
      parts.push({ type: "text", text: String(b.text ?? "") });
    } else if (b.type === "image") {
      parts.push(image(b, at));
    } else if (b.type === "tool_use") {
      toolCalls.push({
        id: typeof b.id === "string" && b.id ? b.id : openAIId("toolu_"),
        type: "function",
        function: {
          name: toolName(b.name, `${at}.name`),
          arguments: JSON.stringify(b.input ?? {}),
        },
      });
    } else if (b.type === "tool_result") {
      if (typeof b.tool_use_id !== "string" || !b.tool_use_id) {
        throw bad(
          `${at}.tool_use_id`,
          "Field required: the id of a tool_use block",
        );
      }
      const text = b.content === undefined || b.content === null
        ? ""
        : tools.resultText(b.content, `${at}.content`);
      out.push({
        role: "tool",
        tool_call_id: b.tool_use_id,
        // OpenAI's tool messages carry no error flag: the text says it.
        content: b.is_error === true ? `Error: ${text}` : text,
      });
    } else if (m.role !== "assistant") {
      throw bad(`${at}.type`, "thinking blocks belong to assistant turns");
    }
    // An earlier turn's thinking (and its signature) is left out of the
    // prompt, as Anthropic's API itself does with previous turns' thinking.
  }
  if (parts.length > 0 || toolCalls.length > 0) {
    const msg: Record<string, unknown> = {
      role: m.role,
      content: parts.every((p) => (p as { type: string }).type === "text")
        ? parts.map((p) => (p as { text: string }).text).join("")
        : parts,
    };
    if (toolCalls.length > 0) msg.tool_calls = toolCalls;
    out.push(msg);
  }
}

/**
 * Translates an Anthropic request into an OpenAI chat body (validating as it
 * goes, applying `context_management`), then validates that body as any
 * chat request is.
 */
export function toOpenAI(body: Record<string, unknown>): AnthropicRequest {
  for (const k of Object.keys(body)) {
    if (!FIELDS.has(k) && body[k] !== undefined) {
      throw refuse(k, "is not supported by this gateway");
    }
  }
  const model = checkModel(body);
  const maxTokens = body.max_tokens;
  if (
    !Number.isSafeInteger(maxTokens) || (maxTokens as number) < 1 ||
    (maxTokens as number) > 10_000_000
  ) {
    throw bad("max_tokens", "Field required: an integer from 1");
  }
  const hints = readHints(body, maxTokens as number);
  const tier = body.service_tier;
  if (
    tier !== undefined && tier !== null && tier !== "auto" &&
    tier !== "standard_only"
  ) {
    throw bad("service_tier", 'must be "auto" or "standard_only"');
  }
  if (!Array.isArray(body.messages) || body.messages.length === 0) {
    throw bad("messages", "must be a non-empty array");
  }
  if (body.messages.length > MAX_MESSAGES) {
    throw bad("messages", `must hold at most ${MAX_MESSAGES} items`);
  }
  const edits = applyContextManagement(body);
  const msgs = edits?.messages ?? body.messages;
  const out: Record<string, unknown>[] = [];
  const tools = new AnthropicTools();
  const sys = body.system;
  if (sys !== undefined && sys !== null) {
    const text = systemText(sys, "system");
    if (text) out.push({ role: "system", content: text });
  }
  msgs.forEach((m, i) => {
    // Claude Code and other agents put `system` entries between turns (the
    // Messages API took them in late 2025): they stay system messages, in place
    // (and tool additions or removals: anthropic_tools.ts)
    if (isObj(m) && m.role === "system") {
      const content = tools.systemText(m.content, `messages.${i}.content`);
      return content ? out.push({ role: "system", content }) : 0;
    }
    if (!isObj(m) || (m.role !== "user" && m.role !== "assistant")) {
      throw bad(`messages.${i}.role`, "must be user, assistant or system");
    }
    message(m, i, out, tools);
  });
  const chat: Record<string, unknown> = {
    model,
    messages: out,
    max_tokens: maxTokens,
  };
  if (hints.user !== null) chat.user = hints.user;
  if (hints.session !== null) chat.prompt_cache_key = hints.session;
  if (hints.format) chat.response_format = hints.format;
  for (const f of ["temperature", "top_p", "top_k"]) {
    if (body[f] !== undefined) {
      if (typeof body[f] !== "number") throw bad(f, "must be a number");
      chat[f] = body[f];
    }
  }
  if (body.stop_sequences !== undefined) {
    const s = body.stop_sequences;
    if (!Array.isArray(s) || !s.every((x) => typeof x === "string")) {
      throw bad("stop_sequences", "must be strings");
    }
    chat.stop = s;
  }
  const offered = tools.chatTools(body.tools);
  if (offered !== null) chat.tools = offered;
  const tc = body.tool_choice;
  if (tc !== undefined && tc !== null) {
    if (!isObj(tc)) throw bad("tool_choice", "must be an object");
    chat.tool_choice = tc.type === "any"
      ? "required"
      : tc.type === "tool"
      ? { type: "function", function: { name: tc.name } }
      : tc.type === "none"
      ? "none"
      : tc.type === "auto"
      ? "auto"
      : (() => {
        throw bad("tool_choice.type", "must be auto, any, tool or none");
      })();
    if (tc.disable_parallel_tool_use === true) chat.parallel_tool_calls = false;
  }
  if (body.stream !== undefined && typeof body.stream !== "boolean") {
    throw bad("stream", "must be a boolean");
  }
  chat.stream = body.stream === true;
  const parsed = parseChat(chat);
  const cleared = (edits?.applied ?? [])
    .reduce((n, e) => n + e.cleared_input_tokens, 0);
  return {
    chat: parsed,
    applied: edits?.applied ?? null,
    originalTokens: parsed.prompt.estimate + cleared,
    ignored: hints.ignored,
    effort: hints.effort,
    effortPaths: hints.effortPaths,
    thinking: hints.thinking,
  };
}
