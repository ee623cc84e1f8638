import assert from "node:assert/strict";
import { HARMONY_SHAPE_TEMPLATE } from "../../tools/fixture_templates.ts";
import { ChatTemplate } from "./chat_template.ts";
import { HarmonySplitter } from "./harmony.ts";
import { reasoningSplitter } from "./reasoning.ts";

const HARMONY = HARMONY_SHAPE_TEMPLATE;

/** Splits `text` fed in pieces of `n` characters. */
function split(text: string, n: number) {
  const s = new HarmonySplitter();
  let reasoning = "";
  let content = "";
  for (let i = 0; i < text.length; i += n) {
    const o = s.push(text.slice(i, i + n));
    reasoning += o.reasoning;
    content += o.content;
  }
  const o = s.end();
  return { reasoning: reasoning + o.reasoning, content: content + o.content };
}

Deno.test("a Harmony template has the reasoning_effort control and its output is split", () => {
  const t = new ChatTemplate(HARMONY, { bosToken: "", eosToken: "" });
  assert.deepEqual(t.reasoning, { control: "reasoning_effort", parses: true });
  const prompt = t.render([{ role: "user", content: "hi" }], {
    extra: { reasoning_effort: "low" },
  });
  assert.ok(
    prompt.startsWith("<|start|>system<|message|>Reasoning: low<|end|>"),
  );
  assert.ok(reasoningSplitter(HARMONY, prompt) instanceof HarmonySplitter);
});

Deno.test("HarmonySplitter sends analysis to reasoning and final to content, at any piece size, with or without <|end|>", () => {
  const out =
    "<|channel|>analysis<|message|>User says hi; a < b holds.<|end|><|start|>assistant<|channel|>final<|message|>Hello <there>!";
  const noEnd = out.replace("<|end|>", "");
  for (const text of [out, noEnd]) {
    for (const n of [1, 2, 3, 7, 100]) {
      assert.deepEqual(split(text, n), {
        reasoning: "User says hi; a < b holds.",
        content: "Hello <there>!",
      }, `${n}: ${text}`);
    }
  }
  // commentary (a preamble) is content; output without channels is content
  assert.deepEqual(
    split("<|channel|>commentary<|message|>Checking.<|end|>", 4),
    { reasoning: "", content: "Checking." },
  );
  assert.deepEqual(split("plain answer", 3), {
    reasoning: "",
    content: "plain answer",
  });
  // cut while thinking: all of it is reasoning
  assert.deepEqual(split("<|channel|>analysis<|message|>still <|", 5), {
    reasoning: "still <|",
    content: "",
  });
});
