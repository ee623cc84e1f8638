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
 * Top-level fields and what becomes of them. Honoured as they stand:
 * - `metadata`: `user_id` becomes the chat `user` (metering and logs); when
 *   it is Claude Code's JSON (`{"device_id", "session_id", …}`), its
 *   `session_id` becomes the chat `prompt_cache_key` (routing affinity).
 * - `thinking`: an upper bound on reasoning tokens (`budget_tokens`),
 *   checked as Anthropic does, or `adaptive`; a model that does not reason
 *   answers without thinking blocks, which clients handle (Anthropic's own
 *   models may too). Nodes get no reasoning switch (the llama engine has
 *   none), so `enabled`/`adaptive` are reported as ignored.
 * - `service_tier`: every request here is served at the one standard tier.
 * - `context_management`: applied here (anthropic_context.ts).
 * - `output_config`: `format` becomes `response_format` (enforced);
 *   `effort` is validated and reported as ignored.
 * - `safeguards`: Anthropic's server-side classifier of tool calls; none
 *   runs here, and no `safeguard_results` are returned, which Claude Code
 *   reads as "server has no result" (auto mode falls back to its local
 *   classifier). Reported as ignored.
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

/** `output_config.effort` values (Anthropic's, as of the effort beta). */
const EFFORTS = new Set(["low", "medium", "high", "xhigh", "max"]);

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

/**
 * Checks `thinking`; returns whether it asks for reasoning (enabled or
 * adaptive). `display` says how thinking is shown: with no thinking blocks
 * in the answer there is nothing to show.
 */
function thinking(v: unknown, maxTokens: number): boolean {
  if (v === undefined || v === null) return false;
  if (!isObj(v)) throw bad("thinking", "must be an object");
  for (const k of Object.keys(v)) {
    if (!["type", "budget_tokens", "display"].includes(k)) {
      throw refuse(`thinking.${k}`, "is not a known field");
    }
  }
  const d = v.display;
  if (
    d !== undefined && d !== null &&
    !(typeof d === "string" && ["summarized", "omitted", "updates"].includes(d))
  ) {
    throw bad(
      "thinking.display",
      'must be "summarized", "omitted" or "updates"',
    );
  }
  if (v.type === "disabled") return false;
  if (v.type === "adaptive") return true;
  if (v.type !== "enabled") {
    throw bad("thinking.type", 'must be "enabled", "adaptive" or "disabled"');
  }
  const b = v.budget_tokens;
  if (!Number.isSafeInteger(b) || (b as number) < 1024) {
    throw bad("thinking.budget_tokens", "must be an integer ≥ 1024");
  }
  if ((b as number) >= maxTokens) {
    throw bad("thinking.budget_tokens", "must be less than max_tokens");
  }
  return true;
}

/** Reads `output_config`: whether it sets an effort, and the response format it asks for. */
function outputConfig(
  v: unknown,
): { effort: boolean; format: Record<string, unknown> | null } {
  if (v === undefined || v === null) return { effort: false, format: null };
  if (!isObj(v)) throw bad("output_config", "must be an object");
  for (const k of Object.keys(v)) {
    if (
      k !== "effort" && k !== "format" && v[k] !== undefined && v[k] !== null
    ) {
      throw refuse(`output_config.${k}`, "is not supported by this gateway");
    }
  }
  const e = v.effort;
  if (e !== undefined && e !== null && !EFFORTS.has(e as string)) {
    throw bad(
      "output_config.effort",
      `must be one of ${[...EFFORTS].join(", ")}`,
    );
  }
  const f = v.format;
  let format: Record<string, unknown> | null = null;
  if (f !== undefined && f !== null) {
    if (!isObj(f) || f.type !== "json_schema" || !isObj(f.schema)) {
      throw bad(
        "output_config.format",
        'must be {"type": "json_schema", "schema": {…}}',
      );
    }
    // Anthropic's structured outputs guarantee the schema: enforced exactly
    format = {
      type: "json_schema",
      json_schema: { name: "output", schema: f.schema, strict: true },
    };
  }
  return { effort: e !== undefined && e !== null, format };
}

/** `safeguards`: an array of typed requests for server-side checks, none of which run here. */
function safeguards(v: unknown): boolean {
  if (v === undefined || v === null) return false;
  if (
    !Array.isArray(v) ||
    !v.every((s) => isObj(s) && typeof s.type === "string")
  ) {
    throw bad("safeguards", "must be an array of objects with a type");
  }
  return v.length > 0;
}

function metadataUser(v: unknown): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (!isObj(v)) throw bad("metadata", "must be an object");
  for (const k of Object.keys(v)) {
    if (k !== "user_id") throw refuse(`metadata.${k}`, "is not a known field");
  }
  if (v.user_id === undefined || v.user_id === null) return undefined;
  if (typeof v.user_id !== "string" || v.user_id.length > 256) {
    throw bad("metadata.user_id", "must be a string of at most 256 characters");
  }
  return v.user_id;
}

/** Claude Code's `user_id` is JSON with a `session_id`: one conversation's stable key. */
function sessionOf(user: string): string | null {
  if (!user.startsWith("{")) return null;
  try {
    const id = (JSON.parse(user) as Record<string, unknown>)?.session_id;
    return typeof id === "string" && id.length > 0 && id.length <= 128
      ? id
      : null;
  } catch {
    return null;
  }
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
  const ignored: string[] = [];
  if (thinking(body.thinking, maxTokens as number)) ignored.push("thinking");
  const config = outputConfig(body.output_config);
  if (config.effort) ignored.push("output_config.effort");
  if (safeguards(body.safeguards)) ignored.push("safeguards");
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
  const user = metadataUser(body.metadata);
  if (user !== undefined) {
    chat.user = user;
    const session = sessionOf(user);
    if (session !== null) chat.prompt_cache_key = session;
  }
  if (config.format) chat.response_format = config.format;
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
    ignored,
  };
}
