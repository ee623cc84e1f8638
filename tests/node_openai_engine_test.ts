import assert from "node:assert/strict";
import { createOpenAIEngine } from "../node/engines/openai.ts";
import { readSse, startFakeUpstream } from "./_fleet.ts";

const signal = () => new AbortController().signal;

async function setup(opts: { slots?: number; maxQueue?: number } = {}) {
  const up = startFakeUpstream();
  const engine = createOpenAIEngine({ upstreamUrl: up.url, ...opts });
  await engine.start();
  return {
    up,
    engine,
    async [Symbol.asyncDispose]() {
      await engine.close();
      await up.close();
    },
  };
}

Deno.test("openai engine lists only models the upstream actually serves", async () => {
  await using t = await setup();
  const models = await t.engine.models();
  assert.deepEqual(
    models.map((m) => [m.id, m.kind]).sort(),
    [["nomic-embed", "embedding"], ["tiny-chat", "chat"]],
  );
  assert.equal(t.engine.stats().healthy, true);
});

Deno.test("openai engine turns Exo's stream into exact chat.completion.chunk frames with a final usage chunk", async () => {
  await using t = await setup();
  const res = await t.engine.chatCompletions({
    model: "tiny-chat",
    stream: true,
    messages: [{ role: "user", content: "hi" }],
  }, signal());
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-type"), "text/event-stream");
  const { data } = await readSse(res);
  assert.equal(data.at(-1), "[DONE]");
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
  assert.equal(chunks.length, 3);
  for (const c of chunks) {
    assert.equal(c.object, "chat.completion.chunk");
    assert.equal(c.id, "chatcmpl-s");
    assert.equal(c.model, "tiny-chat");
  }
  assert.deepEqual(chunks[0].choices, [{
    index: 0,
    logprobs: null,
    finish_reason: null,
    delta: { role: "assistant", content: "Hi" },
  }]);
  assert.equal("usage" in chunks[1], false, "usage moved off content chunk");
  assert.equal(chunks[1].choices[0].finish_reason, "stop");
  assert.deepEqual(chunks[2].choices, []);
  assert.deepEqual(chunks[2].usage, {
    prompt_tokens: 4,
    completion_tokens: 2,
    total_tokens: 6,
  });
  assert.deepEqual(t.up.requests[0]!.stream_options, { include_usage: true });
});

Deno.test("openai engine normalises non-stream responses and integer error codes", async () => {
  await using t = await setup();
  const ok = await t.engine.chatCompletions({
    model: "tiny-chat",
    messages: [{ role: "user", content: "hi" }],
  }, signal());
  const body = await ok.json();
  assert.equal(body.object, "chat.completion");
  assert.deepEqual(body.choices, [{
    index: 0,
    logprobs: null,
    finish_reason: "stop",
    message: { role: "assistant", content: "Hi there" },
  }]);
  assert.deepEqual(body.usage, {
    prompt_tokens: 5,
    completion_tokens: 2,
    total_tokens: 7,
  });

  const bad = await t.engine.chatCompletions({
    model: "tiny-chat",
    messages: [{ role: "user", content: "bad" }],
  }, signal());
  assert.equal(bad.status, 400);
  assert.deepEqual(await bad.json(), {
    error: {
      message: "prompt too long",
      type: "invalid_request_error",
      param: null,
      code: "invalid_request",
    },
  });

  const ghost = await t.engine.chatCompletions({
    model: "ghost-model",
    messages: [],
  }, signal());
  assert.equal(ghost.status, 404);
  assert.equal((await ghost.json()).error.code, "model_not_found");
});

Deno.test("openai engine estimates usage when the upstream gives none, and says so", async () => {
  await using t = await setup();
  const res = await t.engine.completions({
    model: "tiny-chat",
    prompt: "Say hello",
    stream: true,
  }, signal());
  const { data, comments } = await readSse(res);
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
  assert.ok(chunks.every((c) => c.object === "text_completion"));
  assert.equal(
    chunks.map((c) => c.choices[0]?.text ?? "").join(""),
    "Hello world",
  );
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.prompt_tokens, 3);
  assert.equal(last.usage.completion_tokens, 3);
  assert.ok(comments.some((c) => c.includes("usage estimated")));
});

