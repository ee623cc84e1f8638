import assert from "node:assert/strict";
import { applyContextManagement, CLEARED_RESULT } from "./anthropic_context.ts";
import { OpenAIError } from "../protocol/openai/errors.ts";

type Obj = Record<string, unknown>;

/** A conversation of `n` tool round trips (tool names cycle through `tools`), each result `size` bytes. */
function conversation(n: number, size: number, tools = ["Read"]): Obj[] {
  const msgs: Obj[] = [{ role: "user", content: "go" }];
  for (let i = 0; i < n; i++) {
    msgs.push({
      role: "assistant",
      content: [{
        type: "tool_use",
        id: `toolu_${i}`,
        name: tools[i % tools.length],
        input: { path: `/f${i}` },
      }],
    });
    msgs.push({
      role: "user",
      content: [{
        type: "tool_result",
        tool_use_id: `toolu_${i}`,
        content: "x".repeat(size),
      }],
    });
  }
  return msgs;
}

const results = (msgs: unknown[]) =>
  (msgs as Obj[]).flatMap((m) =>
    Array.isArray(m.content)
      ? (m.content as Obj[]).filter((b) => b.type === "tool_result")
      : []
  ).map((b) => b.content);

Deno.test("applyContextManagement() is null without context_management", () => {
  assert.equal(applyContextManagement({ messages: conversation(1, 10) }), null);
});

Deno.test("clear_tool_uses_20250919 below its trigger clears nothing and is not listed", () => {
  const body = {
    messages: conversation(5, 400),
    context_management: { edits: [{ type: "clear_tool_uses_20250919" }] },
  };
  const r = applyContextManagement(body)!;
  assert.deepEqual(r.applied, []);
  assert.deepEqual(results(r.messages), Array(5).fill("x".repeat(400)));
});

Deno.test("clear_tool_uses_20250919 past an input_tokens trigger clears all but the kept most recent results, oldest first", () => {
  const body = {
    messages: conversation(6, 4000),
    context_management: {
      edits: [{
        type: "clear_tool_uses_20250919",
        trigger: { type: "input_tokens", value: 5000 },
        keep: { type: "tool_uses", value: 2 },
      }],
    },
  };
  const r = applyContextManagement(body)!;
  assert.deepEqual(
    results(r.messages),
    [...Array(4).fill(CLEARED_RESULT), ...Array(2).fill("x".repeat(4000))],
  );
  const placeholder = Math.ceil(CLEARED_RESULT.length / 4);
  assert.deepEqual(r.applied, [{
    type: "clear_tool_uses_20250919",
    cleared_tool_uses: 4,
    cleared_input_tokens: 4 * (1000 - placeholder),
  }]);
  // the client's body is not changed
  assert.deepEqual(results(body.messages), Array(6).fill("x".repeat(4000)));
});

Deno.test("clear_tool_uses_20250919 keeps 3 by default, spares exclude_tools and clears inputs when asked", () => {
  const r = applyContextManagement({
    messages: conversation(6, 100, ["Read", "Bash"]),
    context_management: {
      edits: [{
        type: "clear_tool_uses_20250919",
        trigger: { type: "tool_uses", value: 5 },
        exclude_tools: ["Bash"],
        clear_tool_inputs: true,
      }],
    },
  })!;
  // uses 0..2 are past keep; 1 is Bash (excluded): 0 and 2 are cleared
  assert.deepEqual(results(r.messages), [
    CLEARED_RESULT,
    "x".repeat(100),
    CLEARED_RESULT,
    ...Array(3).fill("x".repeat(100)),
  ]);
  const inputs = (r.messages as Obj[]).flatMap((m) =>
    Array.isArray(m.content)
      ? (m.content as Obj[]).filter((b) => b.type === "tool_use")
      : []
  ).map((b) => b.input);
  assert.deepEqual(inputs[0], {});
  assert.deepEqual(inputs[1], { path: "/f1" });
  assert.deepEqual(inputs[3], { path: "/f3" });
  assert.equal((r.applied[0] as Obj).cleared_tool_uses, 2);
});

