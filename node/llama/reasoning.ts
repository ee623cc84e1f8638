/**
 * Reasoning on the llama engine, from the model's chat template:
 *
 * - the control: a template that reads `enable_thinking` (Qwen3, its
 *   hybrid fine-tunes) switches thinking on and off; one that reads
 *   `reasoning_effort` (gpt-oss's Harmony template) takes the effort as
 *   is. Chat `reasoning_effort` reaches the template through it; a model
 *   without either refuses the field (400 naming it).
 * - the output: a template that writes `</think>` (Qwen3, QwQ, DeepSeek
 *   R1) belongs to a model that reasons in `<think>…</think>` before its
 *   answer. `ThinkSplitter` sends that text to `reasoning_content`, as
 *   vLLM and llama-server do, and the rest on as content (where tool calls
 *   are parsed). Where the rendered prompt already opened `<think>` (R1's
 *   and Qwen3-Thinking's generation prompt), the output starts inside it.
 *   gpt-oss's Harmony channels are split the same way (node/llama/harmony.ts).
 */

import type {
  ReasoningControl,
  ReasoningFacts,
} from "../../protocol/engine.ts";
import { HarmonySplitter, isHarmony } from "./harmony.ts";
import type { GrammarSpec } from "./protocol.ts";

/** Chat `reasoning_effort` values (OpenAI's, with `none` and `xhigh`). */
export const EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh"];

/** Reads a template's reasoning facts from its source and the variables it reads. */
export function reasoningFacts(
  source: string,
  reads: (name: string) => boolean,
): ReasoningFacts {
  const control: ReasoningControl | null = reads("enable_thinking")
    ? "enable_thinking"
    : reads("reasoning_effort")
    ? "reasoning_effort"
    : null;
  return { control, parses: source.includes("</think>") || isHarmony(source) };
}

/**
 * The template variables for an effort: `enable_thinking` is false for
 * `none` and `minimal` (the nearest a switch comes to them), true for the
 * rest; `reasoning_effort` is passed as is. No effort: no variable (the
 * template's default).
 */
export function reasoningVars(
  control: ReasoningControl | null,
  effort: string | null,
): Record<string, unknown> {
  if (effort === null || control === null) return {};
  if (control === "enable_thinking") {
    return { enable_thinking: effort !== "none" && effort !== "minimal" };
  }
  return { reasoning_effort: effort };
}

/** Whether a rendered prompt ends inside an opened `<think>` (the output starts as reasoning). */
export function opensThinking(prompt: string): boolean {
  const at = prompt.lastIndexOf("<think>");
  return at >= 0 && prompt.slice(at + 7).trim() === "";
}

/** What a lazy grammar's trigger must pass first when the prompt opened `<think>`: the thinking and its close. */
const THOUGHT = String.raw`[\s\S]*?</think>`;

/**
 * The same where the model may open `<think>` itself: a whole think block
 * at the start, or an output that does not start with one.
 */
const MAYBE_THOUGHT = String.raw`(?:\s*<think>[\s\S]*?</think>|(?!\s*<think>))`;

/**
 * A grammar that leaves the thinking free, for a model that thinks in
 * `<think>…</think>`: a lazy grammar's triggers (a call opener under
 * `tool_choice: auto`) count only after the thinking, so a call the model
 * muses about is not forced into a call there. Where the prompt opened
 * `<think>` (`opened`), a grammar over the whole output (a structured
 * answer, a required call) becomes lazy from `</think>` on, so it comes
 * after the reasoning instead of inside it; where it did not, such a
 * grammar stays as it is (it does not let the output open `<think>`: the
 * model answers without thinking).
 */
export function grammarAfterThinking(
  spec: GrammarSpec,
  opened: boolean,
): GrammarSpec {
  const before = opened ? THOUGHT : MAYBE_THOUGHT;
  if (spec.triggers?.length) {
    return {
      gbnf: spec.gbnf,
      triggers: spec.triggers.map((t) => before + t.replace(/^\^/, "")),
    };
  }
  if (!opened) return spec;
  return { gbnf: spec.gbnf, triggers: [String.raw`${THOUGHT}\s*([\s\S]*)`] };
}

const OPEN = "<think>";
const CLOSE = "</think>";

/** Length of the longest end of `s` that begins `lit`. */
function partialTail(s: string, lit: string): number {
  for (let k = Math.min(lit.length - 1, s.length); k > 0; k--) {
    if (s.endsWith(lit.slice(0, k))) return k;
  }
  return 0;
}

/** One step's worth of split output. */
export interface Split {
  reasoning: string;
  content: string;
}

/** Splits a model's output into reasoning and content as it streams. */
export interface ReasoningSplitter {
  /** Feeds generated text; returns what is certain now (text that may be a marker is held). */
  push(text: string): Split;
  /** End of generation: what was held, where it belongs. */
  end(): Split;
}

/**
 * The splitter for a model's output (null: it does not reason apart from
 * its answer): Harmony channels for gpt-oss, else `<think>…</think>` for a
 * template that writes `</think>`, opened already when `prompt` opened it.
 */
export function reasoningSplitter(
  source: string,
  prompt: string,
): ReasoningSplitter | null {
  if (isHarmony(source)) return new HarmonySplitter();
  return source.includes("</think>")
    ? new ThinkSplitter(opensThinking(prompt))
    : null;
}

/**
 * Splits generated text into reasoning (inside `<think>…</think>` at the
 * start of the output, or from the start when the prompt opened it) and
 * content (after it; whitespace right after `</think>` is dropped).
 * Text that may be the start of a tag is held until it is clear.
 */
export class ThinkSplitter implements ReasoningSplitter {
  #mode: "before" | "inside" | "after";
  #held = "";
  /** Whitespace right after `</think>` is not content. */
  #trim = false;

  constructor(opened: boolean) {
    this.#mode = opened ? "inside" : "before";
  }

  /** Feeds generated text. */
  push(text: string): Split {
    const out: Split = { reasoning: "", content: "" };
    let s = this.#held + text;
    this.#held = "";
    if (this.#mode === "before") {
      const lead = s.trimStart();
      if (lead.startsWith(OPEN)) {
        this.#mode = "inside";
        s = lead.slice(OPEN.length);
      } else if (OPEN.startsWith(lead)) {
        this.#held = s; // blank, or a piece of "<think>"
        return out;
      } else {
        this.#mode = "after";
      }
    }
    if (this.#mode === "inside") {
      const at = s.indexOf(CLOSE);
      if (at < 0) {
        const keep = partialTail(s, CLOSE);
        out.reasoning = s.slice(0, s.length - keep);
        this.#held = s.slice(s.length - keep);
        return out;
      }
      out.reasoning = s.slice(0, at);
      s = s.slice(at + CLOSE.length);
      this.#mode = "after";
      this.#trim = true;
    }
    if (this.#trim) {
      s = s.trimStart();
      if (s) this.#trim = false;
    }
    out.content = s;
    return out;
  }

  /** End of generation: what was held, where it belongs. */
  end(): Split {
    const held = this.#held;
    this.#held = "";
    if (this.#mode === "inside") return { reasoning: held, content: "" };
    return { reasoning: "", content: this.#mode === "before" ? held : "" };
  }
}
