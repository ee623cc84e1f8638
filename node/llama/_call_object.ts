/**
 * Reads one generated tool call object, `{"name": "f", "arguments": {…}}`,
 * a character at a time: the name once its string closes, and the raw text
 * of the arguments object as it is generated (string and escape state and
 * bracket nesting decide where it ends). Other keys are skipped. Used by
 * node/llama/tool_calls.ts.
 */

/** What a character did: more needed, the object closed, or not a call object (the character is not consumed). */
export type Feed = "more" | "done" | "bad";

type State =
  | "start" // before "{"
  | "key_or_end" // after "{"
  | "key" // after ","
  | "key_str"
  | "colon"
  | "value"
  | "name_str"
  | "args" // inside the arguments object: streamed
  | "args_str" // arguments written as a JSON string holding the object
  | "skip" // inside another key's object or array
  | "skip_str"
  | "skip_scalar"
  | "after_value"
  | "done";

const ARGS_KEYS = ["arguments", "parameters"];
const WS = /\s/;
/** Longest key or name string: a runaway string is not a call. */
const MAX_NAME = 4096;

function decode(raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch {
    return undefined;
  }
}

export class CallObjectReader {
  /** The function name, once its string closed. */
  name: string | null = null;
  /** Whether the arguments began (an object's "{", or a whole string). */
  argsStarted = false;
  /** The arguments text so far. */
  argsText = "";
  #out = "";
  #state: State = "start";
  #argsOnly: boolean;
  #key = "";
  #str = "";
  #esc = false;
  #inStr = false;
  #stack: string[] = [];

  /** `argsOnly`: the input is just the arguments object, for `name`. */
  constructor(opts: { argsOnly?: boolean; name?: string } = {}) {
    this.#argsOnly = opts.argsOnly ?? false;
    if (this.#argsOnly) {
      this.name = opts.name ?? "";
      this.#key = ARGS_KEYS[0]!;
      this.#state = "value";
    }
  }

  /** Arguments text generated since the last call. */
  take(): string {
    const out = this.#out;
    this.#out = "";
    return out;
  }

  /** Feeds one character (a UTF-16 code unit). */
  feed(c: string): Feed {
    switch (this.#state) {
      case "start":
        if (WS.test(c)) return "more";
        return c === "{" ? this.#to("key_or_end") : "bad";
      case "key_or_end":
      case "key":
        if (WS.test(c)) return "more";
        if (c === '"') return this.#string("key_str");
        return c === "}" && this.#state === "key_or_end"
          ? this.#to("done")
          : "bad";
      case "key_str": {
        const r = this.#readString(c);
        if (r !== "end") return r;
        const key = decode(this.#str);
        if (typeof key !== "string") return "bad";
        this.#key = key;
        return this.#to("colon");
      }
      case "colon":
        if (WS.test(c)) return "more";
        return c === ":" ? this.#to("value") : "bad";
      case "value":
        return this.#value(c);
      case "name_str": {
        const r = this.#readString(c);
        if (r !== "end") return r;
        const name = decode(this.#str);
        if (typeof name !== "string" || name === "") return "bad";
        this.name = name;
        return this.#to("after_value");
      }
      case "args": {
        const r = this.#nested(c);
        if (r === "bad") return "bad";
        this.argsText += c;
        this.#out += c;
        if (r === "more") return "more";
        return this.#to(this.#argsOnly ? "done" : "after_value");
      }
      case "args_str": {
        const r = this.#readString(c);
        if (r !== "end") return r;
        const text = decode(this.#str);
        const args = typeof text === "string" ? decode(text) : undefined;
        if (typeof args !== "object" || args === null || Array.isArray(args)) {
          return "bad";
        }
        this.argsStarted = true;
        this.argsText = this.#out = text as string;
        return this.#to(this.#argsOnly ? "done" : "after_value");
      }
      case "skip": {
        const r = this.#nested(c);
        return r === "closed" ? this.#to("after_value") : r;
      }
      case "skip_str": {
        const r = this.#readString(c);
        return r === "end" ? this.#to("after_value") : r;
      }
      case "skip_scalar":
        if (/[-+.0-9A-Za-z]/.test(c)) return "more";
        this.#state = "after_value";
        return this.feed(c);
      case "after_value":
        if (WS.test(c)) return "more";
        if (c === ",") return this.#to("key");
        return c === "}" ? this.#to("done") : "bad";
      case "done":
        return "bad";
    }
  }

  #to(state: State): Feed {
    this.#state = state;
    return state === "done" ? "done" : "more";
  }

  #string(state: State): Feed {
    this.#str = '"';
    this.#esc = false;
    return this.#to(state);
  }

  #value(c: string): Feed {
    if (WS.test(c)) return "more";
    const key = this.#key;
    if (key === "name" && this.name === null) {
      return c === '"' ? this.#string("name_str") : "bad";
    }
    if (ARGS_KEYS.includes(key) && !this.argsStarted) {
      if (c === '"') return this.#string("args_str");
      if (c !== "{") return "bad";
      this.argsStarted = true;
      this.#stack = ["{"];
      this.#inStr = false;
      this.argsText += c;
      this.#out += c;
      return this.#to("args");
    }
    if (key === "name" || ARGS_KEYS.includes(key)) return "bad"; // twice
    if (c === '"') return this.#string("skip_str");
    if (c === "{" || c === "[") {
      this.#stack = [c];
      this.#inStr = false;
      return this.#to("skip");
    }
    return /[-0-9tfn]/.test(c) ? this.#to("skip_scalar") : "bad";
  }

  /** A JSON string's next character: "end" after its closing quote. */
  #readString(c: string): Feed | "end" {
    if (c < " ") return "bad";
    if (this.#state !== "args_str" && this.#state !== "skip_str") {
      if (this.#str.length > MAX_NAME) return "bad";
    }
    this.#str += c;
    if (this.#esc) this.#esc = false;
    else if (c === "\\") this.#esc = true;
    else if (c === '"') return "end";
    return "more";
  }

  /** The next character of a nested value: "closed" after its last bracket. */
  #nested(c: string): "more" | "closed" | "bad" {
    if (this.#inStr) {
      if (c < " ") return "bad";
      if (this.#esc) this.#esc = false;
      else if (c === "\\") this.#esc = true;
      else if (c === '"') this.#inStr = false;
      return "more";
    }
    if (c === '"') {
      this.#inStr = true;
      this.#esc = false;
    } else if (c === "{" || c === "[") this.#stack.push(c);
    else if (c === "}" || c === "]") {
      if (this.#stack.pop() !== (c === "}" ? "{" : "[")) return "bad";
      if (this.#stack.length === 0) return "closed";
    }
    return "more";
  }
}
