/**
 * Every request field of OpenAI's chat completions reference (and of the
 * Responses API), sent through the gateway to a scripted node: each is honoured (reaches the node, or has
 * the gateway's effect, with a 200) or refused (400 `unsupported_parameter`
 * naming it, nothing sent to a node); never accepted and ignored.
 */
import assert from "node:assert/strict";
import { createWorld, readSSE, type World } from "../gateway/_testing.ts";
import { CHAT_FIELDS, RESPONSE_FIELDS } from "../lib/openai_request_fields.ts";

const WEATHER = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather of a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
    },
  },
};

/** A plausible valid value of each field, and what it needs beside it. */
const REFERENCE: Record<string, { value: unknown; with?: object }> = {
  model: { value: "tiny-chat" },
  messages: { value: [{ role: "user", content: "Hi" }] },
  audio: { value: { voice: "alloy", format: "wav" } },
  frequency_penalty: { value: 0.5 },
  function_call: { value: "auto" },
  functions: {
    value: [{ name: "get_weather", parameters: { type: "object" } }],
  },
  logit_bias: { value: { "50256": -100 } },
  logprobs: { value: true },
  max_completion_tokens: { value: 16 },
  max_tokens: { value: 16 },
  metadata: { value: { team: "search" } },
  modalities: { value: ["text", "audio"] },
  n: { value: 1 },
  parallel_tool_calls: { value: false, with: { tools: [WEATHER] } },
  prediction: { value: { type: "content", content: "Hello world!" } },
  presence_penalty: { value: 0.5 },
  prompt_cache_key: { value: "user-1234" },
  prompt_cache_retention: { value: "24h" },
  reasoning_effort: { value: "low" },
  response_format: {
    value: {
      type: "json_schema",
      json_schema: { name: "reply", schema: { type: "object" }, strict: true },
    },
  },
  safety_identifier: { value: "b5e1c2" },
  seed: { value: 42 },
  service_tier: { value: "flex" },
  stop: { value: ["\n\n"] },
  store: { value: true },
  stream: { value: true },
  stream_options: { value: { include_usage: true }, with: { stream: true } },
  temperature: { value: 0.2 },
  tool_choice: {
    value: { type: "function", function: { name: "get_weather" } },
    with: { tools: [WEATHER] },
  },
  tools: { value: [WEATHER] },
  top_logprobs: { value: 2, with: { logprobs: true } },
  top_p: { value: 0.9 },
  user: { value: "user-1234" },
  verbosity: { value: "low" },
  web_search_options: { value: { search_context_size: "low" } },
};

/** Sampling extensions of local engines that the gateway passes on. */
const EXTENSIONS: Record<string, unknown> = {
  top_k: 40,
  min_p: 0.05,
  repeat_penalty: 1.1,
};

/** What the gateway refuses today (a change here is a product decision). */
const REFUSED = [
  "audio",
  "function_call",
  "functions",
  "modalities",
  "prediction",
  "prompt_cache_retention",
  "service_tier",
  "store",
  "verbosity",
  "web_search_options",
];

/** Fields the gateway itself honours: how their effect shows. */
const GATEWAY_EFFECTS: Record<
  string,
  (sent: Record<string, unknown>, res: Response) => Promise<void>
> = {
  model: (sent) => {
    assert.equal(sent.model, "tiny-chat");
    return Promise.resolve();
  },
  max_completion_tokens: (sent) => {
    assert.equal(sent.max_tokens, 16);
    assert.equal("max_completion_tokens" in sent, false);
    return Promise.resolve();
  },
  stream_options: async (_sent, res) => {
    const s = await readSSE(res);
    const last = JSON.parse(s.data.at(-2)!);
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage.total_tokens, 10);
  },
};

const chat = (extra: Record<string, unknown>) => ({
  model: "tiny-chat",
  messages: [{ role: "user", content: "Hi" }],
  ...extra,
});

/** Sends one field; returns whether it was honoured (true) or refused (false). */
async function send(
  w: World,
  field: string,
  value: unknown,
  beside: object = {},
): Promise<boolean> {
  const before = w.up.requests.length;
  const res = await w.post(
    "/v1/chat/completions",
    chat({ ...beside, [field]: value }),
  );
  if (res.status === 400) {
    const { error } = await res.json();
    assert.equal(error.type, "invalid_request_error", field);
    assert.equal(
      error.code,
      "unsupported_parameter",
      `${field}: ${error.message}`,
    );
    assert.equal(error.param, field);
    assert.equal(w.up.requests.length, before, `${field} reached a node`);
    return false;
  }
  assert.equal(res.status, 200, field);
  const sent = w.up.requests.at(-1)!.body;
  const effect = GATEWAY_EFFECTS[field];
  if (effect) await effect(sent, res);
  else {
    assert.deepEqual(sent[field], value, `${field} is forwarded unchanged`);
    await res.body?.cancel();
  }
  return true;
}

