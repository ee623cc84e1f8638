/**
 * Response objects of the Responses API, made from what a node answered to
 * the translated chat request: a non-stream chat completion becomes
 * `output` items (a `reasoning` item for reasoning text, a `message` with
 * one `output_text` part, a `function_call` item a tool call), and the
 * response around them repeats the request (gateway/responses_request.ts)
 * with the billed usage, exactly in OpenAI's shape. Reasoning text is a
 * `reasoning_text` content part, or, when `reasoning.summary` was asked,
 * one `summary_text` part (the nearest local meaning of a summary: no model
 * here writes a separate one), with `encrypted_content` when included;
 * a namespaced function's call carries `namespace` and its bare `name`.
 */
import type { Exchange } from "./core.ts";
import type { Item, ResponseEcho } from "./responses_request.ts";
import { restoreName, type ToolNames } from "./responses_tools.ts";

const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);

/** A fresh id in OpenAI's style: a prefix (`resp_`, `msg_`, `fc_`, `rs_`) and 48 hex digits. */
export function itemId(prefix: string): string {
  const b = crypto.getRandomValues(new Uint8Array(24));
  let s = prefix;
  for (const x of b) s += x.toString(16).padStart(2, "0");
  return s;
}

/** What every state of one response shares: its id, time, model and echo. */
export interface ResponseShell {
  id: string;
  createdAt: number;
  model: string;
  echo: ResponseEcho;
  /** Flat names of namespaced functions (none when absent). */
  names?: ToolNames;
  /** Whether reasoning goes out as a summary part (else as reasoning_text content). */
  summary?: boolean;
  /** Seals reasoning text as `encrypted_content` (absent: not included). */
  seal?: ((text: string) => Promise<string>) | null;
}

/** A response's status and how it ended. */
export interface Ending {
  status: "completed" | "incomplete";
  reason: "max_output_tokens" | "content_filter" | null;
}

/** How a chat finish reason ends a response. */
export function endingOf(finish: unknown): Ending {
  if (finish === "length") {
    return { status: "incomplete", reason: "max_output_tokens" };
  }
  if (finish === "content_filter") {
    return { status: "incomplete", reason: "content_filter" };
  }
  return { status: "completed", reason: null };
}

/** The usage object of a response, from the exchange's billed figures. */
export function responseUsage(
  ex: Exchange,
  reasoningTokens: number,
): Record<string, unknown> {
  const input = ex.promptTokens;
  const output = ex.completionTokens;
  return {
    input_tokens: input,
    input_tokens_details: {
      cached_tokens: Math.min(ex.cachedTokens ?? 0, input),
    },
    output_tokens: output,
    output_tokens_details: {
      reasoning_tokens: Math.min(reasoningTokens, output),
    },
    total_tokens: input + output,
    ...(ex.usageBasis ? { orchard_usage: ex.usageBasis } : {}),
  };
}

/** A response object in one of its states. */
export function responseObject(
  shell: ResponseShell,
  state: {
    status: "in_progress" | "completed" | "incomplete" | "failed";
    output: Item[];
    usage: Record<string, unknown> | null;
    reason?: Ending["reason"];
    error?: { code: string; message: string } | null;
  },
): Record<string, unknown> {
  const e = shell.echo;
  return {
    id: shell.id,
    object: "response",
    created_at: shell.createdAt,
    status: state.status,
    background: false,
    completed_at: state.status === "completed"
      ? Math.floor(Date.now() / 1000)
      : null,
    error: state.error ?? null,
    incomplete_details: state.reason ? { reason: state.reason } : null,
    instructions: e.instructions,
    max_output_tokens: e.max_output_tokens,
    max_tool_calls: e.max_tool_calls,
    model: shell.model,
    output: state.output,
    parallel_tool_calls: e.parallel_tool_calls,
    previous_response_id: e.previous_response_id,
    prompt_cache_key: e.prompt_cache_key,
    reasoning: e.reasoning,
    safety_identifier: e.safety_identifier,
    service_tier: "default",
    store: e.store,
    temperature: e.temperature,
    text: e.text,
    tool_choice: e.tool_choice,
    tools: e.tools,
    top_logprobs: e.top_logprobs,
    top_p: e.top_p,
    truncation: "disabled",
    usage: state.usage,
    user: e.user,
    metadata: e.metadata,
  };
}

