import assert from "node:assert/strict";
import {
  QWEN3_TEMPLATE,
  QWEN3_THINKING_TEMPLATE,
  QWEN_TOOLS_TEMPLATE,
} from "../../tools/fixture_templates.ts";
import { ChatTemplate } from "./chat_template.ts";
import { ChoiceCollector, ChoiceOutput } from "./choice_output.ts";
import {
  grammarAfterThinking,
  opensThinking,
  reasoningVars,
  ThinkSplitter,
} from "./reasoning.ts";
import { ToolCallParser } from "./tool_calls.ts";

const SPECIAL = { bosToken: "", eosToken: "<|im_end|>" };
const HI = [{ role: "user", content: "hi" }];

/** Feeds `text` one character at a time and folds the pieces. */
function fold(out: ChoiceOutput, text: string): ChoiceCollector {
  const all = new ChoiceCollector();
  for (const ch of text) for (const p of out.text(ch, undefined)) all.add(p);
  for (const p of out.end()) all.add(p);
  return all;
}

Deno.test("ChatTemplate.reasoning: Qwen3 has enable_thinking and <think> output; Qwen2.5 has neither; a template reading reasoning_effort has that control", () => {
  assert.deepEqual(new ChatTemplate(QWEN3_TEMPLATE, SPECIAL).reasoning, {
    control: "enable_thinking",
    parses: true,
  });
  assert.deepEqual(new ChatTemplate(QWEN_TOOLS_TEMPLATE, SPECIAL).reasoning, {
    control: null,
    parses: false,
  });
  const harmony =
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>{% for m in messages %}{{ m.content }}{% endfor %}";
  assert.deepEqual(new ChatTemplate(harmony, SPECIAL).reasoning, {
    control: "reasoning_effort",
    parses: false,
  });
});

