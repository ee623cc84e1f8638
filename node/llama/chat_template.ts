/**
 * A GGUF's `tokenizer.chat_template` (Jinja) rendered with
 * `@huggingface/jinja`, the way transformers and llama.cpp's server render
 * it: `messages`, `tools`, `add_generation_prompt`, `bos_token`,
 * `eos_token`, plus `raise_exception`, `strftime_now` and `tojson`.
 *
 * What a template cannot do itself is polyfilled (node/llama/chat_messages.ts):
 * a template that never reads `tools` gets the definitions in its system
 * message in the Hermes format, and tool calls and results as Hermes text;
 * one without a system role gets the system text in the first user turn.
 */
import { Environment, Interpreter, Template } from "@huggingface/jinja";
import {
  foldSystem,
  MessageError,
  polyfillTools,
  shortenToolCallIds,
  type TemplateMessage,
  toTemplateMessages,
} from "./chat_messages.ts";
import type { ReasoningFacts } from "../../protocol/engine.ts";
import { reasoningFacts } from "./reasoning.ts";

/** A template that cannot be compiled or rendered; the message says why. */
export class TemplateError extends Error {
  /** True when the template refused the conversation itself (`raise_exception`), not a failure of the template. */
  readonly raised: boolean;
  constructor(
    message: string,
    opts: { cause?: unknown; raised?: boolean } = {},
  ) {
    super(message, { cause: opts.cause });
    this.raised = opts.raised ?? false;
  }
}

/** What a template's `raise_exception(...)` throws: its own text. */
class Raised extends Error {}

/** Options of {@linkcode ChatTemplate.render}. */
export interface RenderOptions {
  /** OpenAI tool definitions; null or empty for none. */
  tools?: unknown[] | null;
  /** Ends the prompt with the assistant turn's opening (default true). */
  addGenerationPrompt?: boolean;
  /** More template variables, e.g. `enable_thinking`. */
  extra?: Record<string, unknown>;
}

const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday"]
  .concat(["Friday", "Saturday"]);
const MONTHS = ["January", "February", "March", "April", "May", "June", "July"]
  .concat(["August", "September", "October", "November", "December"]);

/** Python's `strftime` in the C locale, for the local time now. */
export function strftimeNow(format: string, now = new Date()): string {
  const pad = (n: number, w = 2) => String(n).padStart(w, "0");
  const h12 = now.getHours() % 12 || 12;
  const y = now.getFullYear();
  const day =
    (Date.UTC(y, now.getMonth(), now.getDate()) - Date.UTC(y, 0, 1)) / 864e5 +
    1;
  const codes: Record<string, () => string> = {
    a: () => DAYS[now.getDay()]!.slice(0, 3),
    A: () => DAYS[now.getDay()]!,
    b: () => MONTHS[now.getMonth()]!.slice(0, 3),
    B: () => MONTHS[now.getMonth()]!,
    d: () => pad(now.getDate()),
    e: () => String(now.getDate()).padStart(2, " "),
    H: () => pad(now.getHours()),
    I: () => pad(h12),
    j: () => pad(day, 3),
    m: () => pad(now.getMonth() + 1),
    M: () => pad(now.getMinutes()),
    p: () => now.getHours() < 12 ? "AM" : "PM",
    S: () => pad(now.getSeconds()),
    y: () => pad(y % 100),
    Y: () => String(y),
    "%": () => "%",
  };
  return format.replace(/%(.)/g, (all, c: string) => codes[c]?.() ?? all);
}

/** Python's `range`. */
function range(start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) [start, stop] = [0, start];
  if (step === 0) throw new Raised("range() arg 3 must not be zero");
  if ((stop - start) / step > 1e6) throw new Raised("range() is too long");
  const out: number[] = [];
  for (let i = start; step > 0 ? i < stop : i > stop; i += step) out.push(i);
  return out;
}

/** Whether the parsed template reads the variable `name` anywhere. */
function readsVariable(node: unknown, name: string, seen = new Set()): boolean {
  if (typeof node !== "object" || node === null || seen.has(node)) {
    return false;
  }
  seen.add(node);
  const n = node as Record<string, unknown>;
  if (n.type === "Identifier" && n.value === name) return true;
  return Object.values(n).some((v) => readsVariable(v, name, seen));
}

const PROBE = "\u0002orchard-system-probe\u0003";

/** A compiled template (compile once per model, render per request). */
export class ChatTemplate {
  /** Whether the template references `tools` (so it presents tool definitions itself). */
  readonly supportsTools: boolean;
  /** Whether the template renders a system message (else it is folded into the first user turn). */
  readonly supportsSystemRole: boolean;
  /** Its reasoning switch and whether its model thinks in `<think>…</think>` (node/llama/reasoning.ts). */
  readonly reasoning: ReasoningFacts;
  readonly #template: Template;
  readonly #special: { bosToken: string; eosToken: string };
  readonly #shortIds: boolean;

