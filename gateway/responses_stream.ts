/**
 * A node's chat stream rendered as the Responses API's events, in OpenAI's
 * order, each with its `sequence_number`: `response.created`,
 * `response.in_progress`; for each output item `response.output_item.added`,
 * then for a message `response.content_part.added`,
 * `response.output_text.delta`…, `response.output_text.done`,
 * `response.content_part.done` (for reasoning text the same with
 * `response.reasoning_text.*`, or, when a summary was asked,
 * `response.reasoning_summary_part.added`,
 * `response.reasoning_summary_text.delta`…, `…summary_text.done`,
 * `…summary_part.done`), for a function call
 * `response.function_call_arguments.delta`…, `…arguments.done`; then
 * `response.output_item.done` (a reasoning item's carries its
 * `encrypted_content` when included: sealed with jose once its text is
 * final, the relay awaiting the seal before the next events are made). The stream ends with `response.completed`
 * (or `response.incomplete` when cut at `max_output_tokens`) holding the
 * whole response and its billed usage, or, when it breaks,
 * `response.failed` and an `error` event. The response is stored (when
 * asked) before its last event goes out, so a client that reads it can
 * name it as `previous_response_id` at once.
 */
import type { OpenAIError } from "../protocol/openai/errors.ts";
import { sseComment, sseFrame } from "../lib/sse.ts";
import type { Exchange } from "./core.ts";
import { type ChunkNormaliser, malformed } from "./normalise.ts";
import {
  callItem,
  endingOf,
  itemId,
  logprobsOf,
  reasoningItem,
  responseObject,
  type ResponseShell,
  responseUsage,
  sealReasoningItem,
  textPart,
} from "./responses_output.ts";
import type { Item } from "./responses_request.ts";
import { restoreName } from "./responses_tools.ts";
import type { StreamSink } from "./stream.ts";

const PING = sseComment("ping");

type Kind = "message" | "reasoning" | "function_call";

/** Renders a chat stream as Responses events (see the module comment). */
export class ResponsesSink implements StreamSink {
  sawText = false;
  #seq = 0;
  #started = false;
  readonly #output: Item[] = [];
  /** The output index of the item still receiving deltas (-1: none). */
  #open = -1;
  /** Output index of each tool call, by its chat index. */
  readonly #calls = new Map<number, number>();
  #finish: unknown = null;
  #reasoningTokens = 0;
  /** The closing events and final response, once made (`#settle`). */
  #tail: string | null = null;
  #final: Record<string, unknown> | null = null;

  /**
   * @param save stores the final response (null when the request said
   * `store: false`); a failure is logged and the response says `store: false`.
   */
  constructor(
    readonly norm: ChunkNormaliser,
    readonly ex: Exchange,
    readonly shell: ResponseShell,
    readonly save:
      | ((response: Record<string, unknown>) => Promise<void>)
      | null,
  ) {}

  get reported() {
    return this.norm.reported;
  }
  get counted() {
    return this.norm.counted;
  }
  get chunks() {
    return this.norm.chunks;
  }

  #ev(type: string, fields: Record<string, unknown>): string {
    return sseFrame(
      { type, ...fields, sequence_number: this.#seq++ },
      type,
    );
  }

  #start(): string {
    if (this.#started) return "";
    this.#started = true;
    const response = responseObject(this.shell, {
      status: "in_progress",
      output: [],
      usage: null,
    });
    return this.#ev("response.created", { response }) +
      this.#ev("response.in_progress", { response });
  }