Deno.test("clear_tool_uses_20250919 with a tool_uses trigger not passed, or clear_at_least out of reach, changes nothing", () => {
  for (
    const edit of [
      { trigger: { type: "tool_uses", value: 6 } },
      {
        trigger: { type: "tool_uses", value: 1 },
        clear_at_least: { type: "input_tokens", value: 1_000_000 },
      },
    ]
  ) {
    const r = applyContextManagement({
      messages: conversation(6, 100),
      context_management: {
        edits: [{ type: "clear_tool_uses_20250919", ...edit }],
      },
    })!;
    assert.deepEqual(r.applied, [], JSON.stringify(edit));
    assert.deepEqual(results(r.messages), Array(6).fill("x".repeat(100)));
  }
});

Deno.test("clear_thinking_20251015 reports the thinking turns past keep; keep all clears none", () => {
  const thinkingTurn = (t: string) => ({
    role: "assistant",
    content: [
      { type: "thinking", thinking: t, signature: "sig" },
      { type: "text", text: "ok" },
    ],
  });
  const messages = [
    { role: "user", content: "a" },
    thinkingTurn("x".repeat(400)),
    { role: "user", content: "b" },
    thinkingTurn("y".repeat(400)),
    { role: "user", content: "c" },
    thinkingTurn("z".repeat(400)),
    { role: "user", content: "d" },
  ];
  const all = applyContextManagement({
    messages,
    context_management: {
      edits: [{ type: "clear_thinking_20251015", keep: "all" }],
    },
  })!;
  assert.deepEqual(all.applied, []);
  const one = applyContextManagement({
    messages,
    context_management: {
      edits: [{
        type: "clear_thinking_20251015",
        keep: { type: "thinking_turns", value: 1 },
      }],
    },
  })!;
  assert.deepEqual(one.applied, [{
    type: "clear_thinking_20251015",
    cleared_thinking_turns: 2,
    cleared_input_tokens: 2 * 100,
  }]);
  assert.deepEqual((one.messages[1] as Obj).content, [
    { type: "text", text: "ok" },
  ]);
  assert.equal(((one.messages[5] as Obj).content as unknown[]).length, 2);
});

Deno.test("malformed or unsupported edits are refused naming the field", () => {
  const cases: [unknown, string][] = [
    [
      { edits: [{ type: "compact_20260112" }] },
      "context_management.edits.0.type",
    ],
    [{ edits: "all" }, "context_management.edits"],
    [
      { edits: [{ type: "clear_tool_uses_20250919", keep: { type: "x" } }] },
      "context_management.edits.0.keep",
    ],
    [
      {
        edits: [{
          type: "clear_tool_uses_20250919",
          trigger: { type: "input_tokens", value: -1 },
        }],
      },
      "context_management.edits.0.trigger.value",
    ],
    [
      { edits: [{ type: "clear_thinking_20251015", depth: 1 }] },
      "context_management.edits.0.depth",
    ],
  ];
  for (const [cm, param] of cases) {
    assert.throws(
      () =>
        applyContextManagement({
          messages: conversation(1, 1),
          context_management: cm,
        }),
      (e) => e instanceof OpenAIError && e.status === 400 && e.param === param,
      param,
    );
  }
});

Deno.test("clear_tool_uses_20250919 keeps the results that load deferred tools (tool_reference)", () => {
  const messages = conversation(5, 2000);
  (messages[2]!.content as Obj[])[0]!.content = [
    { type: "tool_reference", tool_name: "WebFetch" },
  ];
  const r = applyContextManagement({
    messages,
    context_management: {
      edits: [{
        type: "clear_tool_uses_20250919",
        trigger: { type: "tool_uses", value: 1 },
        keep: { type: "tool_uses", value: 1 },
      }],
    },
  })!;
  assert.deepEqual(results(r.messages), [
    [{ type: "tool_reference", tool_name: "WebFetch" }],
    CLEARED_RESULT,
    CLEARED_RESULT,
    CLEARED_RESULT,
    "x".repeat(2000),
  ]);
  assert.equal((r.applied[0] as Obj).cleared_tool_uses, 3);
});
