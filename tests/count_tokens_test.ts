/**
 * Exact token counts and honest context limits through a real gateway and
 * llama node (tiny fixture model, 2048-token context): `count_tokens`
 * says what `/v1/messages` then bills, a too-long prompt is refused with
 * the real numbers, and `/v1/models` lists the context.
 */
import assert from "node:assert/strict";
import { startCluster } from "./fixtures/cluster.ts";

const WEATHER_TOOL = {
  name: "get_weather",
  description: "Weather forecast for a city",
  input_schema: {
    type: "object",
    properties: {
      city: { type: "string" },
      unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    },
    required: ["city"],
  },
};
const READ_TOOL = {
  name: "read_file",
  description: "Reads a file of the repository",
  input_schema: {
    type: "object",
    properties: { path: { type: "string" } },
    required: ["path"],
  },
};

/** Ten Anthropic requests of the shapes agents send. */
const REQUESTS: Record<string, unknown>[] = [
  { messages: [{ role: "user", content: "Hello" }] },
  {
    system: "You are a terse assistant.",
    messages: [{ role: "user", content: "Name three fruits." }],
  },
  {
    system: [
      { type: "text", text: "You are Claude Code, a coding agent." },
      {
        type: "text",
        text: "Follow the repository's style.",
        cache_control: { type: "ephemeral" },
      },
    ],
    messages: [{ role: "user", content: "Fix the bug in main.ts" }],
  },
  {
    tools: [WEATHER_TOOL],
    messages: [{ role: "user", content: "Weather in Oslo?" }],
  },
  {
    tools: [WEATHER_TOOL, READ_TOOL],
    tool_choice: { type: "auto" },
    messages: [{ role: "user", content: "Read README.md" }],
  },
  {
    tools: [READ_TOOL],
    messages: [
      { role: "user", content: "Read README.md" },
      {
        role: "assistant",
        content: [
          { type: "text", text: "Reading it." },
          {
            type: "tool_use",
            id: "toolu_01",
            name: "read_file",
            input: { path: "README.md" },
          },
        ],
      },
      {
        role: "user",
        content: [{
          type: "tool_result",
          tool_use_id: "toolu_01",
          content: "# Orchard\nA gateway and nodes.",
        }],
      },
    ],
  },
  {
    messages: [
      { role: "user", content: "What is 2 + 2?" },
      { role: "assistant", content: "4" },
      { role: "user", content: "And times 3?" },
      { role: "assistant", content: "12" },
      { role: "user", content: "Thanks!" },
    ],
  },
  {
    messages: [{
      role: "user",
      content: [
        { type: "text", text: "Two blocks:" },
        { type: "text", text: "ünïcödé, 日本語 and emoji 🍐" },
      ],
    }],
  },
  {
    system: "Answer in JSON.",
    tools: [READ_TOOL],
    messages: [
      { role: "user", content: "List files" },
      {
        role: "assistant",
        content: [{
          type: "tool_use",
          id: "toolu_02",
          name: "read_file",
          input: { path: "." },
        }],
      },
      {
        role: "user",
        content: [
          {
            type: "tool_result",
            tool_use_id: "toolu_02",
            content: [{ type: "text", text: "a.ts\nb.ts" }],
          },
          { type: "text", text: "Now summarise." },
        ],
      },
    ],
  },
  {
    system: "x".repeat(600),
    messages: [{ role: "user", content: "y ".repeat(200) }],
    stop_sequences: ["\n\n"],
  },
];

const FN_TOOL = {
  type: "function",
  name: "exec_command",
  description: "Runs a command",
  strict: false,
  parameters: {
    type: "object",
    properties: { cmd: { type: "string" } },
    required: ["cmd"],
  },
};

/** Ten Responses requests of the shapes Codex and the Agents SDK send. */
const RESPONSES: Record<string, unknown>[] = [
  { input: "Hello" },
  { instructions: "You are a terse assistant.", input: "Name three fruits." },
  {
    input: [{
      type: "message",
      role: "developer",
      content: [{ type: "input_text", text: "Follow the style guide." }],
    }, {
      type: "message",
      role: "user",
      content: [{ type: "input_text", text: "Fix main.ts" }],
    }],
  },
  { tools: [FN_TOOL], input: "List the files" },
  {
    tools: [FN_TOOL, { type: "web_search", external_web_access: false }],
    tool_choice: "auto",
    input: "Search and list",
  },
  {
    tools: [{
      type: "namespace",
      name: "multi_agent_v1",
      description: "Sub-agents",
      tools: [{ ...FN_TOOL, name: "close_agent" }],
    }],
    input: "Close the agent",
  },
  {
    tools: [FN_TOOL],
    input: [
      { role: "user", content: "Read README.md" },
      {
        type: "function_call",
        call_id: "call_1",
        name: "exec_command",
        arguments: '{"cmd":"cat README.md"}',
      },
      {
        type: "function_call_output",
        call_id: "call_1",
        output: "# Orchard\nA gateway and nodes.",
      },
    ],
  },
  {
    input: [
      { role: "user", content: "What is 2 + 2?" },
      { role: "assistant", content: "4" },
      { role: "user", content: "And times 3?" },
    ],
  },
  { input: "ünïcödé, 日本語 and emoji 🍐", prompt_cache_key: "s-1" },
  {
    instructions: "x".repeat(600),
    input: "y ".repeat(200),
    reasoning: { summary: "auto" },
    client_metadata: { "x-codex-window-id": "w:0" },
    store: false,
  },
];

