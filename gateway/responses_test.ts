/**
 * The Responses API's translation both ways (request → chat request, chat
 * answer → response object and events) and its storage, on a gateway over
 * a scripted upstream (tests/responses_test.ts runs it against a real
 * llama node with the official SDK).
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { OpenAIError } from "../protocol/openai/errors.ts";
import { parseSSE } from "../lib/sse.ts";
import { listUsageRecords } from "../store/usage.ts";
import { createTenant } from "../store/tenants.ts";
import { SYSTEM } from "../store/principal.ts";
import { createWorld } from "./_testing.ts";
import { Exchange } from "./core.ts";
import { ChunkNormaliser } from "./normalise.ts";
import { ResponsesSink } from "./responses_stream.ts";
import { outputOf } from "./responses_output.ts";
import { chatMessages, parseResponses } from "./responses_request.ts";

function refused(body: Record<string, unknown>, param: string, code?: string) {
  assert.throws(
    () => parseResponses({ model: "m", input: "Hi", ...body }),
    (e: unknown) => {
      assert.ok(e instanceof OpenAIError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.param, param, e.message);
      if (code) assert.equal(e.code, code);
      return true;
    },
  );
}

Deno.test("responses request: a string input is one user message; instructions come first as a system message", () => {
  const r = parseResponses({
    model: "m",
    input: "Hello",
    instructions: "Be brief.",
    max_output_tokens: 20,
    temperature: 0.5,
    seed: 3,
  });
  assert.deepEqual(chatMessages(r.instructions, r.input, r.input.length), [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Hello" },
  ]);
  assert.deepEqual(r.chat, { temperature: 0.5, seed: 3, max_tokens: 20 });
  assert.equal(r.store, true);
  assert.equal(r.stream, false);
  assert.equal(r.echo.max_output_tokens, 20);
  assert.deepEqual(r.echo.text, {
    format: { type: "text" },
    verbosity: "medium",
  });
});

Deno.test("responses request: items become chat messages, calls joining the assistant turn and outputs answering them", () => {
  const r = parseResponses({
    model: "m",
    input: [
      { role: "developer", content: "Rules." },
      {
        type: "message",
        role: "user",
        content: [
          { type: "input_text", text: "Look " },
          {
            type: "input_image",
            image_url: "data:image/png;base64,AA",
            detail: "low",
          },
        ],
      },
      {
        type: "message",
        role: "assistant",
        id: "msg_1",
        status: "completed",
        content: [{ type: "output_text", text: "Checking.", annotations: [] }],
      },
      { type: "reasoning", id: "rs_1", summary: [] },
      {
        type: "function_call",
        id: "fc_1",
        call_id: "call_a",
        name: "get_weather",
        arguments: '{"city":"Paris"}',
      },
      {
        type: "function_call",
        call_id: "call_b",
        name: "get_time",
        arguments: "{}",
      },
      { type: "function_call_output", call_id: "call_a", output: "18C" },
      {
        type: "function_call_output",
        call_id: "call_b",
        output: [{ type: "input_text", text: "noon" }],
      },
    ],
  });
  assert.deepEqual(chatMessages(null, r.input, r.input.length), [
    { role: "developer", content: "Rules." },
    {
      role: "user",
      content: [
        { type: "text", text: "Look " },
        {
          type: "image_url",
          image_url: { url: "data:image/png;base64,AA", detail: "low" },
        },
      ],
    },
    {
      role: "assistant",
      content: "Checking.",
      tool_calls: [
        {
          id: "call_a",
          type: "function",
          function: { name: "get_weather", arguments: '{"city":"Paris"}' },
        },
        {
          id: "call_b",
          type: "function",
          function: { name: "get_time", arguments: "{}" },
        },
      ],
    },
    { role: "tool", tool_call_id: "call_a", content: "18C" },
    { role: "tool", tool_call_id: "call_b", content: "noon" },
  ]);
});

Deno.test("responses request: a function_call_output needs an earlier call, counted from the history", () => {
  const r = parseResponses({
    model: "m",
    input: [{ type: "function_call_output", call_id: "call_x", output: "1" }],
  });
  const history = [
    {
      type: "message",
      role: "user",
      content: [{ type: "input_text", text: "Hi" }],
    },
    { type: "function_call", call_id: "call_x", name: "f", arguments: "{}" },
  ];
  assert.equal(chatMessages(null, [...history, ...r.input], 1).length, 3);
  assert.throws(
    () => chatMessages(null, r.input, 1),
    (e: unknown) =>
      e instanceof OpenAIError && e.status === 400 &&
      e.param === "input[0].call_id",
  );
});

Deno.test("responses request: function tools, tool_choice and text.format translate to chat's", () => {
  const schema = { type: "object", properties: { a: { type: "string" } } };
  const r = parseResponses({
    model: "m",
    input: "Hi",
    tools: [{
      type: "function",
      name: "f",
      description: "F",
      parameters: schema,
      strict: true,
    }, { type: "function", name: "g", parameters: null, strict: null }],
    tool_choice: { type: "function", name: "f" },
    parallel_tool_calls: false,
    text: {
      format: { type: "json_schema", name: "out", schema, strict: true },
    },
    include: ["message.output_text.logprobs"],
    top_logprobs: 2,
    metadata: { a: "b" },
    store: false,
    reasoning: { effort: "low" },
  });
  assert.deepEqual(r.chat, {
    parallel_tool_calls: false,
    tools: [
      {
        type: "function",
        function: {
          name: "f",
          description: "F",
          parameters: schema,
          strict: true,
        },
      },
      { type: "function", function: { name: "g" } },
    ],
    tool_choice: { type: "function", function: { name: "f" } },
    response_format: {
      type: "json_schema",
      json_schema: { name: "out", schema, strict: true },
    },
    logprobs: true,
    top_logprobs: 2,
  });
  // effort is decided with the fleet in view (responses.ts), not here
  assert.equal(r.effort, "low");
  assert.deepEqual(r.echo.tools[1], {
    type: "function",
    name: "g",
    description: null,
    parameters: null,
    strict: null,
  });
  assert.deepEqual(r.echo.tool_choice, { type: "function", name: "f" });
  assert.equal(r.echo.parallel_tool_calls, false);
  assert.equal(r.store, false);
  assert.equal(r.logprobs, true);
});

Deno.test("responses request: what cannot be served is refused by name, never ignored", () => {
  refused(
    { tools: [{ type: "custom", name: "apply_patch" }] },
    "tools[0].type",
    "unsupported_parameter",
  );
  refused(
    { tools: [{ type: "web_search" }], tool_choice: "required" },
    "tool_choice",
    "unsupported_parameter",
  );
  refused(
    { tools: [{ type: "function", name: "f", defer_loading: true }] },
    "tools[0].defer_loading",
  );
  refused(
    { tool_choice: { type: "web_search_preview" } },
    "tool_choice",
    "unsupported_parameter",
  );
  refused({ tool_choice: { type: "allowed_tools" } }, "tool_choice.type");
  refused({ tool_choice: "required" }, "tool_choice");
  refused({ background: true }, "background", "unsupported_parameter");
  refused({ truncation: "auto" }, "truncation", "unsupported_parameter");
  refused({ conversation: "conv_1" }, "conversation");
  refused({ include: ["reasoning.everything"] }, "include");
  refused({ client_metadata: { a: 1 } }, "client_metadata");
  refused({ reasoning: { summary: "long" } }, "reasoning.summary");
  refused({ text: { verbosity: "high" } }, "text.verbosity");
  refused({ stream_options: { include_obfuscation: true } }, "stream_options");
  refused(
    { stream: true, stream_options: { include_obfuscation: true } },
    "stream_options.include_obfuscation",
  );
  refused({ frobnicate: 1 }, "frobnicate", "unsupported_parameter");
  refused(
    { input: [{ type: "item_reference", id: "msg_1" }] },
    "input[0].type",
  );
  refused({
    input: [{ role: "user", content: [{ type: "input_file", file_id: "f" }] }],
  }, "input[0].content[0].type");
  refused({
    input: [{ role: "user", content: [{ type: "input_image", file_id: "f" }] }],
  }, "input[0].content[0].file_id");
  refused({ input: [{ role: "tool", content: "x" }] }, "input[0].role");
  refused({ previous_response_id: "nope" }, "previous_response_id");
  refused({ max_output_tokens: 0 }, "max_output_tokens");
  refused(
    { text: { format: { type: "json_schema", name: "x" } } },
    "text.format.schema",
  );
  // what asks for nothing passes
  const ok = parseResponses({
    model: "m",
    input: "Hi",
    background: false,
    truncation: "disabled",
    service_tier: "auto",
    max_tool_calls: 3,
    reasoning: { effort: null, summary: null },
    text: { verbosity: "medium" },
    include: [],
  });
  assert.equal(ok.logprobs, false);
  assert.throws(
    () => parseResponses({ model: "m" }),
    (e: unknown) => e instanceof OpenAIError && e.param === "input",
  );
});

Deno.test("responses output: a chat completion becomes a message and function_call items; length is incomplete", async () => {
  const done = await outputOf({
    choices: [{
      index: 0,
      finish_reason: "tool_calls",
      message: {
        role: "assistant",
        content: "Let me see.",
        tool_calls: [{
          id: "call_1",
          type: "function",
          function: { name: "f", arguments: '{"a":1}' },
        }],
      },
    }],
  });
  assert.equal(done.ending.status, "completed");
  const [msg, call] = done.output;
  assert.match(String(msg!.id), /^msg_[0-9a-f]{48}$/);
  assert.deepEqual({ ...msg, id: "" }, {
    id: "",
    type: "message",
    status: "completed",
    content: [{
      type: "output_text",
      annotations: [],
      logprobs: [],
      text: "Let me see.",
    }],
    role: "assistant",
  });
  assert.match(String(call!.id), /^fc_/);
  assert.deepEqual({ ...call, id: "" }, {
    id: "",
    type: "function_call",
    status: "completed",
    arguments: '{"a":1}',
    call_id: "call_1",
    name: "f",
  });
  const cut = await outputOf({
    choices: [{ finish_reason: "length", message: { content: "abc" } }],
  });
  assert.deepEqual(cut.ending, {
    status: "incomplete",
    reason: "max_output_tokens",
  });
  assert.equal(cut.output[0]!.status, "incomplete");
  const empty = await outputOf({
    choices: [{ finish_reason: "stop", message: { content: "" } }],
  });
  assert.equal(empty.output.length, 1);
  assert.equal((empty.output[0]!.content as { text: string }[])[0]!.text, "");
});

const auth = (key: string) => ({
  authorization: `Bearer ${key}`,
  "content-type": "application/json",
});

Deno.test("POST /v1/responses: a response object in OpenAI's shape, metered as responses, stored for the tenant only", async () => {
  const w = await createWorld();
  try {
    const res = await w.post("/v1/responses", {
      model: "tiny",
      instructions: "Be kind.",
      input: "Hi",
      max_output_tokens: 50,
      metadata: { run: "1" },
    });
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.ok(res.headers.get("x-request-id"));
    assert.match(body.id, /^resp_/);
    assert.equal(body.object, "response");
    assert.equal(body.status, "completed");
    assert.equal(body.model, "tiny-chat");
    assert.equal(body.instructions, "Be kind.");
    assert.deepEqual(body.metadata, { run: "1" });
    assert.equal(body.store, true);
    assert.equal(body.error, null);
    assert.equal(body.incomplete_details, null);
    assert.equal(typeof body.completed_at, "number");
    assert.equal(body.output.length, 1);
    assert.equal(body.output[0].content[0].text, "Hello world!");
    assert.deepEqual(body.usage, {
      input_tokens: 7,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: 3,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: 10,
    });
    const sent = w.up.requests.at(-1)!;
    assert.equal(sent.path, "/v1/chat/completions");
    assert.deepEqual(sent.body.messages, [
      { role: "system", content: "Be kind." },
      { role: "user", content: "Hi" },
    ]);
    assert.equal(sent.body.max_tokens, 50);

    // retrieved by the same tenant, exactly as answered
    const got = await fetch(`${w.url}/v1/responses/${body.id}`, {
      headers: auth(w.key),
    });
    assert.deepEqual(await got.json(), body);
    // another tenant's key does not see it, nor continue from it
    const other = await createTenant(w.store, SYSTEM, { name: "Other" });
    const b = await w.newKey({}, other.id);
    const miss = await fetch(`${w.url}/v1/responses/${body.id}`, {
      headers: auth(b.key),
    });
    assert.equal(miss.status, 404);
    const err = await miss.json();
    assert.equal(err.error.type, "invalid_request_error");
    const cont = await w.post("/v1/responses", {
      model: "tiny",
      input: "More",
      previous_response_id: body.id,
    }, auth(b.key));
    assert.equal(cont.status, 404);
    assert.equal((await cont.json()).error.param, "previous_response_id");
    const del = await fetch(`${w.url}/v1/responses/${body.id}`, {
      method: "DELETE",
      headers: auth(b.key),
    });
    assert.equal(del.status, 404);
    await del.body?.cancel();

    await w.gw.idle();
    const records = (await listUsageRecords(w.store, w.tenant.id)).items;
    assert.equal(records.length, 1);
    assert.equal(records[0]!.endpoint, "responses");
    assert.equal(records[0]!.completionTokens, 3);

    // deleted: gone for everyone
    const d = await fetch(`${w.url}/v1/responses/${body.id}`, {
      method: "DELETE",
      headers: auth(w.key),
    });
    assert.deepEqual(await d.json(), {
      id: body.id,
      object: "response",
      deleted: true,
    });
    const gone = await fetch(`${w.url}/v1/responses/${body.id}`, {
      headers: auth(w.key),
    });
    assert.equal(gone.status, 404);
    await gone.body?.cancel();
  } finally {
    await w.close();
  }
});

Deno.test("POST /v1/responses: previous_response_id continues the conversation; store: false keeps nothing", async () => {
  const w = await createWorld({
    script: { toolCall: { name: "f", args: '{"a":1}' } },
  });
  try {
    const first = await (await w.post("/v1/responses", {
      model: "tiny",
      instructions: "Use tools.",
      input: "Call f",
      tools: [{ type: "function", name: "f", parameters: { type: "object" } }],
      stream: true,
    })).text();
    const events = parseSSE(first).map((e) => JSON.parse(e.data));
    const final = events.at(-1).response;
    const call = final.output.find((i: { type: string }) =>
      i.type === "function_call"
    );
    assert.equal(call.call_id, "call_1");
    w.up.script = {};
    const res = await w.post("/v1/responses", {
      model: "tiny",
      previous_response_id: final.id,
      input: [{
        type: "function_call_output",
        call_id: call.call_id,
        output: "42",
      }],
      store: false,
    });
    const second = await res.json();
    assert.equal(res.status, 200, JSON.stringify(second));
    assert.equal(second.previous_response_id, final.id);
    assert.equal(second.store, false);
    // instructions are not carried over; the earlier turns are
    assert.deepEqual(w.up.requests.at(-1)!.body.messages, [
      { role: "user", content: "Call f" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{
          id: "call_1",
          type: "function",
          function: { name: "f", arguments: '{"a":1}' },
        }],
      },
      { role: "tool", tool_call_id: "call_1", content: "42" },
    ]);
    const got = await fetch(`${w.url}/v1/responses/${second.id}`, {
      headers: auth(w.key),
    });
    assert.equal(got.status, 404);
    await got.body?.cancel();
  } finally {
    await w.close();
  }
});

Deno.test("POST /v1/responses stream: OpenAI's event order and sequence numbers, the final response stored before it is sent", async () => {
  const w = await createWorld();
  try {
    const res = await w.post("/v1/responses", {
      model: "tiny",
      input: "Hi",
      stream: true,
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type")!, /text\/event-stream/);
    const frames = parseSSE(await res.text());
    const events = frames.map((f) => JSON.parse(f.data));
    for (const [i, f] of frames.entries()) {
      assert.equal(f.event, events[i].type, "each frame names its event");
      assert.equal(events[i].sequence_number, i);
    }
    assert.deepEqual(events.map((e) => e.type), [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    assert.equal(events[0].response.status, "in_progress");
    assert.equal(events[7].text, "Hello world!");
    const final = events.at(-1).response;
    assert.equal(final.status, "completed");
    assert.equal(final.output[0].content[0].text, "Hello world!");
    assert.equal(final.usage.output_tokens, 3);
    const got = await fetch(`${w.url}/v1/responses/${final.id}`, {
      headers: auth(w.key),
    });
    assert.deepEqual(await got.json(), final);
  } finally {
    await w.close();
  }
});

Deno.test("POST /v1/responses stream: a node that breaks off ends in response.failed and an error event, billed for what came", async () => {
  const w = await createWorld({
    script: { words: ["a", "b", "c", "d"], killAfter: 2, delayMs: 20 },
  });
  try {
    const res = await w.post("/v1/responses", {
      model: "tiny",
      input: "Hi",
      stream: true,
    });
    const events = parseSSE(await res.text()).map((e) => JSON.parse(e.data));
    const types = events.map((e) => e.type);
    assert.deepEqual(types.slice(-2), ["response.failed", "error"]);
    const failed = events.at(-2).response;
    assert.equal(failed.status, "failed");
    assert.equal(failed.error.code, "server_error");
    assert.equal(failed.output[0].status, "incomplete");
    assert.equal(failed.output[0].content[0].text, "ab");
    await w.gw.idle();
    const records = (await listUsageRecords(w.store, w.tenant.id)).items;
    assert.equal(records[0]!.outcome, "error");
    assert.equal(records[0]!.completionTokens, 2);
    assert.equal(
      await fetch(`${w.url}/v1/responses/${failed.id}`, {
        headers: auth(w.key),
      })
        .then(async (r) => {
          await r.body?.cancel();
          return r.status;
        }),
      404,
    );
  } finally {
    await w.close();
  }
});

Deno.test("responses stream: reasoning, text and parallel calls as events the openai SDK accumulates into the same response", async () => {
  const w = await createWorld();
  try {
    const ex = new Exchange(w.gw.core, "req_1", "responses");
    ex.promptUpper = 100;
    ex.completionCap = 100;
    const shell = {
      id: "resp_test",
      createdAt: 1,
      model: "tiny-chat",
      echo: parseResponses({ model: "tiny", input: "Hi" }).echo,
    };
    let saved: Record<string, unknown> | null = null;
    const sink = new ResponsesSink(
      new ChunkNormaliser("chat", "tiny-chat"),
      ex,
      shell,
      (r) => {
        saved = structuredClone(r);
        return Promise.resolve();
      },
    );
    const chunk = (
      delta: Record<string, unknown>,
      finish: string | null = null,
    ) =>
      JSON.stringify({
        id: "c",
        object: "chat.completion.chunk",
        created: 1,
        model: "tiny-chat",
        choices: [{ index: 0, delta, finish_reason: finish }],
      });
    let sse = sink.ping();
    for (
      const p of [
        chunk({ role: "assistant", reasoning_content: "Think" }),
        chunk({ reasoning_content: " more" }),
        chunk({ content: "Answer" }),
        chunk({
          tool_calls: [{
            index: 0,
            id: "call_1",
            type: "function",
            function: { name: "f", arguments: "" },
          }],
        }),
        chunk({
          tool_calls: [{ index: 0, function: { arguments: '{"a":1}' } }],
        }),
        chunk({
          tool_calls: [{
            index: 1,
            id: "call_2",
            type: "function",
            function: { name: "g", arguments: "{}" },
          }],
        }),
        chunk({}, "tool_calls"),
        JSON.stringify({
          id: "c",
          object: "chat.completion.chunk",
          created: 1,
          model: "tiny-chat",
          choices: [],
          usage: {
            prompt_tokens: 5,
            completion_tokens: 12,
            total_tokens: 17,
            completion_tokens_details: { reasoning_tokens: 3 },
          },
        }),
      ]
    ) sse += sink.data(p) ?? "";
    ex.bill(sink.reported, sink.counted, sink.chunks);
    await sink.complete();
    sse += sink.end();
    const types = parseSSE(sse).map((e) => JSON.parse(e.data).type);
    assert.deepEqual(types, [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    // the SDK's stream helper reads the events into the response stored
    const client = new OpenAI({
      apiKey: "k",
      baseURL: "http://sdk.invalid/v1",
      maxRetries: 0,
      fetch: () =>
        Promise.resolve(
          new Response(sse, {
            headers: { "content-type": "text/event-stream" },
          }),
        ),
    });
    const final = await client.responses.stream({ model: "tiny", input: "Hi" })
      .finalResponse();
    assert.deepEqual(
      final.output.map((i) => i.type),
      ["reasoning", "message", "function_call", "function_call"],
    );
    assert.equal(final.output_text, "Answer");
    assert.deepEqual(final.output[0], {
      id: (saved!.output as { id: string }[])[0]!.id,
      type: "reasoning",
      summary: [],
      content: [{ type: "reasoning_text", text: "Think more" }],
      status: "completed",
    });
    const calls = final.output.slice(
      2,
    ) as OpenAI.Responses.ResponseFunctionToolCall[];
    assert.deepEqual(
      calls.map((c) => [c.call_id, c.name, c.arguments, c.status]),
      [["call_1", "f", '{"a":1}', "completed"], [
        "call_2",
        "g",
        "{}",
        "completed",
      ]],
    );
    assert.equal(final.usage!.output_tokens_details.reasoning_tokens, 3);
    // the SDK's own additions aside (output_text, parse helpers' fields)
    const sdkOnly = [
      "output_text",
      "output_parsed",
      "parsed",
      "parsed_arguments",
    ];
    assert.deepEqual(
      JSON.parse(
        JSON.stringify(final, (k, v) => sdkOnly.includes(k) ? undefined : v),
      ),
      saved,
    );
  } finally {
    await w.close();
  }
});
