import assert from "node:assert/strict";
import { OpenAIError } from "../protocol/openai/errors.ts";
import { toOpenAI } from "./anthropic_request.ts";
import { parseChat, parseCompletion, parseEmbeddings } from "./validate.ts";

const WEATHER = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } } },
    strict: true,
  },
};
const CALL = {
  id: "call_1",
  type: "function",
  function: { name: "get_weather", arguments: '{"city":"Oslo"}' },
};

const chat = (extra: Record<string, unknown> = {}) => ({
  model: "m",
  messages: [{ role: "user", content: "Hi" }],
  ...extra,
});

/** The 400 a body gets: its param and code. */
function refusal(
  parse: (b: Record<string, unknown>) => unknown,
  body: Record<string, unknown>,
): { param: string | null; code: string | null } {
  try {
    parse(body);
  } catch (e) {
    assert.ok(e instanceof OpenAIError);
    assert.equal(e.status, 400);
    assert.equal(e.type, "invalid_request_error");
    return { param: e.param, code: e.code };
  }
  assert.fail(`accepted: ${JSON.stringify(body).slice(0, 200)}`);
}

Deno.test("parseChat() refuses an unknown field with unsupported_parameter naming it", () => {
  assert.deepEqual(refusal(parseChat, chat({ foo: 1 })), {
    param: "foo",
    code: "unsupported_parameter",
  });
  assert.throws(
    () => parseChat(chat({ foo: null })),
    /Unrecognized request argument supplied: foo/,
  );
});

Deno.test("parseChat() strips what asks for nothing and refuses what cannot be honoured", () => {
  const b = chat({
    store: false,
    modalities: ["text"],
    service_tier: "auto",
    audio: null,
    functions: null,
  });
  parseChat(b);
  assert.deepEqual(Object.keys(b).sort(), ["messages", "model"]);
  for (
    const [field, value] of [
      ["store", true],
      ["modalities", ["text", "audio"]],
      ["service_tier", "priority"],
      ["audio", { voice: "alloy", format: "wav" }],
      ["n", 2],
    ] as const
  ) {
    assert.deepEqual(refusal(parseChat, chat({ [field]: value })), {
      param: field,
      code: "unsupported_parameter",
    });
  }
});

Deno.test("parseChat() names the exact path of a malformed tool", () => {
  const cases: [Record<string, unknown>, string, string?][] = [
    [{ tools: {} }, "tools"],
    [{ tools: ["x"] }, "tools[0]"],
    [{ tools: [{ type: "function" }] }, "tools[0].function"],
    [{
      tools: [WEATHER, { type: "function", function: { name: "get weather" } }],
    }, "tools[1].function.name"],
    [
      { tools: [{ type: "function", function: { name: "x".repeat(65) } }] },
      "tools[0].function.name",
    ],
    [{ tools: [{ ...WEATHER, type: "tool" }] }, "tools[0].type"],
    [
      { tools: [{ type: "custom", custom: { name: "x" } }] },
      "tools[0].type",
      "unsupported_parameter",
    ],
    [{
      tools: [{ type: "function", function: { name: "f", parameters: "x" } }],
    }, "tools[0].function.parameters"],
    [{
      tools: [{ type: "function", function: { name: "f", strict: "yes" } }],
    }, "tools[0].function.strict"],
    [{ tools: Array.from({ length: 129 }, () => WEATHER) }, "tools"],
  ];
  for (const [extra, param, code] of cases) {
    const r = refusal(parseChat, chat(extra));
    assert.equal(r.param, param, JSON.stringify(extra).slice(0, 100));
    if (code) assert.equal(r.code, code);
  }
});

