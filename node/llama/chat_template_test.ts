import assert from "node:assert/strict";
import {
  LLAMA31_TOOLS_TEMPLATE,
  MISTRAL_V03_TEMPLATE,
  QWEN_TOOLS_TEMPLATE,
} from "../../tools/fixture_templates.ts";
import { ChatTemplate, strftimeNow, TemplateError } from "./chat_template.ts";

const CHATML =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const CHATML_TOKENS = { bosToken: "", eosToken: "<|im_end|>" };

const TOOLS = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
    },
  },
}];

/** System, user (text parts), assistant tool call, tool result, (answer,) user. */
function conversation(callId = "call_abc123", answer = false): unknown[] {
  return [
    { role: "system", content: "You are terse." },
    {
      role: "user",
      content: [{ type: "text", text: "Weather in" }, {
        type: "text",
        text: "Paris?",
      }],
    },
    {
      role: "assistant",
      content: null,
      tool_calls: [{
        id: callId,
        type: "function",
        function: { name: "get_weather", arguments: '{"city": "Paris"}' },
      }],
    },
    { role: "tool", tool_call_id: callId, content: "18C, sunny" },
    ...(answer ? [{ role: "assistant", content: "Sunny, 18C." }] : []),
    { role: "user", content: "Thanks. And Rome?" },
  ];
}

/** Asserts each marker occurs in `text`, each after the previous one. */
function assertInOrder(text: string, markers: string[]) {
  let at = 0;
  for (const m of markers) {
    const i = text.indexOf(m, at);
    assert.ok(
      i >= 0,
      `missing (in order) ${JSON.stringify(m)} in:\n${text.slice(at)}`,
    );
    at = i + m.length;
  }
}

Deno.test("ChatTemplate renders Qwen2.5's tools block, <tool_call> and <tool_response> turns", () => {
  const t = new ChatTemplate(QWEN_TOOLS_TEMPLATE, CHATML_TOKENS);
  assert.equal(t.supportsTools, true);
  const out = t.render(conversation(), { tools: TOOLS });
  assertInOrder(out, [
    "<|im_start|>system\nYou are terse.\n\n# Tools\n",
    '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n</tools>',
    "<|im_end|>\n<|im_start|>user\nWeather in\nParis?<|im_end|>\n",
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
    "<|im_start|>user\n<tool_response>\n18C, sunny\n</tool_response><|im_end|>\n",
    "<|im_start|>user\nThanks. And Rome?<|im_end|>\n",
  ]);
  assert.ok(out.endsWith("<|im_start|>assistant\n"));
});

Deno.test("ChatTemplate renders Qwen2.5's default system message without tools or system", () => {
  const t = new ChatTemplate(QWEN_TOOLS_TEMPLATE, CHATML_TOKENS);
  assert.equal(
    t.render([{ role: "user", content: "hi" }], {
      addGenerationPrompt: false,
    }),
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
  );
});

Deno.test("ChatTemplate renders Llama 3.1's tools in the first user turn and JSON calls with parameters", () => {
  const t = new ChatTemplate(LLAMA31_TOOLS_TEMPLATE, {
    bosToken: "<|begin_of_text|>",
    eosToken: "<|eot_id|>",
  });
  assert.equal(t.supportsTools, true);
  const out = t.render(conversation(), {
    tools: TOOLS,
    extra: { date_string: "01 Jan 2025" },
  });
  assertInOrder(out, [
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n",
    "Today Date: 01 Jan 2025\n\n",
    "You are terse.<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions",
    '{\n    "type": "function",\n    "function": {\n        "name": "get_weather"',
    "Weather in\nParis?<|eot_id|>",
    '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
    '<|start_header_id|>ipython<|end_header_id|>\n\n"18C, sunny"<|eot_id|>',
    "<|start_header_id|>user<|end_header_id|>\n\nThanks. And Rome?<|eot_id|>",
  ]);
  assert.ok(out.endsWith("<|start_header_id|>assistant<|end_header_id|>\n\n"));
});

Deno.test("ChatTemplate.render() throws the template's raise_exception text as TemplateError", () => {
  const t = new ChatTemplate(LLAMA31_TOOLS_TEMPLATE, {
    bosToken: "<|begin_of_text|>",
    eosToken: "<|eot_id|>",
  });
  const msgs = conversation();
  const call = (msgs[2] as { tool_calls: unknown[] }).tool_calls;
  call.push(call[0]);
  assert.throws(
    () => t.render(msgs, { tools: TOOLS }),
    new TemplateError("This model only supports single tool-calls at once!", {
      raised: true,
    }),
  );
});

Deno.test("ChatTemplate renders Mistral v0.3's [AVAILABLE_TOOLS], [TOOL_CALLS] and [TOOL_RESULTS] with 9-character ids", () => {
  const t = new ChatTemplate(MISTRAL_V03_TEMPLATE, {
    bosToken: "<s>",
    eosToken: "</s>",
  });
  assert.equal(t.supportsTools, true);
  // v0.3 wants user/assistant alternation around the tool turns.
  const out = t.render(conversation("call_0123456789abcdefghijklmn", true), {
    tools: TOOLS,
  });
  assertInOrder(out, [
    "<s>[INST] Weather in\nParis?[/INST]",
    '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "',
    '"}]</s>',
    '[TOOL_RESULTS] {"content": 18C, sunny, "call_id": "',
    '"}[/TOOL_RESULTS] Sunny, 18C.</s>',
    '[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {"type": "object"',
    "[/AVAILABLE_TOOLS][INST] You are terse.\n\nThanks. And Rome?[/INST]",
  ]);
  const ids = [...out.matchAll(/"(?:id|call_id)": "([^"]*)"/g)].map((m) =>
    m[1]
  );
  assert.equal(ids.length, 2);
  assert.match(ids[0]!, /^[A-Za-z0-9]{9}$/);
  assert.equal(ids[0], ids[1]);
});

