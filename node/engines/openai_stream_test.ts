import assert from "node:assert/strict";
import { OpenAIError } from "../../protocol/openai/errors.ts";
import { parseSSE } from "../../lib/sse.ts";
import { normaliseStream } from "./openai_stream.ts";
import type { Usage } from "./openai_shapes.ts";
import { ESTIMATOR } from "./tokens.ts";

const enc = new TextEncoder();

function normalised(upstream: ReadableStream<Uint8Array>) {
  const ended: { usage: Usage | null; error: OpenAIError | null }[] = [];
  const out = normaliseStream(
    upstream,
    {
      kind: "chat",
      model: "m",
      request: { model: "m", messages: [{ role: "user", content: "hi" }] },
      asked: { maxTokens: null, logprobs: false },
      counter: () => Promise.resolve(ESTIMATOR),
    },
    {
      onTokens() {},
      onEnd: (usage, error) => ended.push({ usage, error }),
    },
  );
  return { out, ended };
}

Deno.test("normaliseStream() reads CRLF streams split anywhere", async () => {
  const chunk = JSON.stringify({
    id: "c1",
    object: "chat.completion.chunk",
    created: 1,
    model: "m",
    choices: [{ index: 0, delta: { content: "Hé" }, finish_reason: "stop" }],
    usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
  });
  const bytes = enc.encode(
    `: hi\r\ndata: ${chunk}\r\n\r\ndata: [DONE]\r\n\r\n`,
  );
  const pieces = Array.from(
    { length: Math.ceil(bytes.length / 7) },
    (_, i) => bytes.subarray(i * 7, i * 7 + 7),
  );
  const { out, ended } = normalised(ReadableStream.from(pieces));
  const events = parseSSE(await new Response(out).text()).map((e) => e.data);
  assert.equal(events.at(-1), "[DONE]");
  assert.equal(JSON.parse(events[0]!).choices[0].delta.content, "Hé");
  assert.deepEqual(ended[0]?.usage?.total_tokens, 2);
  assert.equal(ended[0]?.error, null);
});

Deno.test("normaliseStream() refuses an engine line over 1 MiB without buffering the rest", async () => {
  let pulled = 0;
  let cancelled = false;
  const endless = new ReadableStream<Uint8Array>({
    pull(c) {
      c.enqueue(enc.encode(pulled++ === 0 ? "data: " : "x".repeat(64 * 1024)));
    },
    cancel() {
      cancelled = true;
    },
  }, { highWaterMark: 0 });
  const { out, ended } = normalised(endless);
  const events = parseSSE(await new Response(out).text()).map((e) => e.data);
  assert.equal(events.at(-1), "[DONE]");
  const err = JSON.parse(events.at(-2)!).error;
  assert.equal(err.code, "upstream_error");
  assert.equal(err.message, "The engine sent an over-long line");
  assert.ok(pulled <= 18, `read ${pulled} chunks of 64 KiB`);
  assert.ok(cancelled, "the engine's stream is released");
  assert.equal(ended[0]?.error?.status, 502);
});