Deno.test("every chat completions reference field is honoured or refused with unsupported_parameter", async () => {
  assert.deepEqual(
    [...Object.keys(REFERENCE), ...Object.keys(EXTENSIONS)].sort(),
    Object.keys(CHAT_FIELDS).sort(),
    "the gateway's field list is the reference's plus the extensions",
  );
  const w = await createWorld();
  try {
    const refused: string[] = [];
    for (const [field, { value, with: beside }] of Object.entries(REFERENCE)) {
      if (!await send(w, field, value, beside)) refused.push(field);
    }
    for (const [field, value] of Object.entries(EXTENSIONS)) {
      assert.ok(await send(w, field, value), `${field} is passed on`);
    }
    assert.deepEqual(refused, REFUSED);
  } finally {
    await w.close();
  }
});

Deno.test("an unknown field is refused on every endpoint and reaches no node", async () => {
  const w = await createWorld();
  try {
    for (
      const [path, body] of [
        ["/v1/chat/completions", chat({ foo: 1 })],
        ["/v1/completions", { model: "tiny-chat", prompt: "Hi", foo: 1 }],
        ["/v1/embeddings", { model: "tiny-embed", input: "Hi", foo: 1 }],
      ] as const
    ) {
      const res = await w.post(path, body);
      assert.equal(res.status, 400, path);
      assert.deepEqual(await res.json(), {
        error: {
          message: "Unrecognized request argument supplied: foo",
          type: "invalid_request_error",
          param: "foo",
          code: "unsupported_parameter",
        },
      });
    }
    assert.equal(w.up.requests.length, 0);
  } finally {
    await w.close();
  }
});

Deno.test("values that ask for nothing are accepted and not forwarded", async () => {
  const w = await createWorld();
  try {
    const res = await w.post(
      "/v1/chat/completions",
      chat({
        store: false,
        modalities: ["text"],
        service_tier: "auto",
        audio: null,
        verbosity: null,
      }),
    );
    assert.equal(res.status, 200);
    await res.body?.cancel();
    const sent = w.up.requests[0]!.body;
    for (
      const f of ["store", "modalities", "service_tier", "audio", "metadata"]
    ) {
      assert.equal(f in sent, false, `${f} is not forwarded`);
    }
  } finally {
    await w.close();
  }
});

Deno.test("a malformed tool is refused with the exact param path", async () => {
  const w = await createWorld();
  try {
    const res = await w.post(
      "/v1/chat/completions",
      chat({
        tools: [WEATHER, {
          type: "function",
          function: { name: "get time" },
        }],
      }),
    );
    assert.equal(res.status, 400);
    const { error } = await res.json();
    assert.equal(error.param, "tools[1].function.name");
    assert.equal(error.code, "invalid_value");
    assert.equal(w.up.requests.length, 0);
  } finally {
    await w.close();
  }
});

Deno.test("an Anthropic tool conversation reaches the node as a valid chat body", async () => {
  const w = await createWorld();
  try {
    const res = await fetch(w.url + "/v1/messages", {
      method: "POST",
      headers: { "x-api-key": w.key, "content-type": "application/json" },
      body: JSON.stringify({
        model: "tiny-chat",
        max_tokens: 32,
        tools: [{
          name: "get_weather",
          input_schema: { type: "object" },
        }],
        tool_choice: { type: "auto" },
        messages: [
          { role: "user", content: "Weather in Oslo?" },
          {
            role: "assistant",
            content: [{
              type: "tool_use",
              id: "toolu_1",
              name: "get_weather",
              input: { city: "Oslo" },
            }],
          },
          {
            role: "user",
            content: [{
              type: "tool_result",
              tool_use_id: "toolu_1",
              content: "12 °C",
            }],
          },
        ],
      }),
    });
    assert.equal(res.status, 200);
    await res.body?.cancel();
    const sent = w.up.requests[0]!.body;
    assert.equal(sent.tool_choice, "auto");
    assert.deepEqual((sent.messages as unknown[]).at(-1), {
      role: "tool",
      tool_call_id: "toolu_1",
      content: "12 °C",
    });
  } finally {
    await w.close();
  }
});

