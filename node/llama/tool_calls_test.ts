import assert from "node:assert/strict";
import {
  LLAMA31_TOOLS_TEMPLATE,
  MISTRAL_V03_TEMPLATE,
  QWEN_TOOLS_TEMPLATE,
} from "../../tools/fixture_templates.ts";
import {
  detectToolFamily,
  TOOL_CALL_FORMATS,
  ToolCallParser,
  type ToolFamily,
  type ToolParseEvent,
} from "./tool_calls.ts";

interface Parsed {
  text: string;
  calls: { name: string; args: string; error?: string }[];
  ids: string[];
  sawCall: boolean;
}

/** Folds events into content and calls, checking their order. */
function fold(events: ToolParseEvent[], sawCall: boolean): Parsed {
  const out: Parsed = { text: "", calls: [], ids: [], sawCall };
  let open = -1;
  for (const e of events) {
    if (e.type === "text") {
      assert.equal(open, -1, "text inside a call");
      out.text += e.text;
    } else if (e.type === "call_start") {
      assert.equal(open, -1, "call_start inside a call");
      assert.equal(e.index, out.calls.length);
      open = e.index;
      out.calls.push({ name: e.name, args: "" });
      out.ids.push(e.id);
    } else if (e.type === "call_args") {
      assert.equal(e.index, open);
      out.calls[open]!.args += e.delta;
    } else {
      assert.equal(e.index, open);
      if (e.error) out.calls[open]!.error = e.error;
      open = -1;
    }
  }
  assert.equal(open, -1, "a call was not ended");
  return out;
}

/** Parses `output` whole and one character at a time; both must agree. */
function parse(family: ToolFamily, output: string): Parsed {
  const whole = new ToolCallParser(family);
  const a = fold([...whole.push(output), ...whole.end()], whole.sawCall);
  const chars = new ToolCallParser(family);
  const events = [...output].flatMap((c) => chars.push(c));
  const b = fold([...events, ...chars.end()], chars.sawCall);
  assert.deepEqual({ ...b, ids: [] }, { ...a, ids: [] });
  for (const id of [...a.ids, ...b.ids]) {
    assert.match(id, /^call_[A-Za-z0-9]{24}$/);
  }
  return { ...a, ids: [] };
}

const NESTED =
  '{"q": "a } { \\" ] [ \\\\", "o": {"x": [1, {"y": null}], "z": "\\u00e9"}, "t": true}';

Deno.test("detectToolFamily() reads the template, then the model name", () => {
  assert.equal(detectToolFamily(QWEN_TOOLS_TEMPLATE), "hermes");
  assert.equal(detectToolFamily(LLAMA31_TOOLS_TEMPLATE), "llama3");
  assert.equal(detectToolFamily(MISTRAL_V03_TEMPLATE), "mistral");
  assert.equal(detectToolFamily(null, "Mistral-Small-3.2-24B"), "mistral");
  assert.equal(detectToolFamily(null, "llama-3.2-3b-instruct"), "llama3");
  assert.equal(detectToolFamily("{{ messages }}", "tiny"), "hermes");
  assert.equal(detectToolFamily(null), "hermes");
});

Deno.test("TOOL_CALL_FORMATS writes calls that ToolCallParser reads back", () => {
  for (const family of ["hermes", "llama3", "mistral"] as const) {
    const f = TOOL_CALL_FORMATS[family];
    const calls = ["a", "b"].map((name) =>
      `${f.open}{"name": "${name}", "${f.argsKey}": {"n": 1}}${f.close}`
    );
    const out = (f.listOpen ?? "") + calls.join(f.separator) +
      (f.listClose ?? "");
    assert.deepEqual(parse(family, out).calls, [
      { name: "a", args: '{"n": 1}' },
      { name: "b", args: '{"n": 1}' },
    ], family);
  }
});

Deno.test("ToolCallParser (hermes) separates text before a call from the call", () => {
  const p = parse(
    "hermes",
    'Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
  );
  assert.deepEqual(p, {
    text: "Let me check.",
    calls: [{ name: "get_weather", args: '{"city": "Paris"}' }],
    ids: [],
    sawCall: true,
  });
});

Deno.test("ToolCallParser (hermes) reads two parallel calls with nested, brace-laden arguments", () => {
  const p = parse(
    "hermes",
    `<tool_call>\n{"name": "a", "arguments": ${NESTED}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>\n`,
  );
  assert.equal(p.text, "");
  assert.deepEqual(p.calls, [{ name: "a", args: NESTED }, {
    name: "b",
    args: "{}",
  }]);
  assert.deepEqual(JSON.parse(p.calls[0]!.args).q, 'a } { " ] [ \\');
});

