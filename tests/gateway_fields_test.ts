/**
 * Every request field of OpenAI's chat completions reference (and of the
 * Responses API), sent through the gateway to a scripted node: each is honoured (reaches the node, or has
 * the gateway's effect, with a 200) or refused (400 `unsupported_parameter`
 * naming it, nothing sent to a node); never accepted and ignored.
 */
import assert from "node:assert/strict";
import { createWorld, readSSE, type World } from "../gateway/_testing.ts";
import {
  CHAT_FIELDS,
  RESPONSE_FIELDS,
} from "../protocol/openai/request_fields.ts";
import { listRequestLog } from "../store/request_log.ts";
import { SYSTEM } from "../store/principal.ts";

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

// --- Anthropic Messages: the fields Claude Code 2.1.328 sends ---

const CLAUDE_CODE = JSON.parse(
  Deno.readTextFileSync(
    new URL("./fixtures/agents/claude_code_first.json", import.meta.url),
  ),
) as { headers: Record<string, string>; body: Record<string, unknown> };

/** Claude Code's seven betas, as it sends them with `?beta=true`. */
const BETAS = CLAUDE_CODE.headers["anthropic-beta"]!;

const messages = (w: World, body: Record<string, unknown>, path = "") =>
  w.post(`/v1/messages${path}`, {
    model: "tiny-chat",
    max_tokens: 32,
    messages: [{ role: "user", content: "Hi" }],
    ...body,
  }, { "anthropic-beta": BETAS, "anthropic-version": "2023-06-01" });

Deno.test("Anthropic hints Claude Code sends are accepted; on a model without a reasoning control, reported in x-orchard-ignored and not forwarded", async () => {
  const w = await createWorld();
  try {
    // a llama-engine model whose chat template has no reasoning switch
    for (const n of w.fleet.nodes()) {
      n.engine = "llama";
      n.models = n.models.map((m) => ({
        ...m,
        reasoning: { control: null, parses: false },
      }));
    }
    const res = await messages(w, {
      thinking: { type: "adaptive", display: "omitted" },
      output_config: { effort: "high" },
      context_management: {
        edits: [{ type: "clear_thinking_20251015", keep: "all" }],
      },
      safeguards: [{ type: "dangerous_tool_use", classifier_context: {} }],
      metadata: CLAUDE_CODE.body.metadata,
    }, "?beta=true");
    assert.equal(res.status, 200);
    assert.equal(
      res.headers.get("x-orchard-ignored"),
      "thinking, output_config.effort, safeguards",
    );
    const msg = await res.json();
    assert.deepEqual(msg.context_management, { applied_edits: [] });
    const sent = w.up.requests[0]!.body;
    for (
      const f of [
        "thinking",
        "output_config",
        "context_management",
        "safeguards",
        "reasoning_effort",
      ]
    ) {
      assert.equal(f in sent, false, `${f} is not forwarded`);
    }
    assert.equal(sent.prompt_cache_key, "266a2577-a312-4c5b-a9aa-50af274255da");
    // the request log keeps how the hints were taken
    await w.gw.core.usage.flush();
    const log = await listRequestLog(w.store, SYSTEM, w.tenant.id, {});
    assert.deepEqual(log.items[0]!.notes, {
      ignored: "thinking, output_config.effort, safeguards",
    });
  } finally {
    await w.close();
  }
});

Deno.test("Anthropic thinking and output_config.effort reach a model with a reasoning control as reasoning_effort, unreported", async () => {
  const w = await createWorld();
  try {
    for (const n of w.fleet.nodes()) {
      n.engine = "llama";
      n.models = n.models.map((m) => ({
        ...m,
        reasoning: { control: "enable_thinking" as const, parses: true },
      }));
    }
    const res = await messages(w, {
      thinking: { type: "adaptive", display: "omitted" },
      output_config: { effort: "high" },
      safeguards: [{ type: "dangerous_tool_use", classifier_context: {} }],
    }, "?beta=true");
    assert.equal(res.status, 200);
    await res.body?.cancel();
    assert.equal(res.headers.get("x-orchard-ignored"), "safeguards");
    const sent = w.up.requests[0]!.body;
    assert.equal(sent.reasoning_effort, "high");
    assert.equal("thinking" in sent || "output_config" in sent, false);
  } finally {
    await w.close();
  }
});

