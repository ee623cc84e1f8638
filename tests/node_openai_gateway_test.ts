/**
 * In front of Exo, end to end: a real gateway (served on loopback) and a
 * node worker with the `openai` engine in front of the scripted Exo-like
 * upstream. What the engine makes of Exo's quirks reaches the client in
 * exact OpenAI shapes: real finish reasons, usage counted with the model's
 * tokenizer (or estimated) and marked so in an `x-orchard-usage` header,
 * the usage object and the usage record, and a listed model Exo cannot
 * serve answered 503 `model_unavailable` rather than routed or 404.
 */
import assert from "node:assert/strict";
import { silentLogger } from "../lib/log.ts";
import { createOpenAIEngine } from "../node/engines/openai.ts";
import { startNodeWorker } from "../node/worker.ts";
import { listUsageRecords } from "../store/usage.ts";
import { readSse, startFakeUpstream, until } from "./_fleet.ts";
import { api, createWorld } from "./_helpers.ts";
import { writeHubSnapshot } from "./fixtures/tokenizer.ts";

async function rig() {
  const w = await createWorld({
    gateway: { logger: silentLogger },
    fleetRefreshMs: 50,
  });
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    w.app.fetch,
  );
  const url = `http://127.0.0.1:${server.addr.port}`;
  // "tiny-chat" has its tokenizer in the hub cache; "plain-chat" has none
  const up = startFakeUpstream({
    models: ["tiny-chat", "plain-chat", "ghost-model"],
  });
  const hub = await Deno.makeTempDir({ prefix: "orchard-hub-" });
  await writeHubSnapshot(hub, "tiny-chat");
  const state = await Deno.makeTempDir({ prefix: "orchard-node-" });
  const p = w.tokens.platform;
  const join = await (await api(w, "POST", "/join-tokens", p, {})).json();
  const key = await (await api(w, "POST", `/tenants/${w.tenantA.id}/keys`, p, {
    name: "exo",
  })).json();
  const node = await startNodeWorker({
    gatewayUrl: url,
    joinToken: join.token,
    engineInstance: createOpenAIEngine({
      upstreamUrl: up.url,
      tokenizerSearch: { dirs: [], hubCache: hub },
    }),
    port: 0,
    host: "127.0.0.1",
    stateDir: state,
    heartbeatMs: 60,
    linktest: null,
  });
  const fleet = w.orchard.fleet;
  await until("routable", async () => {
    await fleet.refresh();
    return fleet.candidates("plain-chat").length === 1;
  });
  const post = (path: string, body: unknown) =>
    fetch(`${url}${path}`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${key.key}`,
        "content-type": "application/json",
      },
      body: JSON.stringify(body),
    });
  const get = (path: string) =>
    fetch(`${url}${path}`, { headers: { authorization: `Bearer ${key.key}` } });
  return {
    w,
    up,
    post,
    get,
    async lastRecord() {
      await w.orchard.gateway.idle();
      return (await listUsageRecords(w.store, w.tenantA.id, { limit: 1 }))
        .items[0]!;
    },
    async [Symbol.asyncDispose]() {
      await node.close();
      await server.shutdown();
      await up.close();
      await w.close();
      await Deno.remove(hub, { recursive: true });
      await Deno.remove(state, { recursive: true });
    },
  };
}

const exo = (model: string, extra: Record<string, unknown> = {}) => ({
  model,
  messages: [{ role: "user", content: "exo-null-finish" }],
  ...extra,
});

Deno.test("through gateway and node: Exo's reply cut by max_tokens without usage or finish reason comes out 'length', with tokenizer-counted usage marked 'counted'", async () => {
  await using r = await rig();
  const res = await r.post(
    "/v1/chat/completions",
    exo("tiny-chat", {
      max_tokens: 4,
    }),
  );
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("x-orchard-usage"), "counted");
  const body = await res.json();
  assert.deepEqual(body.choices, [{
    index: 0,
    logprobs: null,
    finish_reason: "length",
    message: { role: "assistant", content: "one two three four" },
  }]);
  // <|user|> exo - null - finish <|end|> <|assistant|>
  assert.deepEqual(body.usage, {
    prompt_tokens: 8,
    completion_tokens: 4,
    total_tokens: 12,
    orchard_usage: "counted",
  });
  const rec = await r.lastRecord();
  assert.equal(rec.usageBasis, "counted");
  assert.equal(rec.promptTokens, 8);
  assert.equal(rec.completionTokens, 4);

  const s = await r.post(
    "/v1/chat/completions",
    exo("tiny-chat", {
      stream: true,
      stream_options: { include_usage: true },
      max_completion_tokens: 6,
    }),
  );
  const { data, comments } = await readSse(s);
  assert.equal(data.at(-1), "[DONE]");
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
  assert.deepEqual(
    chunks.slice(0, -1).map((c) => c.choices[0].finish_reason),
    [null, null, null, null, "stop"],
  );
  assert.deepEqual(chunks.at(-1).choices, []);
  assert.deepEqual(chunks.at(-1).usage, {
    prompt_tokens: 8,
    completion_tokens: 4,
    total_tokens: 12,
    orchard_usage: "counted",
  });
  assert.ok(comments.includes(": x-orchard-usage: counted"));
  assert.equal((await r.lastRecord()).usageBasis, "counted");
});

Deno.test("through gateway and node: a model without a tokenizer gets estimated usage, marked 'estimated' in the header, usage object and record", async () => {
  await using r = await rig();
  const res = await r.post("/v1/chat/completions", exo("plain-chat"));
  assert.equal(res.headers.get("x-orchard-usage"), "estimated");
  const body = await res.json();
  assert.equal(body.choices[0].finish_reason, "stop");
  // 3 + 4 per message + "exo-null-finish" (5 pieces)
  assert.deepEqual(body.usage, {
    prompt_tokens: 12,
    completion_tokens: 4,
    total_tokens: 16,
    orchard_usage: "estimated",
  });
  assert.equal((await r.lastRecord()).usageBasis, "estimated");

  // a stream without include_usage still says so, in a comment
  const { data, comments } = await readSse(
    await r.post(
      "/v1/chat/completions",
      exo("plain-chat", { stream: true, max_tokens: 4 }),
    ),
  );
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
  assert.equal(chunks.at(-1).choices[0].finish_reason, "length");
  assert.ok(chunks.every((c) => !("usage" in c)));
  assert.ok(comments.includes(": x-orchard-usage: estimated"));

  // an engine that reports usage: no marker anywhere
  const plain = await r.post("/v1/chat/completions", {
    model: "plain-chat",
    messages: [{ role: "user", content: "hi" }],
  });
  assert.equal(plain.headers.get("x-orchard-usage"), null);
  assert.deepEqual((await plain.json()).usage, {
    prompt_tokens: 5,
    completion_tokens: 2,
    total_tokens: 7,
  });
  assert.equal((await r.lastRecord()).usageBasis, undefined);
});

Deno.test("through gateway and node: a model Exo lists but cannot serve is answered 503 model_unavailable, never routed, and not in /v1/models", async () => {
  await using r = await rig();
  const probes = r.up.probes.length;
  const res = await r.post("/v1/chat/completions", {
    model: "ghost-model",
    messages: [{ role: "user", content: "hi" }],
  });
  assert.equal(res.status, 503);
  assert.ok(res.headers.get("retry-after"));
  const err = (await res.json()).error;
  assert.equal(err.code, "model_unavailable");
  assert.equal(err.type, "server_error");
  assert.equal(r.up.probes.length, probes, "no request reached the upstream");

  const unknown = await r.post("/v1/chat/completions", {
    model: "no-such-model",
    messages: [{ role: "user", content: "hi" }],
  });
  assert.equal(unknown.status, 404);
  await unknown.body?.cancel();

  const list = await r.get("/v1/models");
  assert.deepEqual(
    (await list.json()).data.map((m: { id: string }) => m.id),
    ["plain-chat", "tiny-chat"],
  );
  const [node] = r.w.orchard.fleet.nodes();
  assert.deepEqual(
    node!.models.find((m) => m.id === "ghost-model"),
    { id: "ghost-model", loaded: false, kind: "chat", servable: false },
  );
});
