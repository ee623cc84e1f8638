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