  constructor(source: string, special: { bosToken: string; eosToken: string }) {
    try {
      this.#template = new Template(source);
    } catch (cause) {
      throw new TemplateError(
        `Cannot parse chat template: ${(cause as Error).message}`,
        { cause },
      );
    }
    this.#special = special;
    this.supportsTools = readsVariable(this.#template.parsed, "tools");
    this.reasoning = reasoningFacts(
      source,
      (name) => readsVariable(this.#template.parsed, name),
    );
    // Mistral v0.3 and Nemo raise unless `tool_call_id|length == 9`.
    this.#shortIds = /length\s*[!=]=\s*9\b/.test(source);
    const user = { role: "user", content: "hi" };
    const withSystem = this.#probe([{ role: "system", content: PROBE }, user]);
    // A template that fails either way fails for another reason.
    this.supportsSystemRole = withSystem === null
      ? this.#probe([user]) === null
      : withSystem.includes(PROBE);
  }

  /**
   * Renders OpenAI-shaped chat messages (already validated JSON) and tools
   * to the prompt text. Throws TemplateError with a readable message (the
   * template's `raise_exception` text, or the engine's error) on failure.
   */
  render(messages: unknown[], opts: RenderOptions = {}): string {
    const tools = opts.tools && opts.tools.length > 0 ? opts.tools : null;
    let msgs: TemplateMessage[];
    try {
      msgs = toTemplateMessages(messages);
    } catch (err) {
      if (err instanceof MessageError) {
        throw new TemplateError(`Cannot render chat template: ${err.message}`, {
          raised: true,
        });
      }
      throw err;
    }
    if (!this.supportsTools) msgs = polyfillTools(msgs, tools);
    if (!this.supportsSystemRole) msgs = foldSystem(msgs);
    if (this.#shortIds) msgs = shortenToolCallIds(msgs);
    try {
      return this.#run(
        msgs,
        this.supportsTools ? tools : null,
        opts.addGenerationPrompt ?? true,
        opts.extra ?? {},
      );
    } catch (err) {
      if (err instanceof Raised) {
        throw new TemplateError(err.message, { raised: true });
      }
      throw new TemplateError(
        `Cannot render chat template: ${(err as Error).message}`,
        { cause: err },
      );
    }
  }

  /** The template's output for `messages`, or null where it throws. */
  #probe(messages: TemplateMessage[]): string | null {
    try {
      return this.#run(messages, null, true, {});
    } catch {
      return null;
    }
  }

  #run(
    messages: TemplateMessage[],
    tools: unknown[] | null,
    addGenerationPrompt: boolean,
    extra: Record<string, unknown>,
  ): string {
    const globals = new Environment();
    const builtins: Record<string, unknown> = {
      true: true,
      false: false,
      none: null,
      True: true,
      False: false,
      None: null,
      range,
      strftime_now: (format: string) => strftimeNow(String(format)),
      raise_exception: (message: unknown) => {
        throw new Raised(String(message));
      },
    };
    for (const [k, v] of Object.entries(builtins)) globals.set(k, v);
    const env = new Environment(globals);
    const vars: Record<string, unknown> = {
      ...extra,
      messages,
      tools,
      add_generation_prompt: addGenerationPrompt,
      bos_token: this.#special.bosToken,
      eos_token: this.#special.eosToken,
    };
    for (const [k, v] of Object.entries(vars)) env.set(k, v);
    const out = new Interpreter(env).run(this.#template.parsed);
    return String(out.value);
  }
}

const utf8 = (s: string) => new TextEncoder().encode(s).length;
/** A small tool, for measuring what the template writes around tool definitions. */
const PROBE_TOOL = {
  type: "function",
  function: {
    name: "f",
    description: "d",
    parameters: { type: "object", properties: { a: { type: "string" } } },
  },
};

/**
 * Measures what a template adds around the messages' text, in bytes (a
 * bound on tokens), with margins for what probes cannot see (tool-call
 * wrappers in the history, longer role names): the gateway bounds billed
 * prompt tokens with it.
 */
export function measureOverhead(
  t: ChatTemplate,
): { fixed: number; perMessage: number; tools: number } {
  const one = [{ role: "user", content: "x" }];
  const three = [...one, { role: "assistant", content: "y" }, {
    role: "user",
    content: "z",
  }];
  const b1 = utf8(t.render(one)) - 1;
  const b3 = utf8(t.render(three)) - 3;
  const perMessage = Math.max(0, Math.ceil((b3 - b1) / 2));
  const fixed = Math.max(0, b1 - perMessage);
  let tools = 0;
  try {
    tools = Math.max(
      0,
      utf8(t.render(one, { tools: [PROBE_TOOL] })) - (b1 + 1) -
        JSON.stringify(PROBE_TOOL).length,
    );
  } catch { /* a template that refuses tools: nothing to add */ }
  return { fixed: fixed + 64, perMessage: perMessage + 64, tools: tools + 64 };
}
