import assert from "node:assert/strict";
import { toOpenAI } from "./anthropic_request.ts";
import { contextOverflowMessage } from "./anthropic.ts";
import { OpenAIError } from "../protocol/openai/errors.ts";

type Obj = Record<string, unknown>;

const FIRST = JSON.parse(
  Deno.readTextFileSync(
    new URL("../tests/fixtures/agents/claude_code_first.json", import.meta.url),
  ),
) as { body: Obj };

const base = (extra: Obj = {}): Obj => ({
  model: "tiny",
  max_tokens: 64,
  messages: [{ role: "user", content: "hi" }],
  ...extra,
});

function refusedAt(body: Obj, param: string) {
  assert.throws(
    () => toOpenAI(body),
    (e) => e instanceof OpenAIError && e.status === 400 && e.param === param,
    param,
  );
}

Deno.test("toOpenAI() accepts Claude Code 2.1.328's whole first request", () => {
  const a = toOpenAI(structuredClone(FIRST.body));
  assert.equal(a.chat.model, "agent");
  assert.deepEqual(a.applied, []); // clear_thinking keep all: nothing cleared
  // reported only where the model has no reasoning control (gateway/anthropic.ts)
  assert.deepEqual(a.ignored, []);
  assert.deepEqual(a.effortPaths, ["thinking", "output_config.effort"]);
  assert.equal(a.effort, "high");
  assert.deepEqual(a.thinking, { display: "omitted" });
  const msgs = a.chat.body.messages as Obj[];
  assert.equal(msgs[0]!.role, "system");
  assert.ok(
    String(msgs[0]!.content).startsWith(
      "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
    ),
  );
  assert.ok(!JSON.stringify(msgs).includes("x-anthropic-billing-header"));
  assert.equal(
    a.chat.body.prompt_cache_key,
    "266a2577-a312-4c5b-a9aa-50af274255da",
  );
  assert.match(String(a.chat.body.user), /"session_id"/);
});

Deno.test("toOpenAI(): two requests differing only in the billing line render the same chat messages", () => {
  const one = structuredClone(FIRST.body);
  const two = structuredClone(FIRST.body);
  (two.system as Obj[])[0]!.text =
    "x-anthropic-billing-header: cc_version=2.1.328.e41; cc_entrypoint=cli; cch=9f1c2;";
  assert.notDeepEqual(one, two);
  assert.deepEqual(
    toOpenAI(one).chat.body.messages,
    toOpenAI(two).chat.body.messages,
  );
  // a string system prompt loses its billing first line too
  const s = toOpenAI(base({
    system: "x-anthropic-billing-header: cc_version=1; cch=2;\nBe brief.",
  }));
  assert.deepEqual((s.chat.body.messages as Obj[])[0], {
    role: "system",
    content: "Be brief.",
  });
});

Deno.test("toOpenAI(): thinking comes to a reasoning effort and a display; disabled is effort none", () => {
  for (
    const [t, effort, display] of [
      [{ type: "adaptive" }, "high", "summarized"],
      [{ type: "adaptive", display: "omitted" }, "high", "omitted"],
      [{ type: "adaptive", display: "updates" }, "high", "summarized"],
      [
        { type: "enabled", budget_tokens: 1024, display: "summarized" },
        "high",
        "summarized",
      ],
    ] as const
  ) {
    const a = toOpenAI(base({ max_tokens: 2048, thinking: t }));
    assert.deepEqual(a.ignored, [], JSON.stringify(t));
    assert.deepEqual(a.effortPaths, ["thinking"]);
    assert.equal(a.effort, effort);
    assert.deepEqual(a.thinking, { display });
    assert.equal("thinking" in a.chat.body, false);
  }
  const low = toOpenAI(base({
    thinking: { type: "adaptive" },
    output_config: { effort: "low" },
  }));
  assert.equal(low.effort, "low");
  const off = toOpenAI(base({ thinking: { type: "disabled" } }));
  assert.deepEqual([off.ignored, off.effortPaths], [[], []]);
  assert.equal(off.effort, "none");
  assert.equal(off.thinking, null);
  assert.equal(toOpenAI(base({})).effort, null);
  refusedAt(base({ thinking: { type: "auto" } }), "thinking.type");
  refusedAt(
    base({ thinking: { type: "adaptive", display: "verbose" } }),
    "thinking.display",
  );
  refusedAt(
    base({ thinking: { type: "adaptive", budget: 3 } }),
    "thinking.budget",
  );
});