/** One token's logprob in the Responses shape (from chat's). */
function logprob(t: unknown): Record<string, unknown> | null {
  if (!isObj(t) || typeof t.token !== "string") return null;
  const one = (x: Record<string, unknown>) => ({
    token: x.token,
    logprob: typeof x.logprob === "number" ? x.logprob : 0,
    bytes: Array.isArray(x.bytes) ? x.bytes : [],
  });
  return {
    ...one(t),
    top_logprobs: Array.isArray(t.top_logprobs)
      ? t.top_logprobs.filter(isObj).map(one)
      : [],
  };
}

/** A chat choice's `logprobs.content`, in the Responses shape. */
export function logprobsOf(choice: Record<string, unknown>): unknown[] {
  const lp = choice.logprobs;
  if (!isObj(lp) || !Array.isArray(lp.content)) return [];
  const out: unknown[] = [];
  for (const t of lp.content) {
    const x = logprob(t);
    if (x) out.push(x);
  }
  return out;
}

/** A `message` item with one `output_text` part. */
export function messageItem(
  id: string,
  status: string,
  text: string,
  logprobs: unknown[],
): Item {
  return {
    id,
    type: "message",
    status,
    content: [textPart(text, logprobs)],
    role: "assistant",
  };
}

/** An `output_text` part. */
export function textPart(text: string, logprobs: unknown[]): Item {
  return { type: "output_text", annotations: [], logprobs, text };
}

/**
 * A `reasoning` item holding reasoning text: as a `summary_text` part when
 * the shell asks for summaries, else as `reasoning_text` content (sealed
 * into `encrypted_content` by `sealReasoningItem` when the shell seals).
 */
export function reasoningItem(
  shell: Pick<ResponseShell, "summary">,
  id: string,
  status: string,
  text: string,
): Item {
  return {
    id,
    type: "reasoning",
    summary: shell.summary ? [{ type: "summary_text", text }] : [],
    ...(shell.summary ? {} : { content: [{ type: "reasoning_text", text }] }),
    status,
  };
}

/** The text a reasoning item holds (its summary part or its reasoning_text). */
function reasoningText(item: Item): string {
  const parts =
    ((item.summary as Item[] | undefined)?.length
      ? item.summary
      : item.content) as Item[] | undefined;
  return String(parts?.[0]?.text ?? "");
}

/** Seals a reasoning item's text into its `encrypted_content`, when the shell seals. */
export async function sealReasoningItem(
  shell: Pick<ResponseShell, "seal">,
  item: Item,
): Promise<void> {
  if (shell.seal && item.type === "reasoning") {
    item.encrypted_content = await shell.seal(reasoningText(item));
  }
}

/** A `function_call` item (a namespaced function's with `namespace` and its bare name). */
export function callItem(
  id: string,
  status: string,
  callId: string,
  name: string,
  args: string,
  names: ToolNames = new Map(),
): Item {
  return {
    id,
    type: "function_call",
    status,
    arguments: args,
    call_id: callId,
    ...restoreName(names, name),
  };
}

/**
 * The output items and ending of a normalised, non-stream chat completion
 * (gateway/normalise.ts): reasoning, text and tool calls in that order;
 * an empty message when there is none of them.
 */
export async function outputOf(
  completion: Record<string, unknown>,
  shell: Pick<ResponseShell, "names" | "summary" | "seal"> = {},
): Promise<{ output: Item[]; ending: Ending }> {
  const choice = ((completion.choices as unknown[])[0] ?? {}) as Record<
    string,
    unknown
  >;
  const msg = (choice.message ?? {}) as Record<string, unknown>;
  const ending = endingOf(choice.finish_reason);
  const calls = Array.isArray(msg.tool_calls)
    ? msg.tool_calls as Record<string, unknown>[]
    : [];
  const output: Item[] = [];
  if (typeof msg.reasoning_content === "string" && msg.reasoning_content) {
    const item = reasoningItem(
      shell,
      itemId("rs_"),
      "completed",
      msg.reasoning_content,
    );
    await sealReasoningItem(shell, item);
    output.push(item);
  }
  if (typeof msg.content === "string" && msg.content) {
    output.push(
      messageItem(itemId("msg_"), "completed", msg.content, logprobsOf(choice)),
    );
  }
  for (const tc of calls) {
    const fn = tc.function as Record<string, unknown>;
    output.push(
      callItem(
        itemId("fc_"),
        "completed",
        String(tc.id),
        String(fn.name),
        String(fn.arguments),
        shell.names,
      ),
    );
  }
  if (output.length === 0) {
    output.push(messageItem(itemId("msg_"), "completed", "", []));
  }
  // what was cut is the last item
  output[output.length - 1]!.status = ending.status;
  return { output, ending };
}
