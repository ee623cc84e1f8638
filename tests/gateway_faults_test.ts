/** Node failures, stalls and client disconnects. */
import assert from "node:assert/strict";
import {
  createWorld,
  MODELS,
  pinnedTo,
  readSSE,
  scriptedUpstream,
} from "../gateway/_testing.ts";
import { listUsageRecords } from "../store/usage.ts";

const body = {
  model: "tiny-chat",
  messages: [{ role: "user", content: "Hi" }],
  stream: true,
  stream_options: { include_usage: true },
};
/** The same request, not streamed (stream_options goes with stream). */
const plain = { model: body.model, messages: body.messages, stream: false };
const words = Array.from({ length: 30 }, (_, i) => ` w${i}`);

async function lastRecord(w: Awaited<ReturnType<typeof createWorld>>) {
  await w.gw.idle();
  return (await listUsageRecords(w.store, w.tenant.id, { limit: 1 })).items[0]!;
}

Deno.test("a node killed before its first chunk is retried once on another node", async () => {
  const w = await createWorld({ script: { killAfter: 0 } });
  const good = scriptedUpstream({});
  w.fleet.add("node-b", good.url, MODELS);
  // A conversation the router sends to the failing node first.
  const first = pinnedTo("node-a", ["node-a", "node-b"], body);
  try {
    const s = await readSSE(await w.post("/v1/chat/completions", first));
    assert.equal(s.data.at(-1), "[DONE]");
    assert.equal(w.up.requests.length, 1);
    assert.equal(good.requests.length, 1);
    assert.equal((await lastRecord(w)).nodeId, "node-b");
  } finally {
    await w.close();
    await good.close();
  }
});

for (const after of [1, 10]) {
  Deno.test(`a node killed after ${after} chunks ends the stream with an error frame, no retry, usage billed`, async () => {
    const w = await createWorld({
      script: { killAfter: after, words, delayMs: 2 },
    });
    const other = scriptedUpstream({});
    w.fleet.add("node-b", other.url, MODELS);
    // A conversation the router sends to the failing node.
    const first = pinnedTo("node-a", ["node-a", "node-b"], body);
    try {
      const t0 = performance.now();
      const s = await readSSE(await w.post("/v1/chat/completions", first));
      assert.ok(performance.now() - t0 < 1000 + 2 * after + 200);
      const last = JSON.parse(s.data.at(-1)!);
      assert.equal(last.error.type, "server_error");
      const content = s.data.slice(0, -1).map((d) => JSON.parse(d)).filter((
        c,
      ) => c.choices?.[0]?.delta?.content);
      assert.equal(content.length, after);
      assert.equal(
        other.requests.length,
        0,
        "never retried after the first byte",
      );
      const r = await lastRecord(w);
      assert.equal(r.outcome, "error");
      assert.equal(r.completionTokens, after);
      assert.deepEqual(w.up.cancels, [], "a node that broke off has no work");
      assert.ok(r.promptTokens > 0);
    } finally {
      await w.close();
      await other.close();
    }
  });
}

Deno.test("a stalled node hits the idle timeout and the client gets an error frame", async () => {
  const w = await createWorld({
    script: { stallAfter: 2, words },
    gateway: { proxy: { idleTimeoutMs: 200 } },
  });
  try {
    const s = await readSSE(await w.post("/v1/chat/completions", body));
    assert.equal(JSON.parse(s.data.at(-1)!).error.code, "timeout");
    assert.equal((await lastRecord(w)).completionTokens, 2);
    // The node's request is closed, and it is told to stop by id.
    assert.equal(w.up.aborted, 1);
    assert.equal(w.up.cancels.length, 1);
  } finally {
    await w.close();
  }
});

Deno.test("a client that disconnects aborts the node request and is billed for what was generated", async () => {
  const w = await createWorld({ script: { words, delayMs: 20 } });
  try {
    const ac = new AbortController();
    const res = await w.post("/v1/chat/completions", body, {});
    const reader = res.body!.getReader();
    let got = "";
    while (!got.includes("w2")) {
      got += new TextDecoder().decode((await reader.read()).value);
    }
    await reader.cancel();
    ac.abort();
    const deadline = Date.now() + 2000;
    while (w.up.aborted === 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(w.up.aborted, 1, "the node request was aborted");
    const r = await lastRecord(w);
    assert.equal(r.outcome, "cancelled");
    assert.ok(
      r.completionTokens >= 3 && r.completionTokens < 30,
      `${r.completionTokens}`,
    );
  } finally {
    await w.close();
  }
});

Deno.test("a node answering 503 before the first byte is retried; a 400 is passed through", async () => {
  const w = await createWorld({ script: { status: 503 } });
  const good = scriptedUpstream({});
  w.fleet.add("node-b", good.url, MODELS);
  try {
    const r = await w.post("/v1/chat/completions", plain);
    assert.equal(r.status, 200);
    await r.body?.cancel();
    w.up.script = { status: 400 };
    good.script = { status: 400 };
    const r2 = await w.post("/v1/chat/completions", plain);
    assert.equal(r2.status, 400);
    assert.equal((await r2.json()).error.code, "scripted");
  } finally {
    await w.close();
    await good.close();
  }
});

Deno.test("when every slot is busy requests queue, then get 503 with retry-after at the deadline", async () => {
  const w = await createWorld({
    script: { words, delayMs: 8 },
    gateway: { router: { queueTimeoutMs: 100 } },
  });
  w.fleet.list[0]!.stats.slots = 1;
  try {
    const first = await w.post("/v1/chat/completions", body);
    const second = await w.post("/v1/chat/completions", plain);
    assert.equal(second.status, 503);
    assert.ok(second.headers.get("retry-after"));
    await second.body?.cancel();
    await first.text();
  } finally {
    await w.close();
  }
});