Deno.test("toOpenAI(): output_config.effort is validated and mapped; format becomes an enforced response_format", () => {
  for (const effort of ["low", "medium", "high", "xhigh", "max"]) {
    const a = toOpenAI(base({ output_config: { effort } }));
    assert.deepEqual(a.effortPaths, ["output_config.effort"]);
    assert.equal(a.effort, effort === "max" ? "xhigh" : effort);
    assert.equal(a.thinking, null); // no thinking asked: no thinking blocks
    // sent by the gateway only to a model with a reasoning control
    assert.equal("reasoning_effort" in a.chat.body, false);
  }
  refusedAt(
    base({ output_config: { effort: "extreme" } }),
    "output_config.effort",
  );
  refusedAt(
    base({ output_config: { task_budget: { type: "tokens", total: 9 } } }),
    "output_config.task_budget",
  );
  const schema = { type: "object", properties: { a: { type: "string" } } };
  const a = toOpenAI(base({
    output_config: { format: { type: "json_schema", schema } },
  }));
  assert.deepEqual(a.chat.body.response_format, {
    type: "json_schema",
    json_schema: { name: "output", schema, strict: true },
  });
  refusedAt(
    base({ output_config: { format: { type: "xml" } } }),
    "output_config.format",
  );
});

Deno.test("toOpenAI(): safeguards are accepted as an ignored hint; a malformed value is refused", () => {
  const a = toOpenAI(base({
    safeguards: [{ type: "dangerous_tool_use", classifier_context: { v: 1 } }],
  }));
  assert.deepEqual(a.ignored, ["safeguards"]);
  refusedAt(base({ safeguards: "on" }), "safeguards");
});

Deno.test("toOpenAI(): context_management clears old tool results before translation", () => {
  const messages: Obj[] = [{ role: "user", content: "go" }];
  for (let i = 0; i < 5; i++) {
    messages.push({
      role: "assistant",
      content: [{ type: "tool_use", id: `t${i}`, name: "Read", input: {} }],
    }, {
      role: "user",
      content: [{
        type: "tool_result",
        tool_use_id: `t${i}`,
        content: "z".repeat(2000),
      }],
    });
  }
  const a = toOpenAI(base({
    messages,
    tools: [{ name: "Read", input_schema: { type: "object" } }],
    context_management: {
      edits: [{
        type: "clear_tool_uses_20250919",
        trigger: { type: "input_tokens", value: 1000 },
        keep: { type: "tool_uses", value: 1 },
      }],
    },
  }));
  const tool = (a.chat.body.messages as Obj[]).filter((m) => m.role === "tool")
    .map((m) => String(m.content).length);
  assert.deepEqual(tool.slice(4), [2000]);
  assert.ok(tool.slice(0, 4).every((n) => n < 100), String(tool));
  assert.equal(a.applied![0]!.type, "clear_tool_uses_20250919");
  assert.equal(
    a.originalTokens,
    a.chat.prompt.estimate + a.applied![0]!.cleared_input_tokens,
  );
});

Deno.test("toOpenAI(): a tool's strict flag reaches the chat tool", () => {
  const a = toOpenAI(base({
    tools: [
      { name: "A", input_schema: { type: "object" }, strict: true },
      { name: "B", input_schema: { type: "object" } },
    ],
  }));
  const fns = (a.chat.body.tools as { function: Obj }[]).map((t) => t.function);
  assert.equal(fns[0]!.strict, true);
  assert.equal("strict" in fns[1]!, false);
  refusedAt(
    base({ tools: [{ name: "A", input_schema: {}, strict: "yes" }] }),
    "tools.0.strict",
  );
});

