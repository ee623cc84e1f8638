/**
 * OpenAI chat messages → the message shape Hugging Face chat templates
 * expect, as llama.cpp's server builds it: text parts joined, `developer`
 * as `system`, tool-call arguments as objects (templates write
 * `arguments | tojson`), tool results carrying `tool_call_id` and `name`.
 *
 * Also the polyfills for templates that lack a feature: tool calls and
 * results written as Hermes `<tool_call>` / `<tool_response>` text, tool
 * definitions in the system message, system text folded into the first
 * user turn, and Mistral's 9-character tool call ids.
 */

/** One function call of an assistant turn, as templates read it. */
export interface TemplateToolCall {
  id?: string;
  type: "function";
  function: { name: string; arguments: unknown };
}

/** One message as templates read it. */
export interface TemplateMessage {
  role: string;
  content: string;
  name?: string;
  tool_calls?: TemplateToolCall[];
  tool_call_id?: string;
  reasoning_content?: string;
}

/** Thrown for a message no template could render. */
export class MessageError extends Error {}

function record(v: unknown): Record<string, unknown> | null {
  return typeof v === "object" && v !== null && !Array.isArray(v)
    ? v as Record<string, unknown>
    : null;
}

/** `content` as text: text parts joined with newlines, null as "". */
function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (content === null || content === undefined) return "";
  if (Array.isArray(content)) {
    const parts: string[] = [];
    for (const p of content) {
      if (typeof p === "string") parts.push(p);
      else if (record(p)?.type === "text") parts.push(String(record(p)!.text));
    }
    return parts.join("\n");
  }
  return pyJson(content);
}

/** A JSON string parsed when it holds an object or array; otherwise as is. */
function argumentsOf(v: unknown): unknown {
  if (typeof v !== "string") return v ?? {};
  try {
    const parsed = JSON.parse(v);
    return typeof parsed === "object" && parsed !== null ? parsed : v;
  } catch {
    return v;
  }
}

function toolCallsOf(v: unknown, i: number): TemplateToolCall[] {
  if (!Array.isArray(v)) return [];
  return v.map((c, j) => {
    const f = record(record(c)?.function);
    if (!f || typeof f.name !== "string") {
      throw new MessageError(
        `messages[${i}].tool_calls[${j}] needs a function with a string name`,
      );
    }
    const id = record(c)!.id;
    return {
      ...(typeof id === "string" ? { id } : {}),
      type: "function" as const,
      function: { name: f.name, arguments: argumentsOf(f.arguments) },
    };
  });
}

/** Converts validated OpenAI messages to template messages. */
export function toTemplateMessages(messages: unknown[]): TemplateMessage[] {
  const out: TemplateMessage[] = [];
  const callNames = new Map<string, string>();
  messages.forEach((m, i) => {
    const msg = record(m);
    if (!msg || typeof msg.role !== "string") {
      throw new MessageError(`messages[${i}] needs a string role`);
    }
    const role = msg.role === "developer" ? "system" : msg.role;
    const t: TemplateMessage = { role, content: textOf(msg.content) };
    if (typeof msg.name === "string") t.name = msg.name;
    if (typeof msg.reasoning_content === "string") {
      t.reasoning_content = msg.reasoning_content;
    }
    if (role === "assistant") {
      const calls = toolCallsOf(msg.tool_calls, i);
      for (const c of calls) if (c.id) callNames.set(c.id, c.function.name);
      if (calls.length > 0) t.tool_calls = calls;
    } else if (role === "tool" && typeof msg.tool_call_id === "string") {
      t.tool_call_id = msg.tool_call_id;
      const name = callNames.get(msg.tool_call_id);
      if (t.name === undefined && name !== undefined) t.name = name;
    }
    out.push(t);
  });
  return out;
}

/** JSON with Python's `json.dumps` separators, as `tojson` writes it. */
export function pyJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(pyJson).join(", ")}]`;
  if (typeof v === "object" && v !== null) {
    const entries = Object.entries(v).filter(([, x]) => x !== undefined);
    return `{${
      entries.map(([k, x]) => `${JSON.stringify(k)}: ${pyJson(x)}`).join(", ")
    }}`;
  }
  return JSON.stringify(v) ?? "null";
}

/** Qwen 2.5's tool prompt: the Hermes format. */
export function hermesToolPrompt(tools: unknown[]): string {
  return "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
    tools.map(pyJson).join("\n") +
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" +
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>';
}

/**
 * For templates that do not handle tools: tool calls become Hermes text in
 * the assistant turn, each run of tool results one user turn, and the tool
 * definitions (when given) join the system message.
 */
export function polyfillTools(
  messages: TemplateMessage[],
  tools: unknown[] | null,
): TemplateMessage[] {
  const out: TemplateMessage[] = [];
  for (const m of messages) {
    if (m.role === "assistant" && m.tool_calls) {
      const calls = m.tool_calls.map((c) =>
        `<tool_call>\n${
          pyJson({ name: c.function.name, arguments: c.function.arguments })
        }\n</tool_call>`
      );
      const content = [m.content, ...calls].filter((s) => s !== "").join("\n");
      const { tool_calls: _, ...rest } = m;
      out.push({ ...rest, content });
    } else if (m.role === "tool") {
      const response = `<tool_response>\n${m.content}\n</tool_response>`;
      const last = out.at(-1);
      if (last?.role === "user" && last.content.endsWith("</tool_response>")) {
        last.content += "\n" + response;
      } else out.push({ role: "user", content: response });
    } else out.push({ ...m });
  }
  if (tools && tools.length > 0) {
    const prompt = hermesToolPrompt(tools);
    if (out[0]?.role === "system") {
      out[0].content = out[0].content === ""
        ? prompt
        : `${out[0].content}\n\n${prompt}`;
    } else out.unshift({ role: "system", content: prompt });
  }
  return out;
}

/** For templates without a system role: system text opens the first user turn. */
export function foldSystem(messages: TemplateMessage[]): TemplateMessage[] {
  const system = messages.filter((m) => m.role === "system");
  if (system.length === 0) return messages;
  const text = system.map((m) => m.content).join("\n\n");
  const rest = messages.filter((m) => m.role !== "system").map((m) => ({
    ...m,
  }));
  const user = rest.find((m) => m.role === "user");
  if (user) user.content = `${text}\n\n${user.content}`;
  else rest.unshift({ role: "user", content: text });
  return rest;
}

const ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/** A stable 9-character alphanumeric stand-in for an id (FNV-1a based). */
function shortId(id: string): string {
  if (/^[A-Za-z0-9]{9}$/.test(id)) return id;
  let h = 0xcbf29ce484222325n;
  for (const b of new TextEncoder().encode(id)) {
    h = ((h ^ BigInt(b)) * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  let out = "";
  for (let i = 0; i < 9; i++) {
    out += ALNUM[Number(h % 62n)];
    h /= 62n;
  }
  return out;
}

/** For templates that insist on 9-character ids (Mistral v0.3, Nemo). */
export function shortenToolCallIds(
  messages: TemplateMessage[],
): TemplateMessage[] {
  return messages.map((m) => ({
    ...m,
    ...(m.tool_calls
      ? {
        tool_calls: m.tool_calls.map((c) =>
          c.id === undefined ? c : { ...c, id: shortId(c.id) }
        ),
      }
      : {}),
    ...(m.tool_call_id !== undefined
      ? { tool_call_id: shortId(m.tool_call_id) }
      : {}),
  }));
}