Deno.test("parseChat() checks tool_choice against the declared tools", () => {
  parseChat(chat({ tools: [WEATHER], tool_choice: "required" }));
  parseChat(chat({
    tools: [WEATHER],
    tool_choice: { type: "function", function: { name: "get_weather" } },
  }));
  parseChat(chat({ tool_choice: "none" }));
  parseChat(chat({ tool_choice: "auto" }));
  const cases: [Record<string, unknown>, string, string?][] = [
    [{ tool_choice: "required" }, "tool_choice"],
    [{ tool_choice: "sometimes", tools: [WEATHER] }, "tool_choice"],
    [{
      tools: [WEATHER],
      tool_choice: { type: "function", function: { name: "get_time" } },
    }, "tool_choice.function.name"],
    [
      { tools: [WEATHER], tool_choice: { type: "function" } },
      "tool_choice.function",
    ],
    [
      {
        tools: [WEATHER],
        tool_choice: {
          type: "allowed_tools",
          allowed_tools: { mode: "auto", tools: [] },
        },
      },
      "tool_choice.type",
      "unsupported_parameter",
    ],
  ];
  for (const [extra, param, code] of cases) {
    const r = refusal(parseChat, chat(extra));
    assert.equal(r.param, param, JSON.stringify(extra));
    if (code) assert.equal(r.code, code);
  }
});

Deno.test("parseChat() checks response_format, logprobs and parallel_tool_calls", () => {
  for (
    const rf of [
      { type: "text" },
      { type: "json_object" },
      { type: "json_schema", json_schema: { name: "w" } },
      {
        type: "json_schema",
        json_schema: {
          name: "weather_v2",
          description: "d",
          schema: { type: "object" },
          strict: true,
        },
      },
    ]
  ) parseChat(chat({ response_format: rf }));
  parseChat(chat({ logprobs: true, top_logprobs: 20 }));
  parseChat(chat({ logprobs: false, parallel_tool_calls: false }));
  const cases: [Record<string, unknown>, string][] = [
    [{ response_format: "json" }, "response_format"],
    [{ response_format: { type: "xml" } }, "response_format.type"],
    [
      { response_format: { type: "json_schema" } },
      "response_format.json_schema",
    ],
    [
      { response_format: { type: "json_schema", json_schema: {} } },
      "response_format.json_schema.name",
    ],
    [{
      response_format: {
        type: "json_schema",
        json_schema: { name: "w", schema: [] },
      },
    }, "response_format.json_schema.schema"],
    [{ logprobs: 1 }, "logprobs"],
    [{ logprobs: true, top_logprobs: 21 }, "top_logprobs"],
    [{ logprobs: true, top_logprobs: 1.5 }, "top_logprobs"],
    [{ top_logprobs: 2 }, "top_logprobs"],
    [{ parallel_tool_calls: "no" }, "parallel_tool_calls"],
    [{ stream_options: { include_usage: true } }, "stream_options"],
    [{
      stream: true,
      stream_options: { include_usage: true, extra: 1 },
    }, "stream_options.extra"],
    [{ logit_bias: { "50256": -101 } }, "logit_bias"],
    [{ temperature: 3 }, "temperature"],
  ];
  for (const [extra, param] of cases) {
    assert.equal(
      refusal(parseChat, chat(extra)).param,
      param,
      JSON.stringify(extra),
    );
  }
});

