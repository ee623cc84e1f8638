/**
 * The streaming parser of node/llama/tool_calls.ts: a mode per position in
 * a family's call syntax, consuming input as far as it is certain. Content
 * goes out as soon as it cannot begin a call; a call's text is held until
 * its name is known and its arguments object has begun (then `call_start`,
 * and the arguments stream raw), or released as content when it turns out
 * not to be a call.
 */
import { CallObjectReader } from "./_call_object.ts";
import type { ToolFamily, ToolParseEvent } from "./tool_calls.ts";

type Mode =
  | "text" // content, watching for the opener (hermes, mistral)
  | "plain" // content, no more calls (llama3)
  | "start" // llama3: before the first non-space character
  | "l3_open" // llama3: before a call's "{" (after <|python_tag|> or ";")
  | "l3_next" // llama3: after a call: ";" or the end
  | "object" // inside a call object
  | "close" // hermes: before "</tool_call>"
  | "m_open" // mistral: after [TOOL_CALLS]: "[" or a name
  | "m_item" // mistral: before a listed call's "{"
  | "m_list" // mistral: after a listed call: "," or "]"
  | "m_name" // mistral: the name before [ARGS]
  | "m_marker" // mistral: [ARGS] or [CALL_ID]
  | "m_call_id"; // mistral: the id after [CALL_ID]

const OPENERS: Record<ToolFamily, string> = {
  hermes: "<tool_call>",
  llama3: "<|python_tag|>",
  mistral: "[TOOL_CALLS]",
};
const HERMES_CLOSE = "</tool_call>";
const SPACE = /\s/;
const ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/** `call_` and 24 random alphanumerics. */
function callId(): string {
  let id = "call_";
  while (id.length < 29) {
    for (const b of crypto.getRandomValues(new Uint8Array(32))) {
      if (b < 248 && id.length < 29) id += ALNUM[b % 62];
    }
  }
  return id;
}

/** Length of the longest end of `s` (from `from`) that begins `lit`. */
function partialTail(s: string, from: number, lit: string): number {
  for (let k = Math.min(lit.length - 1, s.length - from); k > 0; k--) {
    if (s.endsWith(lit.slice(0, k))) return k;
  }
  return 0;
}

/** Incremental parser of generated text into content and tool calls. */
export class ToolCallParser {
  readonly #family: ToolFamily;
  readonly #opener: string;
  #mode: Mode;
  #buf = "";
  #pos = 0;
  #final = false;
  #events: ToolParseEvent[] = [];
  /** Trailing whitespace of content, held until it is known not to precede a call. */
  #held = "";
  /** Text of the call being read, released as content if it is not a call. */
  #raw = "";
  /** Skip whitespace before the next content (a call just ended). */
  #trim = false;
  #reader: CallObjectReader | null = null;
  /** Index of the committed call being read, or -1. */
  #index = -1;
  #calls = 0;
  #inList = false;
  #name = "";

  /** `names` (known tool names) is accepted for the engine's use; calls to unknown names still parse. */
  constructor(family: ToolFamily, _opts: { names?: string[] } = {}) {
    this.#family = family;
    this.#opener = OPENERS[family];
    this.#mode = family === "llama3" ? "start" : "text";
  }

  /** Whether any call was parsed (finish_reason "tool_calls"). */
  get sawCall(): boolean {
    return this.#calls > 0;
  }

  /** Feeds generated text; returns what can be emitted now. Text that may be the start of a call is held back until it is clear. */
  push(text: string): ToolParseEvent[] {
    this.#buf += text;
    this.#run();
    return this.#take();
  }

  /**
   * End of generation: flushes held text. A call whose name and arguments
   * had begun is ended with `error: "truncated"` (its arguments are what
   * was generated); anything less is released as text.
   */
  end(): ToolParseEvent[] {
    this.#final = true;
    this.#run();
    const m = this.#mode;
    if (m === "text") this.#text(this.#held);
    else if (m === "object" && this.#index >= 0) this.#endCall("truncated");
    else if (!["plain", "close", "l3_next", "m_list"].includes(m)) {
      if (!this.sawCall || this.#raw.trim() !== "") this.#text(this.#raw);
    }
    this.#held = this.#raw = "";
    this.#mode = "plain";
    return this.#take();
  }

  #take(): ToolParseEvent[] {
    this.#flushArgs();
    const out = this.#events;
    this.#events = [];
    return out;
  }

  #run() {
    while (this.#pos < this.#buf.length && this.#step()) {
      // each step consumed input or changed mode
    }
    this.#buf = this.#buf.slice(this.#pos);
    this.#pos = 0;
  }