Deno.test("openai engine returns embeddings as floats or base64", async () => {
  await using t = await setup();
  const res = await t.engine.embeddings({
    model: "nomic-embed",
    input: ["a", "b"],
    encoding_format: "base64",
  }, signal());
  const body = await res.json();
  assert.equal(body.object, "list");
  assert.equal(body.data.length, 2);
  const bytes = Uint8Array.from(
    atob(body.data[1].embedding),
    (c) => c.charCodeAt(0),
  );
  assert.deepEqual([...new Float32Array(bytes.buffer)], [0.5, -1, 0.25]);
  assert.deepEqual(body.usage, { prompt_tokens: 3, total_tokens: 3 });
});

Deno.test("openai engine answers 503 with retry-after when its queue is full", async () => {
  await using t = await setup({ slots: 1, maxQueue: 0 });
  const first = await t.engine.chatCompletions({
    model: "tiny-chat",
    stream: true,
    messages: [{ role: "user", content: "hold" }],
  }, signal());
  await t.up.held;
  assert.equal(t.engine.stats().inFlight, 1);
  const busy = await t.engine.chatCompletions({
    model: "tiny-chat",
    messages: [{ role: "user", content: "hi" }],
  }, signal());
  assert.equal(busy.status, 503);
  assert.equal(busy.headers.get("retry-after"), "1");
  assert.equal((await busy.json()).error.code, "server_busy");
  t.up.release();
  const { data } = await readSse(first);
  assert.equal(data.at(-1), "[DONE]");
  assert.equal(t.engine.stats().inFlight, 0);
});

// ---- Tool calls, response formats and logprobs (tests/fixtures/upstream_quirks.ts)

const WEATHER = '{"city":"Oslo"}';

function ask(
  t: Awaited<ReturnType<typeof setup>>,
  quirk: string,
  extra: Record<string, unknown> = {},
): Promise<Response> {
  return t.engine.chatCompletions({
    model: "tiny-chat",
    messages: [{ role: "user", content: quirk }],
    ...extra,
  }, signal());
}

type Chunk = {
  id: string;
  object: string;
  choices: {
    index: number;
    delta: Record<string, unknown> & { tool_calls?: ToolDelta[] };
    logprobs: unknown;
    finish_reason: string | null;
  }[];
  usage?: unknown;
};
type ToolDelta = {
  index: number;
  id?: string;
  type?: string;
  function: { name?: string; arguments: string };
};

async function chunksOf(res: Response) {
  assert.equal(res.status, 200);
  const { data, comments } = await readSse(res);
  assert.equal(data.at(-1), "[DONE]");
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d) as Chunk);
  assert.ok(chunks.every((c) => c.object === "chat.completion.chunk"));
  assert.equal(new Set(chunks.map((c) => c.id)).size, 1, "one id");
  const last = chunks.at(-1)!;
  assert.deepEqual(last.choices, [], "the usage chunk comes last");
  assert.ok(last.usage);
  const choices = chunks.slice(0, -1).map((c) => {
    assert.equal(c.choices.length, 1);
    return c.choices[0]!;
  });
  return { choices, comments };
}

/**
 * Asserts the stream's tool calls are exact: the first delta of each call
 * has index, id, type and name (and nothing repeats them later), the
 * argument pieces concatenate to valid JSON, one finish reason ends it.
 */