Deno.test("parseChat() checks assistant tool_calls and the tool messages answering them", () => {
  const convo = (assistant: unknown, tool: unknown) =>
    chat({
      tools: [WEATHER],
      messages: [{ role: "user", content: "Weather?" }, assistant, tool],
    });
  const ok = convo(
    { role: "assistant", content: null, tool_calls: [CALL] },
    { role: "tool", tool_call_id: "call_1", content: "12 °C" },
  );
  parseChat(ok);
  const tool = { role: "tool", tool_call_id: "call_1", content: "12 °C" };
  const cases: [unknown, unknown, string][] = [
    [
      { role: "assistant", tool_calls: [] },
      tool,
      "messages[1].tool_calls",
    ],
    [
      { role: "assistant", tool_calls: [{ ...CALL, id: "" }] },
      tool,
      "messages[1].tool_calls[0].id",
    ],
    [
      { role: "assistant", tool_calls: [{ ...CALL, type: "tool" }] },
      tool,
      "messages[1].tool_calls[0].type",
    ],
    [
      {
        role: "assistant",
        tool_calls: [{ ...CALL, function: { name: "get_weather" } }],
      },
      tool,
      "messages[1].tool_calls[0].function.arguments",
    ],
    [
      {
        role: "assistant",
        tool_calls: [{
          ...CALL,
          function: { name: "get_weather", arguments: { city: "Oslo" } },
        }],
      },
      tool,
      "messages[1].tool_calls[0].function.arguments",
    ],
    [
      {
        role: "assistant",
        tool_calls: [{ ...CALL, function: { arguments: "{}" } }],
      },
      tool,
      "messages[1].tool_calls[0].function.name",
    ],
    [
      { role: "user", content: "x", tool_calls: [CALL] },
      tool,
      "messages[1].tool_calls",
    ],
    [
      { role: "assistant", tool_calls: [CALL] },
      { role: "tool", content: "12 °C" },
      "messages[2].tool_call_id",
    ],
    [
      { role: "assistant", tool_calls: [CALL] },
      { role: "tool", tool_call_id: "call_2", content: "12 °C" },
      "messages[2].tool_call_id",
    ],
  ];
  for (const [assistant, reply, param] of cases) {
    assert.equal(
      refusal(parseChat, convo(assistant, reply)).param,
      param,
      JSON.stringify(assistant),
    );
  }
});

Deno.test("parseCompletion() and parseEmbeddings() know their own fields", () => {
  const completion = (extra: Record<string, unknown>) => ({
    model: "m",
    prompt: "Hi",
    ...extra,
  });
  parseCompletion(completion({ logprobs: 5, echo: true, suffix: "!" }));
  const b = completion({ best_of: 1 });
  parseCompletion(b);
  assert.equal("best_of" in b, false);
  for (
    const [extra, param, code] of [
      [{ messages: [] }, "messages", "unsupported_parameter"],
      [{ best_of: 3 }, "best_of", "unsupported_parameter"],
      [{ logprobs: 6 }, "logprobs", "invalid_type"],
      [{ logprobs: true }, "logprobs", "invalid_type"],
      [{ tools: [WEATHER] }, "tools", "unsupported_parameter"],
    ] as const
  ) {
    assert.deepEqual(refusal(parseCompletion, completion(extra)), {
      param,
      code,
    });
  }
  parseEmbeddings({ model: "e", input: "x", dimensions: 8, user: "u" });
  assert.deepEqual(
    refusal(parseEmbeddings, { model: "e", input: "x", stream: true }),
    { param: "stream", code: "unsupported_parameter" },
  );
});

Deno.test("toOpenAI() builds chat bodies that pass parseChat, tools and tool results included", () => {
  const { chat: p } = toOpenAI({
    model: "m",
    max_tokens: 64,
    system: "Be brief",
    top_k: 40,
    stop_sequences: ["\n\n"],
    tools: [{
      name: "get_weather",
      description: "Weather of a city",
      input_schema: {
        type: "object",
        properties: { city: { type: "string" } },
      },
    }, { name: "get_time", input_schema: { type: "object" } }],
    tool_choice: {
      type: "tool",
      name: "get_weather",
      disable_parallel_tool_use: true,
    },
    messages: [
      { role: "user", content: "Weather in Oslo?" },
      {
        role: "assistant",
        content: [
          { type: "text", text: "Checking." },
          {
            type: "tool_use",
            id: "toolu_1",
            name: "get_weather",
            input: { city: "Oslo" },
          },
        ],
      },
      {
        role: "user",
        content: [
          { type: "tool_result", tool_use_id: "toolu_1", content: "12 °C" },
          { type: "text", text: "And now?" },
        ],
      },
    ],
  });
  assert.equal(p.body.parallel_tool_calls, false);
  assert.deepEqual(p.body.tool_choice, {
    type: "function",
    function: { name: "get_weather" },
  });
  assert.deepEqual((p.body.tools as unknown[])[1], {
    type: "function",
    function: { name: "get_time", parameters: { type: "object" } },
  });
  parseChat(structuredClone(p.body));
  for (
    const [body, param] of [
      [{ tools: [{ name: "get weather" }] }, "tools.0.name"],
      [
        { tools: [{ type: "web_search_20250305", name: "web_search" }] },
        "tools.0.type",
      ],
      [{
        messages: [{
          role: "user",
          content: [{ type: "tool_result", content: "12 °C" }],
        }],
      }, "messages.0.content.0.tool_use_id"],
    ] as const
  ) {
    const r = refusal(toOpenAI, {
      model: "m",
      max_tokens: 8,
      messages: [{ role: "user", content: "Hi" }],
      ...body,
    });
    assert.equal(r.param, param);
  }
});