Deno.test("ChatTemplate.render() reports Mistral's alternation rule", () => {
  const t = new ChatTemplate(MISTRAL_V03_TEMPLATE, {
    bosToken: "<s>",
    eosToken: "</s>",
  });
  assert.throws(
    () =>
      t.render([{ role: "user", content: "a" }, {
        role: "user",
        content: "b",
      }]),
    (e) => e instanceof TemplateError && /must alternate/.test(e.message),
  );
});

Deno.test("ChatTemplate injects Hermes tool definitions and calls into a template without tools", () => {
  const t = new ChatTemplate(CHATML, CHATML_TOKENS);
  assert.equal(t.supportsTools, false);
  const out = t.render(conversation(), { tools: TOOLS });
  assertInOrder(out, [
    "<|im_start|>system\nYou are terse.\n\n# Tools\n",
    '<tools>\n{"type": "function", "function": {"name": "get_weather"',
    '</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n',
    "<|im_start|>user\nWeather in\nParis?<|im_end|>\n",
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
    "<|im_start|>user\n<tool_response>\n18C, sunny\n</tool_response><|im_end|>\n",
    "<|im_start|>user\nThanks. And Rome?<|im_end|>\n<|im_start|>assistant\n",
  ]);
  // Without a system message, the tools become one.
  const bare = t.render([{ role: "user", content: "hi" }], { tools: TOOLS });
  assert.ok(bare.startsWith("<|im_start|>system\n# Tools\n"));
});

Deno.test("ChatTemplate maps developer to system, null content to '' and names tool results", () => {
  const t = new ChatTemplate(
    "{% if tools %}{% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }}:{{ m.name }}:{{ m.tool_call_id }}|{% endfor %}",
    CHATML_TOKENS,
  );
  const out = t.render([
    { role: "developer", content: "rules" },
    { role: "user", content: null },
    {
      role: "assistant",
      content: null,
      tool_calls: [{
        id: "c1",
        type: "function",
        function: { name: "f", arguments: "{}" },
      }],
    },
    { role: "tool", tool_call_id: "c1", content: "ok" },
  ]);
  assert.equal(
    out,
    "system:rules::|user:::|assistant:::|tool:ok:f:c1|",
  );
});

Deno.test("ChatTemplate folds system text into the first user turn when the template rejects it", () => {
  const t = new ChatTemplate(
    "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}",
    CHATML_TOKENS,
  );
  assert.equal(t.supportsSystemRole, false);
  assert.equal(
    t.render([
      { role: "system", content: "Be brief." },
      { role: "user", content: "hi" },
    ]),
    "<user>Be brief.\n\nhi",
  );
});

Deno.test("ChatTemplate throws TemplateError for bad syntax, unknown filters and raise_exception", () => {
  assert.throws(
    () => new ChatTemplate("{% for %}", CHATML_TOKENS),
    (e) =>
      e instanceof TemplateError && e.message.startsWith("Cannot parse chat"),
  );
  const odd = new ChatTemplate("{{ messages | weird_filter }}", CHATML_TOKENS);
  assert.throws(
    () => odd.render([{ role: "user", content: "x" }]),
    (e) => e instanceof TemplateError && /weird_filter/.test(e.message),
  );
  const raising = new ChatTemplate(
    "{{ raise_exception('Only user and assistant roles!') }}",
    CHATML_TOKENS,
  );
  assert.equal(raising.supportsSystemRole, true, "raises either way");
  assert.throws(
    () => raising.render([{ role: "user", content: "x" }]),
    new TemplateError("Only user and assistant roles!", { raised: true }),
  );
});

Deno.test("ChatTemplate provides strftime_now, range, tojson and the special tokens", () => {
  const t = new ChatTemplate(
    "{{ bos_token }}{{ strftime_now('%Y') }}|{% for i in range(3) %}{{ i }}{% endfor %}|{{ messages[0] | tojson }}|{{ x }}{{ eos_token }}",
    { bosToken: "<s>", eosToken: "</s>" },
  );
  assert.equal(
    t.render([{ role: "user", content: 'é "q"' }], { extra: { x: 7 } }),
    `<s>${
      new Date().getFullYear()
    }|012|{"role": "user", "content": "é \\"q\\""}|7</s>`,
  );
});

Deno.test("strftimeNow() formats like Python's strftime in the C locale", () => {
  assert.equal(
    strftimeNow(
      "%a %A %b %B %d %e %H %I %j %m %M %p %S %y %Y %% %Q",
      new Date(2024, 6, 26, 9, 5, 3),
    ),
    "Fri Friday Jul July 26 26 09 09 208 07 05 AM 03 24 2024 % %Q",
  );
});
