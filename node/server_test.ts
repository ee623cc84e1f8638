import assert from "node:assert/strict";
import { type Engine, StreamWatch, watchedResponse } from "./engine.ts";
import { createNodeApp, DrainState } from "./server.ts";

const enc = new TextEncoder();

/**
 * An engine whose chat answers are streams it feeds by hand: watched
 * (engine.ts StreamWatch, as the openai engine's) or plain (read through
 * the server's wrapper).
 */
function handEngine(watched: boolean) {
  const calls: {
    ctl: ReadableStreamDefaultController<Uint8Array>;
    signal: AbortSignal;
    watch: StreamWatch;
  }[] = [];
  const engine = {
    kind: "openai",
    chatCompletions(_body, signal) {
      const watch = new StreamWatch();
      const body = new ReadableStream<Uint8Array>({
        start(ctl) {
          calls.push({ ctl, signal, watch });
        },
        cancel() {
          watch.cancelled();
          watch.done();
        },
      });
      const res = new Response(body, {
        headers: { "content-type": "text/event-stream" },
      });
      return Promise.resolve(watched ? watchedResponse(res, watch) : res);
    },
  } as Partial<Engine> as Engine;
  return { engine, calls };
}

function app(engine: Engine) {
  const drain = new DrainState();
  const node = createNodeApp({
    engine,
    drain,
    verifier: { verify: () => Promise.resolve(true) },
  });
  const chat = () =>
    node.fetch(
      new Request("http://node/v1/chat/completions", {
        method: "POST",
        headers: {
          authorization: "Bearer gateway",
          "content-type": "application/json",
        },
        body: JSON.stringify({ model: "m", stream: true }),
      }),
    );
  return { drain, chat };
}

for (const watched of [true, false]) {
  const how = watched ? "a watched stream" : "a plain stream";

  Deno.test(`node server: ${how} counts as in progress until its end, and its body comes through whole`, async () => {
    const { engine, calls } = handEngine(watched);
    const { drain, chat } = app(engine);
    const res = await chat();
    assert.equal(res.status, 200);
    assert.equal(drain.active, 1);
    const { ctl, watch } = calls[0]!;
    ctl.enqueue(enc.encode("data: one\n\n"));
    watch.first();
    ctl.enqueue(enc.encode("data: [DONE]\n\n"));
    ctl.close();
    watch.done();
    assert.equal(await res.text(), "data: one\n\ndata: [DONE]\n\n");
    assert.equal(drain.active, 0);
    // A drain asked now finds nothing left.
    drain.set(true);
    assert.equal(drain.state, "drained");
  });

  Deno.test(`node server: ${how} cancelled by its reader aborts the engine's work and ends`, async () => {
    const { engine, calls } = handEngine(watched);
    const { drain, chat } = app(engine);
    const res = await chat();
    const { ctl, signal } = calls[0]!;
    ctl.enqueue(enc.encode("data: one\n\n"));
    const reader = res.body!.getReader();
    assert.equal(
      new TextDecoder().decode((await reader.read()).value),
      "data: one\n\n",
    );
    assert.equal(signal.aborted, false);
    await reader.cancel();
    assert.equal(signal.aborted, true);
    assert.equal(drain.active, 0);
  });
}

Deno.test("node server: a watch replays what happened before the server attached", () => {
  const watch = new StreamWatch();
  watch.first();
  watch.done();
  watch.cancelled(); // after its end: not a cancellation
  const seen: string[] = [];
  watch.attach({
    first: () => seen.push("first"),
    cancelled: () => seen.push("cancelled"),
    done: () => seen.push("done"),
  });
  assert.deepEqual(seen, ["first", "done"]);
});