Deno.test("ToolCallParser streams call_start once the name is known, then argument pieces", () => {
  const p = new ToolCallParser("hermes");
  assert.deepEqual(p.push("Sure. <tool"), [{ type: "text", text: "Sure." }]);
  assert.deepEqual(p.push('_call>\n{"name": "f", "argu'), []);
  const [start, ...rest] = p.push('ments": {"a": "hel');
  assert.equal(start?.type === "call_start" && start.name, "f");
  assert.deepEqual(rest, [{
    type: "call_args",
    index: 0,
    delta: '{"a": "hel',
  }]);
  assert.deepEqual(p.push('lo"}}\n</tool_'), [
    { type: "call_args", index: 0, delta: 'lo"}' },
    { type: "call_end", index: 0 },
  ]);
  assert.deepEqual(p.push("call>"), []);
  assert.deepEqual(p.end(), []);
  assert.equal(p.sawCall, true);
});

Deno.test("ToolCallParser releases a false start as text", () => {
  const p = new ToolCallParser("hermes");
  assert.deepEqual(p.push("I use <tool"), [{ type: "text", text: "I use" }]);
  assert.deepEqual(p.push("s> daily \n"), [{
    type: "text",
    text: " <tools> daily",
  }]);
  assert.deepEqual(p.end(), [{ type: "text", text: " \n" }]);
  assert.equal(p.sawCall, false);
  assert.equal(parse("hermes", "a <tool_cal").text, "a <tool_cal");
});

Deno.test("ToolCallParser falls back to text on malformed JSON after an opener", () => {
  for (
    const bad of [
      "<tool_call>\n{name: f}\n</tool_call> ok",
      '<tool_call>\n{"name": 3}</tool_call>',
      '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',
      '<tool_call>\n{"name": "f", "arguments": [1]}</tool_call>',
      'x <tool_call>\n{"name": "line\nbreak", "arguments": {}}',
    ]
  ) {
    assert.deepEqual(parse("hermes", bad), {
      text: bad,
      calls: [],
      ids: [],
      sawCall: false,
    }, bad);
  }
  const p = parse(
    "hermes",
    'oops <tool_call><tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
  );
  assert.equal(p.text, "oops <tool_call>");
  assert.deepEqual(p.calls, [{ name: "f", args: '{"x": 1}' }]);
});