Deno.test("toOpenAI() honours or names every Messages field agents send: metadata.user_id, thinking, cache_control, is_error, earlier thinking", () => {
  const { chat: p } = toOpenAI({
    model: "m",
    max_tokens: 2048,
    metadata: { user_id: "user_1" },
    thinking: { type: "enabled", budget_tokens: 1024 },
    service_tier: "auto",
    system: [{ type: "text", text: "S", cache_control: { type: "ephemeral" } }],
    messages: [
      { role: "user", content: "Hi" },
      {
        role: "assistant",
        content: [
          { type: "thinking", thinking: "hmm", signature: "sig" },
          { type: "redacted_thinking", data: "x" },
          { type: "tool_use", id: "toolu_1", name: "f", input: { a: 1 } },
        ],
      },
      {
        role: "user",
        content: [{
          type: "tool_result",
          tool_use_id: "toolu_1",
          is_error: true,
          content: [{ type: "text", text: "boom" }],
        }],
      },
    ],
    tools: [{
      name: "f",
      input_schema: { type: "object" },
      cache_control: { type: "ephemeral" },
    }],
  });
  assert.equal(p.body.user, "user_1");
  const msgs = p.body.messages as Record<string, unknown>[];
  assert.deepEqual(msgs.map((m) => m.role), [
    "system",
    "user",
    "assistant",
    "tool",
  ]);
  // The earlier turn's thinking is left out; the tool's failure is said.
  assert.equal(msgs[2]!.content, "");
  assert.equal(msgs[3]!.content, "Error: boom");
  for (
    const [body, param] of [
      [{ container: "c" }, "container"],
      [
        { context_management: { edits: [{ type: "compact_20260112" }] } },
        "context_management.edits.0.type",
      ],
      [{ metadata: { user_id: "u", tags: "x" } }, "metadata.tags"],
      [
        { thinking: { type: "enabled", budget_tokens: 100 } },
        "thinking.budget_tokens",
      ],
      [
        { thinking: { type: "enabled", budget_tokens: 4096 } },
        "thinking.budget_tokens",
      ],
      [{ service_tier: "priority" }, "service_tier"],
      [{ tool_choice: { type: "whatever" } }, "tool_choice.type"],
      [{
        messages: [{
          role: "user",
          content: [{
            type: "text",
            text: "x",
            cache_control: { type: "forever" },
          }],
        }],
      }, "messages.0.content.0.cache_control"],
      [{
        messages: [{ role: "user", content: [{ type: "search_result" }] }],
      }, "messages.0.content.0.type"],
      [{
        messages: [{
          role: "user",
          content: [{ type: "thinking", thinking: "x" }],
        }],
      }, "messages.0.content.0.type"],
      [{
        messages: [{
          role: "user",
          content: [{
            type: "tool_result",
            tool_use_id: "t",
            content: [{ type: "image", source: { type: "url", url: "x" } }],
          }],
        }],
      }, "messages.0.content.0.content.0"],
    ] as const
  ) {
    const r = refusal(toOpenAI, {
      model: "m",
      max_tokens: 2048,
      messages: [{ role: "user", content: "Hi" }],
      ...body,
    });
    assert.equal(r.param, param, JSON.stringify(body));
  }
});
