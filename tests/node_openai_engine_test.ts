import assert from "node:assert/strict";
import { join } from "node:path";
import {
  createOpenAIEngine,
  type OpenAIEngineOptions,
} from "../node/engines/openai.ts";
import { parseSSE } from "../lib/sse.ts";
import { readSse, startFakeUpstream, until } from "./_fleet.ts";
import {
  writeHubSnapshot,
  writeTokenizerFixture,
} from "./fixtures/tokenizer.ts";

const signal = () => new AbortController().signal;

/** No tokenizer anywhere unless a test lays one out. */
const NO_TOKENIZERS = { dirs: [], hubCache: null };

async function setup(
  opts: Partial<OpenAIEngineOptions> & {
    upstream?: ReturnType<typeof startFakeUpstream>;
  } = {},
) {
  const up = opts.upstream ?? startFakeUpstream();
  const engine = createOpenAIEngine({
    upstreamUrl: up.url,
    tokenizerSearch: NO_TOKENIZERS,
    ...opts,
  });
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

Deno.test("openai engine serves only models that answer a probe, and reports a listed one that does not as not servable", async () => {
  await using t = await setup({ probeBackoff: { now: () => 0 } });
  const models = await t.engine.models();
  assert.deepEqual(models, [
    { id: "tiny-chat", loaded: true, kind: "chat" },
    { id: "nomic-embed", loaded: true, kind: "embedding" },
    { id: "ghost-model", loaded: false, kind: "chat", servable: false },
  ]);
  assert.equal(t.engine.stats().healthy, true);
  const ghost = await t.engine.chatCompletions({
    model: "ghost-model",
    messages: [{ role: "user", content: "hi" }],
  }, signal());
  assert.equal(ghost.status, 503);
  assert.equal(ghost.headers.get("retry-after"), "30");
  const err = (await ghost.json()).error;
  assert.equal(err.code, "model_unavailable");
  assert.equal(err.type, "server_error");
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

Deno.test("openai engine reuses its upstream connection across streams: one TCP connection for 10 sequential streams, even when the body's end comes after [DONE]", async () => {
  await using t = await setup();
  for (let i = 0; i < 10; i++) {
    const res = await t.engine.chatCompletions({
      model: "tiny-chat",
      stream: true,
      messages: [{ role: "user", content: "late-end" }],
    }, signal());
    const { data } = await readSse(res);
    assert.equal(data.at(-1), "[DONE]");
    // The next request comes once the body's end has come (here, 20 ms).
    await new Promise((r) => setTimeout(r, 40));
  }
  // The upstream body's end is read after its [DONE], so the client keeps the
  // connection; cancelling the body first closed it each time.
  assert.equal(t.up.peers.size, 1);
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

  const unknown = await t.engine.chatCompletions({
    model: "no-such-model",
    messages: [],
  }, signal());
  assert.equal(unknown.status, 404);
  assert.equal((await unknown.json()).error.code, "model_not_found");
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
  // "Say hello": two words; "Hello world" in two chunks
  assert.deepEqual(last.usage, {
    prompt_tokens: 2,
    completion_tokens: 2,
    total_tokens: 4,
    orchard_usage: "estimated",
  });
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

// ---- In front of Exo: probing with backoff, real finish reasons, usage it does not report

/** A clock the engine's probe backoff reads; `advance` moves it. */
function fakeClock() {
  let t = 1_000_000;
  return { now: () => t, advance: (ms: number) => void (t += ms) };
}

/** Waits until the engine has run `n` whole refreshes from now. */
async function refreshes(
  t: Awaited<ReturnType<typeof setup>>,
  n = 1,
): Promise<void> {
  const from = t.up.listings;
  // refresh k+1 starts only after refresh k ended: n+1 listings = n whole refreshes
  await until("engine refreshes", () => t.up.listings >= from + n + 1);
}

const ghostProbes = (t: Awaited<ReturnType<typeof setup>>) =>
  t.up.probes.filter((m) => m === "ghost-model").length;

Deno.test("openai engine probes an unservable model once, then after 30 s, 1 min, 2 min … up to 10 min", async () => {
  const clock = fakeClock();
  await using t = await setup({
    refreshMs: 5,
    probeBackoff: { now: clock.now },
  });
  assert.equal(ghostProbes(t), 1, "probed at start");
  await refreshes(t, 3);
  assert.equal(ghostProbes(t), 1, "not again within 30 s (created changes)");
  let probes = 1;
  for (const waitS of [30, 60, 120, 240, 480, 600, 600]) {
    clock.advance(waitS * 1000 - 1);
    await refreshes(t, 2);
    assert.equal(ghostProbes(t), probes, `not before ${waitS} s`);
    clock.advance(1);
    await refreshes(t);
    assert.equal(ghostProbes(t), ++probes, `probed after ${waitS} s`);
  }
  const [, , ghost] = await t.engine.models();
  assert.deepEqual(ghost, {
    id: "ghost-model",
    loaded: false,
    kind: "chat",
    servable: false,
  });
  const res = await t.engine.chatCompletions({
    model: "ghost-model",
    messages: [{ role: "user", content: "hi" }],
  }, signal());
  assert.equal(res.status, 503);
  assert.equal(res.headers.get("retry-after"), "600");
  await res.body?.cancel();
});

Deno.test("openai engine probes an unservable model again at once when its listing changes, and serves it once it answers", async () => {
  const clock = fakeClock();
  await using t = await setup({
    refreshMs: 5,
    probeBackoff: { now: clock.now },
  });
  assert.equal(ghostProbes(t), 1);
  // Exo's entry says something new (e.g. the download finished)
  t.up.listing["ghost-model"] = { storage_size_megabytes: 512 };
  await refreshes(t);
  assert.equal(ghostProbes(t), 2, "probed at once");
  await refreshes(t, 2);
  assert.equal(ghostProbes(t), 2, "then backs off again");
  // it leaves the list and comes back
  t.up.models = ["tiny-chat", "nomic-embed"];
  await refreshes(t);
  assert.deepEqual((await t.engine.models()).map((m) => m.id), [
    "tiny-chat",
    "nomic-embed",
  ]);
  t.up.models = ["tiny-chat", "ghost-model", "nomic-embed"];
  await refreshes(t);
  assert.equal(ghostProbes(t), 3, "probed at once when listed again");
  // it becomes servable: found at its next probe, then never probed again
  t.up.unservable.clear();
  clock.advance(30_000);
  await refreshes(t);
  assert.equal(ghostProbes(t), 4);
  assert.deepEqual(
    (await t.engine.models()).find((m) => m.id === "ghost-model"),
    { id: "ghost-model", loaded: true, kind: "chat" },
  );
  clock.advance(3_600_000);
  await refreshes(t, 2);
  assert.equal(ghostProbes(t), 4);
  const ok = await t.engine.chatCompletions({
    model: "ghost-model",
    messages: [{ role: "user", content: "hi" }],
  }, signal());
  assert.equal(ok.status, 200);
  await ok.body?.cancel();
});

Deno.test("openai engine ends an Exo stream whose finish_reason stays null with 'length' at max_tokens, else 'stop' (and so without a stream)", async () => {
  await using t = await setup();
  const cases = [
    [{ max_tokens: 4 }, "length"],
    [{ max_completion_tokens: 4 }, "length"],
    [{ max_tokens: 10, max_completion_tokens: 4 }, "length"],
    [{ max_tokens: 10 }, "stop"],
    [{}, "stop"],
  ] as const;
  for (const [caps, want] of cases) {
    const { choices, comments } = await chunksOf(
      await ask(t, "exo-null-finish", { stream: true, ...caps }),
    );
    assert.equal(
      choices.map((c) => c.delta.content ?? "").join(""),
      "one two three four",
    );
    assert.deepEqual(
      choices.map((c) => c.finish_reason),
      [null, null, null, null, want],
      JSON.stringify(caps),
    );
    assert.deepEqual(choices.at(-1)!.delta, {});
    assert.ok(comments.some((c) => c.includes("usage estimated")));

    const res = await ask(t, "exo-null-finish", caps);
    assert.equal(res.headers.get("x-orchard-usage"), "estimated");
    const body = await res.json();
    assert.deepEqual(body.choices, [{
      index: 0,
      logprobs: null,
      finish_reason: want,
      message: { role: "assistant", content: "one two three four" },
    }], JSON.stringify(caps));
    assert.equal(body.object, "chat.completion");
    assert.equal(body.usage.completion_tokens, 4);
    assert.equal(body.usage.orchard_usage, "estimated");
  }
});

Deno.test("openai engine counts usage the upstream does not report with the model's tokenizer.json from the Hugging Face cache", async () => {
  const hub = await Deno.makeTempDir({ prefix: "orchard-hub-" });
  try {
    await writeHubSnapshot(hub, "tiny-chat");
    await using t = await setup({
      tokenizerSearch: { dirs: [], hubCache: hub },
    });
    // <|user|> exo - null - finish <|end|> <|assistant|>: 8 (estimated: 12)
    const want = {
      prompt_tokens: 8,
      completion_tokens: 4,
      total_tokens: 12,
      orchard_usage: "counted",
    };
    const res = await ask(t, "exo-null-finish", { max_tokens: 4 });
    assert.equal(res.headers.get("x-orchard-usage"), "counted");
    const body = await res.json();
    assert.deepEqual(body.usage, want);
    assert.equal(body.choices[0].finish_reason, "length");

    const { data, comments } = await readSse(
      await ask(t, "exo-null-finish", { stream: true, max_tokens: 5 }),
    );
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
    assert.equal(chunks.at(-2).choices[0].finish_reason, "stop");
    assert.deepEqual(chunks.at(-1).usage, want);
    assert.ok(comments.some((c) => c.includes("with the model's tokenizer")));

    // an upstream that reports usage keeps its own figures, unmarked
    const exo = await (await ask(t, "exo-v1")).json();
    assert.deepEqual(exo.usage, {
      prompt_tokens: 9,
      completion_tokens: 8,
      total_tokens: 17,
    });
  } finally {
    await Deno.remove(hub, { recursive: true });
  }
});

Deno.test("openai engine finds a tokenizer in Exo's model folder under the repo id its listing gives", async () => {
  const models = await Deno.makeTempDir({ prefix: "orchard-exo-models-" });
  try {
    await writeTokenizerFixture(join(models, "test-org--tiny-chat-4bit"));
    const up = startFakeUpstream();
    up.listing["tiny-chat"] = { hugging_face_id: "test-org/tiny-chat-4bit" };
    await using t = await setup({
      upstream: up,
      tokenizerSearch: { dirs: [models], hubCache: null },
    });
    const { data } = await readSse(
      await t.engine.completions({
        model: "tiny-chat",
        prompt: "hi hi",
        stream: true,
      }, signal()),
    );
    const usage = JSON.parse(data.at(-2)!).usage;
    // "Hello world": one unknown word-level token each
    assert.deepEqual(usage, {
      prompt_tokens: 2,
      completion_tokens: 2,
      total_tokens: 4,
      orchard_usage: "counted",
    });
  } finally {
    await Deno.remove(models, { recursive: true });
  }
});

Deno.test("openai engine takes its slots from llama-server's /props, else 16, and --slots wins", async () => {
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    (req) => {
      const path = new URL(req.url).pathname;
      if (path === "/props") return Response.json({ total_slots: 6 });
      if (path === "/v1/models") {
        return Response.json({ data: [{ id: "m", object: "model" }] });
      }
      return Response.json({
        choices: [{ index: 0, message: { role: "assistant", content: "k" } }],
      });
    },
  );
  const url = `http://127.0.0.1:${server.addr.port}`;
  const slotsOf = async (o: Partial<OpenAIEngineOptions>) => {
    const engine = createOpenAIEngine({
      upstreamUrl: url,
      tokenizerSearch: NO_TOKENIZERS,
      ...o,
    });
    await engine.start();
    const { slots } = engine.stats();
    await engine.close();
    return slots;
  };
  try {
    assert.equal(await slotsOf({}), 6, "what llama-server says");
    assert.equal(await slotsOf({ slots: 3 }), 3, "--slots wins");
  } finally {
    await server.shutdown();
  }
  await using w = await setup(); // Exo: no /props
  assert.equal(w.engine.stats().slots, 16);
});

/**
 * An upstream speaking as Python's `http.server` does (mlx_lm.server runs
 * on it): HTTP/1.0, JSON with a content-length, streams framed by the
 * connection's end, one connection per request. `release` lets a stream's
 * rest go after its first event.
 */
function startHttp10Upstream() {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  let release = Promise.withResolvers<void>();
  let connections = 0;
  const enc = new TextEncoder();
  const event = (content: string | null, finish: string | null) =>
    `data: ${
      JSON.stringify({
        id: "chatcmpl-10",
        object: "chat.completion.chunk",
        created: 1,
        model: "mlx-model",
        choices: [{
          index: 0,
          delta: content === null ? {} : { content },
          finish_reason: finish,
        }],
      })
    }\n\n`;
  const serve = async (conn: Deno.Conn) => {
    connections++;
    const buf = new Uint8Array(65536);
    let text = "";
    try {
      // The head, then the body by its content-length.
      for (;;) {
        const n = await conn.read(buf);
        if (n === null) return;
        text += new TextDecoder().decode(buf.subarray(0, n));
        const end = text.indexOf("\r\n\r\n");
        if (end < 0) continue;
        const len = Number(/content-length: (\d+)/i.exec(text)?.[1] ?? 0);
        if (text.length - end - 4 >= len) break;
      }
      const [line] = text.split("\r\n");
      const body = text.slice(text.indexOf("\r\n\r\n") + 4);
      const write = (s: string) => conn.write(enc.encode(s));
      if (line!.startsWith("GET /v1/models")) {
        const json = JSON.stringify({
          object: "list",
          data: [{ id: "mlx-model", object: "model" }],
        });
        await write(
          `HTTP/1.0 200 OK\r\nServer: BaseHTTP/0.6 Python/3.12\r\nContent-Type: application/json\r\nContent-Length: ${json.length}\r\n\r\n${json}`,
        );
      } else if (JSON.parse(body).stream === true) {
        await write(
          "HTTP/1.0 200 OK\r\nServer: BaseHTTP/0.6 Python/3.12\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n",
        );
        await write(event("Hello", null));
        await release.promise;
        release = Promise.withResolvers<void>();
        await write(event(" world", null) + event(null, "stop"));
        await write("data: [DONE]\n\n");
      } else {
        const json = JSON.stringify({
          id: "chatcmpl-10",
          object: "chat.completion",
          created: 1,
          model: "mlx-model",
          choices: [{
            index: 0,
            message: { role: "assistant", content: "pong" },
            finish_reason: "stop",
          }],
          usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
        });
        await write(
          `HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${json.length}\r\n\r\n${json}`,
        );
      }
    } catch {
      /* the client went away */
    } finally {
      conn.close();
    }
  };
  (async () => {
    for await (const conn of listener) serve(conn);
  })().catch(() => {});
  return {
    url: `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`,
    get connections() {
      return connections;
    },
    release: () => release.resolve(),
    close: () => listener.close(),
  };
}

Deno.test("openai engine fronts an HTTP/1.0 server that frames streams by closing the connection (Python's http.server, as mlx_lm.server runs it): text arrives as it is sent", async () => {
  const up = startHttp10Upstream();
  const engine = createOpenAIEngine({
    upstreamUrl: up.url,
    tokenizerSearch: NO_TOKENIZERS,
  });
  try {
    await engine.start();
    assert.deepEqual(await engine.models(), [
      { id: "mlx-model", loaded: true, kind: "chat" },
    ]);
    const res = await engine.chatCompletions({
      model: "mlx-model",
      stream: true,
      messages: [{ role: "user", content: "hi" }],
    }, signal());
    assert.equal(res.status, 200);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    // The first event comes while the upstream holds the rest back.
    let text = "";
    while (!text.includes("Hello")) {
      const r = await reader.read();
      assert.ok(!r.done, "the stream ended before its first event");
      text += r.value;
    }
    assert.ok(!text.includes("world"));
    up.release();
    for (;;) {
      const r = await reader.read();
      if (r.done) break;
      text += r.value;
    }
    const data = parseSSE(text).map((e) => e.data);
    assert.equal(data.at(-1), "[DONE]");
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
    assert.equal(
      chunks.map((c) => c.choices[0]?.delta?.content ?? "").join(""),
      "Hello world",
    );
    assert.equal(chunks.at(-2).choices[0].finish_reason, "stop");
    assert.deepEqual(chunks.at(-1).choices, []);
    assert.equal(chunks.at(-1).usage.orchard_usage, "estimated");
    // Non-stream on the same upstream; each request had its own connection.
    const before = up.connections;
    const json = await engine.chatCompletions({
      model: "mlx-model",
      messages: [{ role: "user", content: "ping" }],
    }, signal());
    assert.equal(json.status, 200);
    const body = await json.json();
    assert.equal(body.choices[0].message.content, "pong");
    assert.equal(body.usage.total_tokens, 4);
    assert.equal(up.connections, before + 1);
  } finally {
    await engine.close();
    up.close();
  }
});