Deno.test("ToolCallParser ends a truncated call with error 'truncated' and releases an uncommitted one", () => {
  assert.deepEqual(
    parse("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": "x').calls,
    [{ name: "f", args: '{"a": "x', error: "truncated" }],
  );
  const early = 'Hi <tool_call>\n{"name": "f", "arg';
  assert.deepEqual(parse("hermes", early), {
    text: early,
    calls: [],
    ids: [],
    sawCall: false,
  });
});

Deno.test("ToolCallParser accepts arguments before the name, as a JSON string, or absent, and skips other keys", () => {
  const p = parse(
    "hermes",
    '<tool_call>{"arguments": {"a": 1}, "id": [1, "}"], "name": "f"}</tool_call>' +
      '<tool_call>{"name": "g", "arguments": "{\\"b\\": 2}"}</tool_call>' +
      '<tool_call>{"name": "h"}</tool_call>',
  );
  assert.deepEqual(p.calls, [
    { name: "f", args: '{"a": 1}' },
    { name: "g", args: '{"b": 2}' },
    { name: "h", args: "{}" },
  ]);
});

Deno.test("ToolCallParser marks arguments that are not JSON 'invalid_arguments'", () => {
  const p = parse(
    "hermes",
    '<tool_call>{"name": "f", "arguments": {"a": tru}}</tool_call>',
  );
  assert.deepEqual(p.calls, [{
    name: "f",
    args: '{"a": tru}',
    error: "invalid_arguments",
  }]);
  const q = parse("hermes", '<tool_call>{"name": "f", "arguments": {"a": ]}');
  assert.deepEqual(q.calls, [{
    name: "f",
    args: '{"a": ',
    error: "invalid_arguments",
  }]);
  assert.equal(q.text, "]}");
});

Deno.test("ToolCallParser (llama3) reads JSON calls at the start, with <|python_tag|> and ';'", () => {
  assert.deepEqual(
    parse("llama3", ` \n{"name": "a", "parameters": ${NESTED}}`).calls,
    [{ name: "a", args: NESTED }],
  );
  const p = parse(
    "llama3",
    '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
  );
  assert.deepEqual(p.calls, [{ name: "a", args: '{"x": 1}' }, {
    name: "b",
    args: "{}",
  }]);
  assert.equal(p.text, "");
});

Deno.test("ToolCallParser (llama3) leaves other outputs as text", () => {
  for (
    const text of [
      'Sure: {"name": "a", "parameters": {}}',
      '{"answer": 42, "list": [1, 2]}',
      '{"name": "Bob"} is a name',
      '<|python_tag|>brave_search.call(query="x")',
      "   ",
    ]
  ) {
    assert.deepEqual(parse("llama3", text), {
      text,
      calls: [],
      ids: [],
      sawCall: false,
    }, text);
  }
  const p = parse("llama3", '{"name": "a", "parameters": {}}\n\nDone.');
  assert.deepEqual(p.calls, [{ name: "a", args: "{}" }]);
  assert.equal(p.text, "Done.");
});

Deno.test("ToolCallParser (mistral) reads [TOOL_CALLS] lists, ids included", () => {
  const p = parse(
    "mistral",
    `Checking. [TOOL_CALLS] [{"name": "a", "arguments": ${NESTED}, "id": "abc123def"}, {"name": "b", "arguments": {"k": "v"}}]`,
  );
  assert.equal(p.text, "Checking.");
  assert.deepEqual(p.calls, [{ name: "a", args: NESTED }, {
    name: "b",
    args: '{"k": "v"}',
  }]);
});

Deno.test("ToolCallParser (mistral) reads [TOOL_CALLS]name[ARGS]{…}, with [CALL_ID]", () => {
  const p = parse(
    "mistral",
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]b.c-d[CALL_ID]a1b2c3d4e[ARGS]{}',
  );
  assert.deepEqual(p.calls, [
    { name: "get_weather", args: '{"city": "Paris"}' },
    { name: "b.c-d", args: "{}" },
  ]);
  assert.equal(p.text, "");
  for (
    const text of ["[TOOL_CALLS]f[AR", "[TOOL_CALLS] hello", "[TOOL_CALLS"]
  ) {
    assert.deepEqual(parse("mistral", text).text, text, text);
  }
});

Deno.test("ToolCallParser gives each call its own id", () => {
  const p = new ToolCallParser("hermes");
  const events = p.push(
    '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call>',
  );
  const ids = events.flatMap((e) => e.type === "call_start" ? [e.id] : []);
  assert.equal(ids.length, 2);
  assert.notEqual(ids[0], ids[1]);
});

Deno.test("ToolCallParser gives the same events for any chunking of random call-like text", () => {
  const pieces = ["<tool_call>", "</tool_call>", "<tool", "_call>", "{", "}"]
    .concat(["[", "]", '"name"', '"arguments"', '"parameters"', ":", ","])
    .concat([";", '"f"', '"a\\"}"', " ", "\n", "x", "1", "[TOOL_CALLS]"])
    .concat(["[ARGS]", "[CALL_ID]", "<|python_tag|>", "\\", '"', "é"]);
  const prefixes = ["", '<tool_call>{"name": "f", "arguments": {']
    .concat(['[TOOL_CALLS][{"name": "f", "arguments": {'])
    .concat(['{"name": "f", "parameters": {']);
  let seed = 12345;
  const rnd = (n: number) => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed % n;
  };
  for (let i = 0; i < 1500; i++) {
    let out = prefixes[rnd(prefixes.length)]!;
    for (let n = 1 + rnd(25); n > 0; n--) out += pieces[rnd(pieces.length)];
    for (const family of ["hermes", "llama3", "mistral"] as const) {
      const whole = parse(family, out);
      const p = new ToolCallParser(family);
      const events: ToolParseEvent[] = [];
      for (let at = 0; at < out.length;) {
        const k = 1 + rnd(5);
        events.push(...p.push(out.slice(at, at + k)));
        at += k;
      }
      const chunked = fold([...events, ...p.end()], p.sawCall);
      assert.deepEqual({ ...chunked, ids: [] }, whole, out);
      if (!whole.sawCall) assert.equal(whole.text, out);
      for (const c of whole.calls) {
        if (!c.error) assert.equal(typeof JSON.parse(c.args), "object");
      }
    }
  }
});
