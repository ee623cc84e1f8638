/**
 * gpt-oss's Harmony output: messages in channels,
 * `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`
 * (the generation prompt ends with `<|start|>assistant`; `<|return|>` or
 * `<|call|>` end the turn). `HarmonySplitter` sends the `analysis` channel
 * to `reasoning_content` and the others (`final`, `commentary`) on as
 * content; the markers are not text. The engine renders special tokens
 * for such a model, so the markers reach it whichever of them llama.cpp
 * treats as control tokens. Tool calls in `commentary` (`to=functions.…`)
 * are not parsed into calls (a family of their own, not done yet).
 */
import type { ReasoningSplitter, Split } from "./reasoning.ts";

/** Whether a chat template writes Harmony channels (gpt-oss). */
export function isHarmony(source: string): boolean {
  return source.includes("<|channel|>") && source.includes("<|message|>");
}

const CHANNEL = "<|channel|>";
const START = "<|start|>";
const MESSAGE = "<|message|>";
/** Markers that end a message's text. */
const ENDS = ["<|end|>", START, CHANNEL, "<|call|>", "<|return|>"];
/** A header longer than this without `<|message|>` is not a header. */
const MAX_HEADER = 256;

/** Splits Harmony output into reasoning (`analysis`) and content (the other channels). */
export class HarmonySplitter implements ReasoningSplitter {
  #mode: "start" | "header" | "body" | "plain" = "start";
  #buf = "";
  #channel = "";

  push(text: string): Split {
    const out: Split = { reasoning: "", content: "" };
    this.#buf += text;
    for (;;) {
      if (this.#mode === "start") {
        const lead = this.#buf.trimStart();
        if (lead.startsWith(CHANNEL) || lead.startsWith(START)) {
          this.#buf = lead;
          this.#mode = "header";
        } else if (CHANNEL.startsWith(lead) || START.startsWith(lead)) {
          return out; // blank, or a piece of a marker
        } else this.#mode = "plain";
      } else if (this.#mode === "plain") {
        out.content += this.#buf;
        this.#buf = "";
        return out;
      } else if (this.#mode === "header") {
        const at = this.#buf.indexOf(MESSAGE);
        if (at < 0) {
          if (this.#buf.length > MAX_HEADER) this.#mode = "plain";
          else return out;
          continue;
        }
        const header = this.#buf.slice(0, at);
        this.#channel = /<\|channel\|>\s*([A-Za-z_]+)/.exec(header)?.[1] ?? "";
        this.#buf = this.#buf.slice(at + MESSAGE.length);
        this.#mode = "body";
      } else {
        let cut = -1;
        let marker = "";
        for (const m of ENDS) {
          const i = this.#buf.indexOf(m);
          if (i >= 0 && (cut < 0 || i < cut)) [cut, marker] = [i, m];
        }
        if (cut < 0) {
          const keep = heldTail(this.#buf);
          this.#emit(out, this.#buf.slice(0, this.#buf.length - keep));
          this.#buf = this.#buf.slice(this.#buf.length - keep);
          return out;
        }
        this.#emit(out, this.#buf.slice(0, cut));
        // a header's own markers start the next header; the others are dropped
        const next = marker === START || marker === CHANNEL;
        this.#buf = this.#buf.slice(next ? cut : cut + marker.length);
        this.#mode = "header";
      }
    }
  }

  end(): Split {
    const held = this.#buf;
    this.#buf = "";
    const out: Split = { reasoning: "", content: "" };
    if (this.#mode === "body") this.#emit(out, held);
    else if (this.#mode === "start" || this.#mode === "plain") {
      out.content = held;
    }
    return out;
  }

  #emit(out: Split, text: string) {
    if (this.#channel === "analysis") out.reasoning += text;
    else out.content += text;
  }
}

/** How much of the end of `s` may be the start of a marker (`<|…` not yet closed). */
function heldTail(s: string): number {
  const tail = s.slice(Math.max(0, s.lastIndexOf("<")));
  const open = tail === "<" || (tail.startsWith("<|") && !tail.includes("|>"));
  return open && tail.length <= 12 ? tail.length : 0;
}