Deno.test("count_tokens equals the billed prompt tokens of the same request, and too-long prompts say N and M", async (t) => {
  await using c = await startCluster({ slots: 2 });
  const post = (path: string, body: unknown) =>
    fetch(`${c.url}${path}`, {
      method: "POST",
      headers: {
        "x-api-key": c.apiKey,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
      },
      body: JSON.stringify(body),
    });

  await t.step(
    "10 varied requests: count_tokens = input + cache-read tokens billed",
    async () => {
      for (const [i, r] of REQUESTS.entries()) {
        const req = { model: "tiny", max_tokens: 4, temperature: 0, ...r };
        const counted = await post("/v1/messages/count_tokens", req);
        assert.equal(counted.status, 200, await counted.clone().text());
        assert.equal(counted.headers.get("x-orchard-token-count"), "exact");
        const { input_tokens: n } = await counted.json();
        const res = await post("/v1/messages", req);
        const body = await res.json();
        assert.equal(res.status, 200, JSON.stringify(body));
        const billed = body.usage.input_tokens +
          (body.usage.cache_read_input_tokens ?? 0);
        assert.equal(n, billed, `request ${i}: counted ${n}, billed ${billed}`);
        assert.ok(n > 0);
      }
    },
  );

  await t.step(
    "an image the model cannot see: count_tokens refuses it as /v1/messages does",
    async () => {
      const req = {
        model: "tiny",
        max_tokens: 4,
        messages: [{
          role: "user",
          content: [
            { type: "text", text: "What is in this picture?" },
            {
              type: "image",
              source: {
                type: "base64",
                media_type: "image/png",
                data:
                  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==",
              },
            },
          ],
        }],
      };
      const counted = await post("/v1/messages/count_tokens", req);
      const cbody = await counted.json();
      const res = await post("/v1/messages", req);
      const body = await res.json();
      assert.equal(res.status, 400, JSON.stringify(body));
      assert.equal(counted.status, res.status, JSON.stringify(cbody));
      assert.equal(cbody.type, "error");
      assert.equal(cbody.error.message, body.error.message);
    },
  );

  await t.step(
    "10 varied Responses requests: /v1/responses/input_tokens = input tokens billed",
    async () => {
      const bearer = (path: string, body: unknown) =>
        fetch(`${c.url}${path}`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${c.apiKey}`,
            "content-type": "application/json",
          },
          body: JSON.stringify(body),
        });
      for (const [i, r] of RESPONSES.entries()) {
        const req = {
          model: "tiny",
          max_output_tokens: 4,
          temperature: 0,
          ...r,
        };
        const counted = await bearer("/v1/responses/input_tokens", req);
        const cbody = await counted.json();
        assert.equal(counted.status, 200, JSON.stringify(cbody));
        assert.equal(counted.headers.get("x-orchard-token-count"), "exact");
        assert.equal(cbody.object, "response.input_tokens");
        const res = await bearer("/v1/responses", req);
        const body = await res.json();
        assert.equal(res.status, 200, JSON.stringify(body));
        assert.equal(
          cbody.input_tokens,
          body.usage.input_tokens,
          `request ${i}: counted ${cbody.input_tokens}, billed ${body.usage.input_tokens}`,
        );
        assert.ok(cbody.input_tokens > 0);
      }
    },
  );

  await t.step(
    "a prompt over the context: 400 context_length_exceeded with the real N and M",
    async () => {
      const long = {
        model: "tiny",
        max_tokens: 4,
        messages: [{ role: "user", content: "z".repeat(3000) }],
      };
      const { input_tokens: n } =
        await (await post("/v1/messages/count_tokens", long)).json();
      assert.ok(n > 2048);
      const res = await fetch(`${c.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${c.apiKey}`,
          "content-type": "application/json",
        },
        body: JSON.stringify({ ...long, max_tokens: undefined }),
      });
      const body = await res.json();
      assert.equal(res.status, 400);
      assert.equal(body.error.code, "context_length_exceeded");
      assert.equal(
        body.error.message,
        `This model's maximum context length is 2048 tokens. However, your messages resulted in ${n} tokens. Please reduce the length of the messages.`,
      );
      assert.equal(res.headers.get("x-orchard-prompt-tokens"), String(n));
      assert.equal(res.headers.get("x-orchard-context-length"), "2048");
    },
  );

  await t.step("/v1/models lists each model's context_length", async () => {
    const res = await fetch(`${c.url}/v1/models/tiny`, {
      headers: { authorization: `Bearer ${c.apiKey}` },
    });
    assert.equal((await res.json()).context_length, 2048);
  });
});