Deno.test("Anthropic context_management clears old tool results before the node sees them and reports applied_edits, streamed and not", async () => {
  const w = await createWorld();
  try {
    const convo: Record<string, unknown>[] = [{ role: "user", content: "go" }];
    for (let i = 0; i < 4; i++) {
      convo.push({
        role: "assistant",
        content: [{ type: "tool_use", id: `t${i}`, name: "Read", input: {} }],
      }, {
        role: "user",
        content: [{
          type: "tool_result",
          tool_use_id: `t${i}`,
          content: "r".repeat(4000),
        }],
      });
    }
    const body = {
      messages: convo,
      tools: [{ name: "Read", input_schema: { type: "object" } }],
      context_management: {
        edits: [{
          type: "clear_tool_uses_20250919",
          trigger: { type: "input_tokens", value: 2000 },
          keep: { type: "tool_uses", value: 1 },
        }],
      },
    };
    const res = await messages(w, body);
    assert.equal(res.status, 200);
    const applied = (await res.json()).context_management.applied_edits;
    assert.equal(applied.length, 1);
    assert.equal(applied[0].type, "clear_tool_uses_20250919");
    assert.equal(applied[0].cleared_tool_uses, 3);
    assert.ok(applied[0].cleared_input_tokens > 2900, applied);
    const tool =
      (w.up.requests[0]!.body.messages as { role: string; content: string }[])
        .filter((m) => m.role === "tool").map((m) => m.content.length);
    assert.equal(tool[3], 4000);
    assert.ok(tool.slice(0, 3).every((n) => n < 100), String(tool));
    // streamed: in message_delta
    const s = await messages(w, { ...body, stream: true });
    const events = (await readSSE(s)).data.map((d) => JSON.parse(d));
    const delta = events.find((e) => e.type === "message_delta");
    assert.deepEqual(delta.context_management.applied_edits, applied);
    // counted: the original estimate is reported beside the edited one
    const c = await w.post("/v1/messages/count_tokens", {
      model: "tiny-chat",
      ...body,
    });
    const count = await c.json();
    assert.ok(
      count.context_management.original_input_tokens >
        count.input_tokens + 2900,
      JSON.stringify(count),
    );
  } finally {
    await w.close();
  }
});

Deno.test("a node's context overflow is Anthropic's prompt-too-long text on /v1/messages and OpenAI's error on chat", async () => {
  const w = await createWorld();
  try {
    w.up.script = {
      status: 400,
      error: {
        code: "context_length_exceeded",
        message:
          "This model's maximum context length is 2048 tokens. However, you requested 13049 tokens (13037 in the messages, 12 in the completion).",
      },
    };
    const res = await messages(w, { stream: true });
    assert.equal(res.status, 400);
    assert.deepEqual(await res.json(), {
      type: "error",
      error: {
        type: "invalid_request_error",
        message: "prompt is too long: 13037 tokens > 2048 maximum",
      },
    });
    const chat = await w.post("/v1/chat/completions", {
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
    });
    assert.equal(chat.status, 400);
    assert.equal((await chat.json()).error.code, "context_length_exceeded");
  } finally {
    await w.close();
  }
});

Deno.test("the node's x-orchard-tool-grammar note reaches the client on chat, Responses and Messages, streamed and not", async () => {
  const w = await createWorld();
  try {
    w.up.script = { headers: { "x-orchard-tool-grammar": "loose=A,B" } };
    const tools = [WEATHER];
    for (const stream of [false, true]) {
      const answers = [
        await w.post("/v1/chat/completions", chat({ tools, stream })),
        await w.post("/v1/responses", {
          model: "tiny-chat",
          input: "Hi",
          tools: [{ type: "function", ...WEATHER.function }],
          stream,
        }),
        await messages(w, {
          tools: [{ name: "get_weather", input_schema: { type: "object" } }],
          stream,
        }),
      ];
      for (const res of answers) {
        assert.equal(res.status, 200, res.url);
        assert.equal(res.headers.get("x-orchard-tool-grammar"), "loose=A,B");
        await res.body?.cancel();
      }
    }
    // a malformed note is not passed on
    w.up.script = { headers: { "x-orchard-tool-grammar": "loose=<script>" } };
    const res = await w.post("/v1/chat/completions", chat({ tools }));
    assert.equal(res.headers.get("x-orchard-tool-grammar"), null);
    await res.body?.cancel();
  } finally {
    await w.close();
  }
});

Deno.test("count_tokens takes the thinking and output_config a Messages request carries", async () => {
  const w = await createWorld();
  try {
    const res = await w.post("/v1/messages/count_tokens", {
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
      thinking: { type: "enabled", budget_tokens: 2048 },
      output_config: { effort: "low" },
    });
    assert.equal(res.status, 200);
    assert.ok((await res.json()).input_tokens > 0);
  } finally {
    await w.close();
  }
});