Deno.test("contextOverflowMessage() gives Anthropic's texts with the node's numbers", () => {
  assert.equal(
    contextOverflowMessage(
      "This model's maximum context length is 2048 tokens. However, you requested 13049 tokens (13037 in the messages, 12 in the completion).",
    ),
    "prompt is too long: 13037 tokens > 2048 maximum",
  );
  assert.equal(
    contextOverflowMessage(
      "This model's maximum context length is 2048 tokens. However, you requested 33000 tokens (1000 in the messages, 32000 in the completion).",
    ),
    "input length and `max_tokens` exceed context limit: 1000 + 32000 > 2048, decrease input length or `max_tokens` and try again",
  );
  assert.equal(contextOverflowMessage("Input is too long"), null);
});

Deno.test("toOpenAI(): deferred tools are offered once a tool_reference loads them (Claude Code's ToolSearch)", () => {
  const tools = [
    { name: "ToolSearch", input_schema: { type: "object" } },
    {
      name: "WebFetch",
      input_schema: { type: "object", properties: { url: { type: "string" } } },
      defer_loading: true,
    },
    {
      name: "DeferredToolPlaceholder",
      input_schema: { type: "object", properties: {} },
      defer_loading: true,
    },
  ];
  const names = (a: ReturnType<typeof toOpenAI>) =>
    (a.chat.body.tools as { function: Obj }[]).map((t) => t.function.name);
  // first turn: nothing loaded yet
  assert.deepEqual(names(toOpenAI(base({ tools }))), ["ToolSearch"]);
  // the next turn, as Claude Code 2.1.328 sends it after ToolSearch ran
  const a = toOpenAI(base({
    tools,
    messages: [
      { role: "user", content: "find a web fetch tool" },
      {
        role: "assistant",
        content: [{
          type: "tool_use",
          id: "toolu_search1",
          name: "ToolSearch",
          input: { query: "select:WebFetch", max_results: 1 },
        }],
      },
      {
        role: "user",
        content: [{
          type: "tool_result",
          tool_use_id: "toolu_search1",
          content: [{ type: "tool_reference", tool_name: "WebFetch" }],
          cache_control: { type: "ephemeral" },
        }],
      },
    ],
  }));
  assert.deepEqual(names(a), ["ToolSearch", "WebFetch"]);
  assert.deepEqual((a.chat.body.messages as Obj[]).at(-1), {
    role: "tool",
    tool_call_id: "toolu_search1",
    content: "Tool loaded: WebFetch\n",
  });
  refusedAt(
    base({ tools: [{ name: "A", input_schema: {}, defer_loading: "y" }] }),
    "tools.0.defer_loading",
  );
});

Deno.test("toOpenAI(): tool_addition and tool_removal in a system entry change the tools offered", () => {
  const a = toOpenAI(base({
    tools: [
      { name: "Read", input_schema: { type: "object" } },
      { name: "Bash", input_schema: { type: "object" } },
    ],
    messages: [
      { role: "user", content: "hi" },
      {
        role: "system",
        content: [
          {
            type: "tool_addition",
            tool: {
              type: "tool_definition",
              definition: {
                name: "mcp__db__query",
                description: "Run a query",
                input_schema: { type: "object" },
              },
            },
          },
          {
            type: "tool_removal",
            tool: { type: "tool_reference", name: "Bash" },
          },
          { type: "text", text: "The db server connected." },
        ],
      },
    ],
  }));
  const fns = (a.chat.body.tools as { function: Obj }[]).map((t) => t.function);
  assert.deepEqual(fns.map((f) => f.name), ["Read", "mcp__db__query"]);
  assert.equal(fns[1]!.description, "Run a query");
  assert.deepEqual((a.chat.body.messages as Obj[]).at(-1), {
    role: "system",
    content: "The db server connected.",
  });
  refusedAt(
    base({
      messages: [{
        role: "system",
        content: [{ type: "tool_addition", tool: { type: "x" } }],
      }, { role: "user", content: "hi" }],
    }),
    "messages.0.content.0.tool",
  );
});