function assertToolStream(
  choices: Awaited<ReturnType<typeof chunksOf>>["choices"],
  calls: { id?: string | RegExp; name: string; arguments: string }[],
  finish: string,
): void {
  const roles = choices.filter((c) => "role" in c.delta);
  assert.equal(roles.length, 1, "role is sent once");
  assert.equal(roles[0], choices[0]);
  assert.equal(choices[0]!.delta.role, "assistant");
  const reasons = choices.filter((c) => c.finish_reason !== null);
  assert.deepEqual(reasons.map((c) => c.finish_reason), [finish]);
  assert.equal(reasons[0], choices.at(-1), "the finish reason ends it");
  const deltas = choices.flatMap((c) => c.delta.tool_calls ?? []);
  const ids = new Set<string>();
  calls.forEach((want, i) => {
    const mine = deltas.filter((d) => d.index === i);
    const [first, ...rest] = mine;
    assert.ok(first, `call ${i} is streamed`);
    assert.deepEqual(Object.keys(first).sort(), [
      "function",
      "id",
      "index",
      "type",
    ]);
    assert.equal(first.type, "function");
    assert.equal(first.function.name, want.name);
    if (want.id instanceof RegExp) assert.match(first.id!, want.id);
    else if (want.id) assert.equal(first.id, want.id);
    ids.add(first.id!);
    for (const d of rest) {
      assert.deepEqual(Object.keys(d).sort(), ["function", "index"]);
      assert.deepEqual(Object.keys(d.function), ["arguments"]);
    }
    const args = mine.map((d) => d.function.arguments).join("");
    assert.equal(args, want.arguments);
    JSON.parse(args);
  });
  assert.equal(ids.size, calls.length, "each call has its own id");
  assert.equal(
    deltas.length,
    deltas.filter((d) => d.index < calls.length).length,
  );
}

Deno.test("openai engine forwards tools, tool_choice, parallel_tool_calls, response_format and logprobs unchanged", async () => {
  await using t = await setup();
  const fields = {
    tools: [{
      type: "function",
      function: {
        name: "get_weather",
        description: "Weather of a city",
        parameters: {
          type: "object",
          properties: { city: { type: "string" } },
          required: ["city"],
        },
        strict: true,
      },
    }],
    tool_choice: { type: "function", function: { name: "get_weather" } },
    parallel_tool_calls: false,
    response_format: {
      type: "json_schema",
      json_schema: { name: "w", schema: { type: "object" }, strict: true },
    },
    logprobs: true,
    top_logprobs: 2,
  };
  for (const stream of [false, true]) {
    const res = await ask(t, "exo-v1", { ...fields, stream });
    await res.body?.cancel();
    const sent = t.up.requests.at(-1)!;
    for (const [k, v] of Object.entries(fields)) {
      assert.deepEqual(sent[k], v, `${k} (stream: ${stream})`);
    }
  }
});

Deno.test("openai engine: Exo 1.x tool calls and logprobs come out exact (non-stream)", async () => {
  await using t = await setup();
  const res = await ask(t, "exo-v1", { logprobs: true });
  assert.equal(res.headers.get("x-orchard-logprobs"), null);
  const body = await res.json();
  assert.deepEqual(body.choices, [{
    index: 0,
    logprobs: {
      content: [{
        token: "Hi",
        logprob: -0.25,
        bytes: [72, 105],
        top_logprobs: [],
      }],
      refusal: null,
    },
    finish_reason: "tool_calls",
    message: {
      role: "assistant",
      content: null,
      tool_calls: [{
        id: "5f0c9f6e-2d7e-4f7e-9a55-0e3d1c8b7a21",
        type: "function",
        function: { name: "get_weather", arguments: WEATHER },
      }],
    },
  }]);
  const plain = await (await ask(t, "exo-v1")).json();
  assert.equal(plain.choices[0].logprobs, null, "not asked: null");
});

Deno.test("openai engine: object arguments, missing ids and 'stop' after tool calls are repaired (non-stream)", async () => {
  await using t = await setup();
  for (const quirk of ["exo-2025", "mlx-2025", "name-every-delta"]) {
    const body = await (await ask(t, quirk)).json();
    const [choice] = body.choices;
    assert.equal(choice.finish_reason, "tool_calls", quirk);
    assert.equal(choice.logprobs, null, quirk);
    const [call] = choice.message.tool_calls;
    assert.deepEqual(Object.keys(call).sort(), ["function", "id", "type"]);
    assert.match(call.id, /^call_[0-9a-f]{24}$/, quirk);
    assert.deepEqual(call.function, {
      name: "get_weather",
      arguments: WEATHER,
    });
  }
  const mlx = await (await ask(t, "mlx-2025")).json();
  assert.equal(mlx.choices[0].message.content, "Checking.");
});