  #text(s: string) {
    if (s === "") return;
    this.#flushArgs();
    const last = this.#events.at(-1);
    if (last?.type === "text") last.text += s;
    else this.#events.push({ type: "text", text: s });
  }

  #flushArgs() {
    const delta = this.#index >= 0 ? this.#reader?.take() : "";
    if (!delta) return;
    const last = this.#events.at(-1);
    if (last?.type === "call_args") last.delta += delta;
    else this.#events.push({ type: "call_args", index: this.#index, delta });
  }

  /** Consumes whitespace; into the held call text when `keep`. */
  #space(keep: boolean) {
    const start = this.#pos;
    while (this.#pos < this.#buf.length && SPACE.test(this.#buf[this.#pos]!)) {
      this.#pos++;
    }
    if (keep) this.#raw += this.#buf.slice(start, this.#pos);
  }

  /** Matches a literal at the cursor: consumed, maybe (more input needed), or not. */
  #literal(lit: string): "yes" | "wait" | "no" {
    if (this.#buf.startsWith(lit, this.#pos)) {
      this.#pos += lit.length;
      this.#raw += lit;
      return "yes";
    }
    const rest = this.#buf.slice(this.#pos);
    return !this.#final && lit.startsWith(rest) ? "wait" : "no";
  }

  /** Not a call after all: its text is content. */
  #release() {
    this.#text(this.#raw);
    this.#raw = "";
    this.#reader = null;
    this.#trim = false;
    this.#mode = this.#family === "llama3" ? "plain" : "text";
  }

  #readObject(reader = new CallObjectReader()) {
    this.#reader = reader;
    this.#mode = "object";
  }

  #commit() {
    this.#index = this.#calls++;
    this.#raw = "";
    this.#events.push({
      type: "call_start",
      index: this.#index,
      id: callId(),
      name: this.#reader!.name!,
    });
  }

  #endCall(error?: "truncated" | "invalid_arguments") {
    this.#flushArgs();
    if (!error) {
      try {
        const args = JSON.parse(this.#reader!.argsText);
        if (typeof args !== "object" || args === null) throw args;
      } catch {
        error = "invalid_arguments";
      }
    }
    this.#events.push({
      type: "call_end",
      index: this.#index,
      ...(error ? { error } : {}),
    });
    this.#index = -1;
    this.#reader = null;
    this.#raw = "";
  }

  /** One step of the current mode; false when it needs more input. */
  #step(): boolean {
    const buf = this.#buf;
    switch (this.#mode) {
      case "text":
        return this.#stepText();
      case "plain":
        if (this.#trim) this.#space(false);
        this.#trim = this.#trim && this.#pos === buf.length;
        this.#text(buf.slice(this.#pos));
        this.#pos = buf.length;
        return false;
      case "start":
      case "l3_open": {
        this.#space(true);
        if (this.#pos === buf.length) return false;
        const tag = this.#literal(this.#opener);
        if (tag !== "no") return tag === "yes";
        if (buf[this.#pos] === "{") this.#readObject();
        else this.#release();
        return true;
      }
      case "object":
        return this.#stepObject();
      case "close": {
        this.#space(false);
        if (this.#pos === buf.length) return false;
        const rest = buf.slice(this.#pos);
        if (this.#final && HERMES_CLOSE.startsWith(rest)) {
          this.#pos = buf.length;
        } else if (this.#literal(HERMES_CLOSE) === "wait") return false;
        this.#raw = "";
        this.#mode = "text";
        this.#trim = true;
        return true;
      }
      case "l3_next":
        this.#space(false);
        if (this.#pos === buf.length) return false;
        if (buf[this.#pos] === ";") {
          this.#pos++;
          this.#mode = "l3_open";
        } else this.#mode = "plain";
        return true;
      case "m_open":
        this.#space(true);
        if (this.#pos === buf.length) return false;
        if (buf[this.#pos] === "[") {
          this.#raw += "[";
          this.#pos++;
          this.#inList = true;
          this.#mode = "m_item";
        } else {
          this.#name = "";
          this.#inList = false;
          this.#mode = "m_name";
        }
        return true;
      case "m_item":
        this.#space(true);
        if (this.#pos === buf.length) return false;
        if (buf[this.#pos] === "{") this.#readObject();
        else this.#release();
        return true;
      case "m_list":
        this.#space(false);
        if (this.#pos === buf.length) return false;
        if (buf[this.#pos] === ",") this.#mode = "m_item";
        else this.#mode = "text";
        if (buf[this.#pos] === "," || buf[this.#pos] === "]") this.#pos++;
        this.#trim = true;
        return true;
      case "m_name":
      case "m_call_id": {
        const c = buf[this.#pos]!;
        if (/[A-Za-z0-9_.\-]/.test(c) && this.#name.length < 256) {
          if (this.#mode === "m_name") this.#name += c;
          this.#raw += c;
          this.#pos++;
        } else if (c === "[" && this.#name !== "") this.#mode = "m_marker";
        else this.#release();
        return true;
      }
      case "m_marker": {
        const args = this.#literal("[ARGS]");
        if (args === "yes") {
          this.#readObject(
            new CallObjectReader({ argsOnly: true, name: this.#name }),
          );
          return true;
        }
        const id = this.#literal("[CALL_ID]");
        if (id === "yes") this.#mode = "m_call_id";
        else if (args === "no" && id === "no") this.#release();
        return id === "yes" || (args === "no" && id === "no");
      }
    }
  }

  #stepText(): boolean {
    const buf = this.#buf;
    if (this.#trim) {
      this.#space(false);
      if (this.#pos === buf.length) return false;
      this.#trim = false;
    }
    const at = buf.indexOf(this.#opener, this.#pos);
    if (at >= 0) {
      const seg = this.#held + buf.slice(this.#pos, at);
      const content = seg.trimEnd();
      this.#text(content);
      this.#held = "";
      this.#raw = seg.slice(content.length) + this.#opener;
      this.#pos = at + this.#opener.length;
      if (this.#family === "hermes") this.#readObject();
      else this.#mode = "m_open";
      return true;
    }
    const end = buf.length -
      (this.#final ? 0 : partialTail(buf, this.#pos, this.#opener));
    if (end === this.#pos) return false;
    const seg = this.#held + buf.slice(this.#pos, end);
    const content = this.#final ? seg : seg.trimEnd();
    this.#text(content);
    this.#held = seg.slice(content.length);
    this.#pos = end;
    return true;
  }

  #stepObject(): boolean {
    const reader = this.#reader!;
    const c = this.#buf[this.#pos]!;
    const r = reader.feed(c);
    if (r === "bad") {
      // The character is not consumed: it is content.
      if (this.#index >= 0) {
        this.#endCall("invalid_arguments");
        this.#mode = this.#family === "llama3" ? "plain" : "text";
      } else this.#release();
      return true;
    }
    this.#pos++;
    if (this.#index < 0) this.#raw += c;
    if (this.#index < 0 && reader.name !== null && reader.argsStarted) {
      this.#commit();
    }
    if (r === "more") return true;
    if (this.#index < 0) {
      // An object without arguments: a call only after an explicit opener.
      if (reader.name === null || this.#family === "llama3") {
        this.#release();
        return true;
      }
      this.#commit();
      reader.argsText = "{}";
      this.#events.push({ type: "call_args", index: this.#index, delta: "{}" });
    }
    this.#endCall();
    this.#mode = this.#family === "hermes"
      ? "close"
      : this.#family === "llama3"
      ? "l3_next"
      : this.#inList
      ? "m_list"
      : "text";
    this.#trim = this.#mode === "text";
    return true;
  }
}