  #kind(): Kind | null {
    return this.#open < 0 ? null : this.#output[this.#open]!.type as Kind;
  }

  #add(item: Item): string {
    let s = this.#close("completed");
    this.#open = this.#output.length;
    this.#output.push(item);
    s += this.#ev("response.output_item.added", {
      output_index: this.#open,
      item,
    });
    if (item.type === "function_call") return s;
    if (this.#summarised(item)) {
      const part = { type: "summary_text", text: "" };
      s += this.#ev("response.reasoning_summary_part.added", {
        item_id: item.id,
        output_index: this.#open,
        summary_index: 0,
        part: { ...part },
      });
      (item.summary as Item[]).push(part);
      return s;
    }
    const part = item.type === "message"
      ? textPart("", [])
      : { type: "reasoning_text", text: "" };
    s += this.#ev("response.content_part.added", {
      item_id: item.id,
      output_index: this.#open,
      content_index: 0,
      part,
    });
    (item.content as Item[]).push(part); // the event went out as text already
    return s;
  }

  /** Whether a reasoning item goes out as a summary part. */
  #summarised(item: Item): boolean {
    return item.type === "reasoning" && this.shell.summary === true;
  }

  #message(): string {
    return this.#add({
      id: itemId("msg_"),
      type: "message",
      status: "in_progress",
      content: [],
      role: "assistant",
    });
  }

  /** Ends the open item with `status`. */
  #close(status: string): string {
    if (this.#open < 0) return "";
    const index = this.#open;
    this.#open = -1;
    const item = this.#output[index]!;
    let s = "";
    if (item.type === "function_call") {
      s += this.#ev("response.function_call_arguments.done", {
        item_id: item.id,
        output_index: index,
        arguments: item.arguments,
      });
    } else if (this.#summarised(item)) {
      const part = (item.summary as Item[])[0]!;
      const at = { item_id: item.id, output_index: index, summary_index: 0 };
      s += this.#ev("response.reasoning_summary_text.done", {
        ...at,
        text: part.text,
      });
      s += this.#ev("response.reasoning_summary_part.done", { ...at, part });
    } else {
      const part = (item.content as Item[])[0]!;
      const done = item.type === "message"
        ? "response.output_text.done"
        : "response.reasoning_text.done";
      s += this.#ev(done, {
        item_id: item.id,
        output_index: index,
        content_index: 0,
        text: part.text,
        ...(item.type === "message" ? { logprobs: part.logprobs } : {}),
      });
      s += this.#ev("response.content_part.done", {
        item_id: item.id,
        output_index: index,
        content_index: 0,
        part,
      });
    }
    item.status = status;
    return s + this.#ev("response.output_item.done", {
      output_index: index,
      item,
    });
  }

  #text(delta: string, logprobs: unknown[]): string {
    const s = this.#kind() === "message" ? "" : this.#message();
    const item = this.#output[this.#open]!;
    const part = (item.content as Item[])[0]!;
    part.text += delta;
    (part.logprobs as unknown[]).push(...logprobs);
    return s + this.#ev("response.output_text.delta", {
      item_id: item.id,
      output_index: this.#open,
      content_index: 0,
      delta,
      logprobs,
    });
  }

  #reasoning(delta: string): string {
    const summary = this.shell.summary === true;
    const s = this.#kind() === "reasoning" ? "" : this.#add({
      ...reasoningItem({ summary }, itemId("rs_"), "in_progress", ""),
      summary: [],
      ...(summary ? {} : { content: [] }),
    });
    const item = this.#output[this.#open]!;
    if (summary) {
      (item.summary as Item[])[0]!.text += delta;
      return s + this.#ev("response.reasoning_summary_text.delta", {
        item_id: item.id,
        output_index: this.#open,
        summary_index: 0,
        delta,
      });
    }
    (item.content as Item[])[0]!.text += delta;
    return s + this.#ev("response.reasoning_text.delta", {
      item_id: item.id,
      output_index: this.#open,
      content_index: 0,
      delta,
    });
  }

  #toolCall(tc: Record<string, unknown>): string {
    const fn = tc.function as Record<string, unknown>;
    const idx = tc.index as number;
    let s = "";
    let at = this.#calls.get(idx);
    if (at === undefined) {
      s += this.#add(
        callItem(
          itemId("fc_"),
          "in_progress",
          String(tc.id),
          typeof fn.name === "string" ? fn.name : "",
          "",
          this.shell.names,
        ),
      );
      at = this.#open;
      this.#calls.set(idx, at);
    } else if (at !== this.#open) {
      // calls come one after another; one resumed after the next began cannot be told
      throw malformed("tool call (deltas of calls interleaved)");
    } else if (typeof fn.name === "string" && fn.name) {
      // a name that came late
      Object.assign(
        this.#output[at]!,
        restoreName(this.shell.names ?? new Map(), fn.name),
      );
    }
    const args = fn.arguments;
    if (typeof args !== "string" || args.length === 0) return s;
    const item = this.#output[at]!;
    item.arguments += args;
    return s + this.#ev("response.function_call_arguments.delta", {
      item_id: item.id,
      output_index: at,
      delta: args,
    });
  }

  data(payload: string): string | null | Promise<string | null> {
    const before = this.norm.chunks;
    if (payload.includes('"reasoning_tokens"')) this.#readReasoning(payload);
    this.norm.push(payload);
    this.sawText = this.norm.chunks > before;
    const o = this.norm.last;
    this.norm.last = null;
    let s = this.#start();
    const choice = o && Array.isArray(o.choices)
      ? o.choices[0] as Record<string, unknown> | undefined
      : undefined;
    if (!choice) return s || null;
    const d = (choice.delta ?? {}) as Record<string, unknown>;
    if (typeof d.reasoning_content === "string" && d.reasoning_content) {
      s += this.#reasoning(d.reasoning_content);
    }
    const next = (typeof d.content === "string" && d.content.length > 0) ||
      (Array.isArray(d.tool_calls) && d.tool_calls.length > 0);
    if (next && this.#sealPending()) {
      // the reasoning item ends here: seal it before its done event is made
      return this.#sealOpen().then(() => this.#deltas(s, choice, d) || null);
    }
    return this.#deltas(s, choice, d) || null;
  }

  /** Whether the open item is reasoning still to seal. */
  #sealPending(): boolean {
    return this.#kind() === "reasoning" && !!this.shell.seal &&
      this.#output[this.#open]!.encrypted_content === undefined;
  }

  /** Seals the open reasoning item (its text is final: the next item begins). */
  #sealOpen(): Promise<void> {
    return sealReasoningItem(this.shell, this.#output[this.#open]!);
  }

  /** The events for one chunk's text and tool-call deltas, after `s`. */
  #deltas(
    s: string,
    choice: Record<string, unknown>,
    d: Record<string, unknown>,
  ): string {
    if (typeof d.content === "string" && d.content.length > 0) {
      s += this.#text(d.content, logprobsOf(choice));
    }
    if (Array.isArray(d.tool_calls)) {
      for (const tc of d.tool_calls as Record<string, unknown>[]) {
        s += this.#toolCall(tc);
      }
    }
    if (typeof choice.finish_reason === "string") {
      this.#finish = choice.finish_reason;
    }
    return s;
  }

  /** Reasoning tokens from a usage chunk's `completion_tokens_details`. */
  #readReasoning(payload: string): void {
    try {
      const n = JSON.parse(payload)?.usage?.completion_tokens_details
        ?.reasoning_tokens;
      if (Number.isSafeInteger(n) && n >= 0) this.#reasoningTokens = n;
    } catch { /* the normaliser refuses the frame */ }
  }

  /** Closes the items and makes the final response (once; usage is billed by now). */
  #settle(): Record<string, unknown> {
    if (this.#final) return this.#final;
    const ending = endingOf(this.#finish);
    let s = this.#start();
    if (this.#output.length === 0) s += this.#message();
    s += this.#close(ending.status);
    this.#tail = s;
    this.#final = responseObject(this.shell, {
      status: ending.status,
      output: this.#output,
      usage: responseUsage(this.ex, this.#reasoningTokens),
      reason: ending.reason,
    });
    return this.#final;
  }

  /** Stores the final response before its last event goes out. */
  async complete(): Promise<void> {
    if (this.#sealPending()) await this.#sealOpen();
    const final = this.#settle();
    if (!this.save) return;
    try {
      await this.save(final);
    } catch (e) {
      final.store = false;
      this.ex.core.log.error("a response was not stored", {
        requestId: this.ex.requestId,
        error: String(e),
      });
    }
  }

  end(): string {
    const final = this.#settle();
    const type = final.status === "completed"
      ? "response.completed"
      : "response.incomplete";
    return this.#tail + this.#ev(type, { response: final });
  }

  error(e: OpenAIError): string {
    let s = this.#start();
    if (this.#open >= 0) this.#output[this.#open]!.status = "incomplete";
    const response = responseObject(this.shell, {
      status: "failed",
      output: this.#output,
      usage: responseUsage(this.ex, this.#reasoningTokens),
      error: {
        code: e.status === 429 ? "rate_limit_exceeded" : "server_error",
        message: e.message,
      },
    });
    s += this.#ev("response.failed", { response });
    return s + this.#ev("error", {
      code: e.code,
      message: e.message,
      param: e.param,
    });
  }

  ping(): string {
    return this.#started ? PING : this.#start();
  }
}