Deno.test("reasoningVars() turns enable_thinking off for none and minimal, on for the rest; passes reasoning_effort as is", () => {
  const t = new ChatTemplate(QWEN3_TEMPLATE, SPECIAL);
  const off = t.render(HI, { extra: reasoningVars("enable_thinking", "none") });
  assert.ok(off.endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  assert.deepEqual(reasoningVars("enable_thinking", "minimal"), {
    enable_thinking: false,
  });
  const on = t.render(HI, { extra: reasoningVars("enable_thinking", "high") });
  assert.ok(on.endsWith("<|im_start|>assistant\n"));
  assert.equal(on, t.render(HI)); // the template's default: thinking on
  assert.deepEqual(reasoningVars("reasoning_effort", "low"), {
    reasoning_effort: "low",
  });
  assert.deepEqual(reasoningVars(null, "low"), {});
  assert.deepEqual(reasoningVars("enable_thinking", null), {});
});

Deno.test("opensThinking() is true only for a prompt that ends inside <think>", () => {
  const thinking = new ChatTemplate(QWEN3_THINKING_TEMPLATE, SPECIAL);
  assert.equal(opensThinking(thinking.render(HI)), true);
  const qwen3 = new ChatTemplate(QWEN3_TEMPLATE, SPECIAL);
  assert.equal(opensThinking(qwen3.render(HI)), false);
  assert.equal(
    opensThinking(qwen3.render(HI, { extra: { enable_thinking: false } })),
    false,
  );
});

Deno.test("ThinkSplitter splits <think>…</think> at any boundary, drops the blank after it, and holds tag pieces", () => {
  const text = "\n<think>\nplan a, then b\n</think>\n\nThe answer.";
  for (let cut = 0; cut <= text.length; cut++) {
    const s = new ThinkSplitter(false);
    const a = s.push(text.slice(0, cut));
    const b = s.push(text.slice(cut));
    const c = s.end();
    assert.equal(
      a.reasoning + b.reasoning + c.reasoning,
      "\nplan a, then b\n",
      `cut at ${cut}`,
    );
    assert.equal(a.content + b.content + c.content, "The answer.");
  }
  // no think block: all content, and a lone "<thi" at the end is content
  const plain = new ThinkSplitter(false);
  assert.deepEqual(plain.push("<thi"), { reasoning: "", content: "" });
  assert.deepEqual(plain.end(), { reasoning: "", content: "<thi" });
  // opened by the prompt: reasoning from the first byte; cut short, all of it
  const open = new ThinkSplitter(true);
  assert.deepEqual(open.push("step one </thi"), {
    reasoning: "step one ",
    content: "",
  });
  assert.deepEqual(open.end(), { reasoning: "</thi", content: "" });
  // a later "<think>" is content
  const late = new ThinkSplitter(false);
  assert.deepEqual(late.push("x <think>y</think>"), {
    reasoning: "",
    content: "x <think>y</think>",
  });
});

Deno.test("ChoiceOutput sends thinking as reasoning_content deltas and parses the tool call after it", () => {
  const out = new ChoiceOutput(
    "chat",
    new ToolCallParser("hermes"),
    false,
    new ThinkSplitter(false),
  );
  const pieces = [
    "<think>\nI need the weather.\n</think>\n\n",
    '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
  ].flatMap((t) => out.text(t, undefined)).concat(out.end());
  assert.deepEqual(pieces[0]!.delta, {
    reasoning_content: "\nI need the weather.\n",
  });
  assert.ok(pieces.every((p) => !("content" in (p.delta ?? {}))));
  const all = new ChoiceCollector();
  for (const p of pieces) all.add(p);
  assert.equal(all.reasoning, "\nI need the weather.\n");
  assert.equal(all.content, "");
  assert.equal(all.calls[0]!.function.name, "weather");
  assert.deepEqual(JSON.parse(all.calls[0]!.function.arguments), {
    city: "Oslo",
  });
  assert.equal(out.finishReason("stop"), "tool_calls");

  const streamed = fold(
    new ChoiceOutput("chat", null, false, new ThinkSplitter(true)),
    "a plan</think>\n\nDone.",
  );
  assert.equal(streamed.reasoning, "a plan");
  assert.equal(streamed.content, "Done.");
});

Deno.test("grammarAfterThinking() makes a grammar lazy from </think> on after an opened <think>, keeping each trigger after it", () => {
  const whole = grammarAfterThinking({ gbnf: 'root ::= "{}"' }, true);
  assert.equal(whole.gbnf, 'root ::= "{}"');
  const [t] = whole.triggers!;
  const re = new RegExp(`^(?:${t})$`);
  assert.equal(re.exec("<x>")?.[1], undefined);
  assert.equal(re.exec("plan</think>")?.[1], "");
  assert.equal(re.exec("plan</think>\n\n{")?.[1], "{");
  const lazy = grammarAfterThinking({
    gbnf: "root ::= call",
    triggers: [String.raw`[\s\S]*?(<tool_call>[\s\S]*)`, String.raw`^\s*(\{)`],
  }, true);
  const [hermes, llama3] = lazy.triggers!.map((x) => new RegExp(`^(?:${x})$`));
  // a call opener inside the thinking does not trigger; one after it does
  assert.equal(hermes!.exec("<tool_call> maybe"), null);
  assert.equal(
    hermes!.exec("<tool_call> maybe</think>\n<tool_call>{")?.[1],
    "<tool_call>{",
  );
  assert.equal(llama3!.exec("hmm</think> {")?.[1], "{");
});

Deno.test("grammarAfterThinking() where the model may open <think> itself: triggers count outside a think block only; whole grammars stay", () => {
  const whole = { gbnf: 'root ::= "{}"' };
  assert.equal(grammarAfterThinking(whole, false), whole);
  const [t] = grammarAfterThinking({
    gbnf: "root ::= call",
    triggers: [String.raw`[\s\S]*?(<tool_call>[\s\S]*)`],
  }, false).triggers!;
  const re = new RegExp(`^(?:${t})$`);
  // no thinking: the call triggers as before
  assert.equal(re.exec("Sure. <tool_call>{")?.[1], "<tool_call>{");
  // inside an open think block: it does not
  assert.equal(re.exec("<think>\nmaybe <tool_call>{"), null);
  assert.equal(re.exec("\n<think>\nmaybe <tool_call>{"), null);
  // after the block: it does
  assert.equal(
    re.exec("<think>\nmaybe <tool_call></think>\n\n<tool_call>{")?.[1],
    "<tool_call>{",
  );
});