Deno.test("openai engine passes logprobs the upstream cannot give as null, and says so", async () => {
  await using t = await setup();
  const res = await ask(t, "mlx-2025", { logprobs: true });
  assert.equal(res.headers.get("x-orchard-logprobs"), "missing");
  assert.equal((await res.json()).choices[0].logprobs, null);
  const s = await chunksOf(
    await ask(t, "mlx-2025", { logprobs: true, stream: true }),
  );
  assert.ok(s.choices.every((c) => c.logprobs === null));
  assert.ok(s.comments.some((c) => c.includes("logprobs requested")));
});

Deno.test("openai engine: Exo 1.x streams a whole tool call in one exact delta", async () => {
  await using t = await setup();
  const { choices, comments } = await chunksOf(
    await ask(t, "exo-v1", { stream: true, logprobs: true, top_logprobs: 1 }),
  );
  assertToolStream(choices, [{
    id: "5f0c9f6e-2d7e-4f7e-9a55-0e3d1c8b7a21",
    name: "get_weather",
    arguments: WEATHER,
  }], "tool_calls");
  assert.deepEqual(choices[0]!.logprobs, {
    content: [{
      token: "Hi",
      logprob: -0.25,
      bytes: [72, 105],
      top_logprobs: [{ token: "Hi", logprob: -0.25, bytes: [72, 105] }],
    }],
    refusal: null,
  });
  assert.deepEqual(choices[0]!.delta, { role: "assistant", content: "Hi" });
  assert.ok(!comments.some((c) => c.includes("logprobs")));
});

Deno.test("openai engine: Exo 2025's object arguments and 'stop' become exact tool-call deltas", async () => {
  await using t = await setup();
  const { choices } = await chunksOf(
    await ask(t, "exo-2025", { stream: true }),
  );
  assertToolStream(choices, [{
    id: /^call_/,
    name: "get_weather",
    arguments: WEATHER,
  }], "tool_calls");
});

Deno.test("openai engine: mlx_lm.server's index-less calls get indexes and ids, role once", async () => {
  await using t = await setup();
  const { choices } = await chunksOf(
    await ask(t, "mlx-2025", { stream: true }),
  );
  assertToolStream(choices, [
    { id: /^call_/, name: "get_weather", arguments: WEATHER },
    { id: /^call_/, name: "get_time", arguments: '{"tz":"CET"}' },
  ], "tool_calls");
  assert.ok(
    choices.every((c) =>
      !("tool_calls" in c.delta) ||
      (c.delta.tool_calls?.length ?? 0) > 0
    ),
    "no empty tool_calls arrays",
  );
});

Deno.test("openai engine: a name repeated in every delta goes out once, and a stream without a finish reason gets one", async () => {
  await using t = await setup();
  const { choices, comments } = await chunksOf(
    await ask(t, "name-every-delta", { stream: true }),
  );
  assertToolStream(choices, [{
    id: "call_rep1",
    name: "get_weather",
    arguments: WEATHER,
  }], "tool_calls");
  assert.deepEqual(choices.at(-1)!.delta, {});
  assert.ok(comments.some((c) => c.includes("usage estimated")));
});

Deno.test("openai engine infers 'length' when the completion reached max_tokens and the upstream gave no finish reason", async () => {
  await using t = await setup();
  for (const [max, want] of [[4, "length"], [10, "stop"]] as const) {
    const { choices } = await chunksOf(
      await ask(t, "cut-no-finish", { stream: true, max_tokens: max }),
    );
    assert.equal(
      choices.map((c) => c.delta.content ?? "").join(""),
      "one two three four",
    );
    assert.deepEqual(choices.map((c) => c.finish_reason), [
      null,
      null,
      null,
      null,
      want,
    ]);
    const body = await (await ask(t, "cut-no-finish", { max_tokens: max }))
      .json();
    assert.equal(body.choices[0].finish_reason, want);
  }
});