/** A plausible value of each Responses field, and what it needs beside it. */
const RESPONSES_REFERENCE: Record<string, { value: unknown; with?: object }> = {
  model: { value: "tiny" },
  input: { value: "Hi" },
  instructions: { value: "Be brief." },
  max_output_tokens: { value: 16 },
  temperature: { value: 0.2 },
  top_p: { value: 0.9 },
  tools: {
    value: [
      { type: "function", name: "get_weather", parameters: { type: "object" } },
      {
        type: "namespace",
        name: "crm",
        description: "CRM",
        tools: [{ type: "function", name: "lookup" }],
      },
      { type: "web_search" },
    ],
  },
  tool_choice: {
    value: { type: "function", name: "get_weather" },
    with: { tools: [{ type: "function", name: "get_weather" }] },
  },
  parallel_tool_calls: { value: false },
  text: { value: { format: { type: "json_object" } } },
  stream: { value: true },
  stream_options: {
    value: { include_obfuscation: false },
    with: { stream: true },
  },
  store: { value: false },
  metadata: { value: { team: "search" } },
  client_metadata: { value: { session_id: "s-1", turn_id: "t-1" } },
  user: { value: "user-1234" },
  safety_identifier: { value: "b5e1c2" },
  prompt_cache_key: { value: "session-1" },
  reasoning: { value: { effort: "low", summary: "auto" } },
  include: { value: ["reasoning.encrypted_content"] },
  top_logprobs: { value: 2 },
  max_tool_calls: { value: 3 },
  background: { value: true },
  truncation: { value: "auto" },
  service_tier: { value: "flex" },
  conversation: { value: "conv_1" },
  prompt: { value: { id: "pmpt_1" } },
  prompt_cache_retention: { value: "24h" },
  prompt_cache_options: { value: { mode: "explicit" } },
  context_management: { value: [{ type: "compaction" }] },
  moderation: { value: { model: "omni-moderation-latest" } },
  access_programs: { value: ["p"] },
  image: { value: { detail: "high" } },
  seed: { value: 42 },
  presence_penalty: { value: 0.5 },
  frequency_penalty: { value: 0.5 },
  ...Object.fromEntries(
    Object.entries(EXTENSIONS).map(([k, value]) => [k, { value }]),
  ),
};

/** Responses fields reaching the node under their own name, unchanged. */
const RESPONSES_FORWARDED = [
  "temperature",
  "top_p",
  "parallel_tool_calls",
  "user",
  "safety_identifier",
  "prompt_cache_key",
  "seed",
  "presence_penalty",
  "frequency_penalty",
  ...Object.keys(EXTENSIONS),
];

/** What the Responses API refuses today (a change here is a product decision). */
const RESPONSES_REFUSED = [
  "background",
  "truncation",
  "service_tier",
  "conversation",
  "prompt",
  "prompt_cache_retention",
  "prompt_cache_options",
  "context_management",
  "moderation",
  "access_programs",
  "image",
];

Deno.test("every Responses API field is taken (with its local meaning) or refused with unsupported_parameter", async () => {
  assert.deepEqual(
    [...Object.keys(RESPONSES_REFERENCE), "previous_response_id"].sort(),
    Object.keys(RESPONSE_FIELDS).sort(),
    "every field of the gateway's list is sent here (previous_response_id: gateway/responses_test.ts)",
  );
  const w = await createWorld();
  try {
    const refused: string[] = [];
    for (
      const [field, { value, with: beside }] of Object.entries(
        RESPONSES_REFERENCE,
      )
    ) {
      const before = w.up.requests.length;
      const res = await w.post("/v1/responses", {
        model: "tiny",
        input: "Hi",
        ...beside,
        [field]: value,
      });
      const text = await res.text();
      if (res.status === 400) {
        const { error } = JSON.parse(text);
        assert.equal(error.code, "unsupported_parameter", `${field}: ${text}`);
        assert.equal(error.param, field);
        assert.equal(w.up.requests.length, before, `${field} reached a node`);
        refused.push(field);
        continue;
      }
      assert.equal(res.status, 200, `${field}: ${text.slice(0, 300)}`);
      const sent = w.up.requests.at(-1)!.body;
      if (RESPONSES_FORWARDED.includes(field)) {
        assert.deepEqual(sent[field], value, `${field} reaches the node`);
      }
      assert.equal(
        JSON.stringify(sent).includes("s-1"),
        false,
        "client_metadata reaches no node",
      );
    }
    assert.deepEqual(refused, RESPONSES_REFUSED);
  } finally {
    await w.close();
  }
});
