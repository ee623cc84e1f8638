import assert from "node:assert/strict";
import { generateEd25519, importEd25519, signEdDSA } from "../lib/jwt.ts";
import { startNodeWorker } from "../node/worker.ts";
import {
  joinToken,
  readSse,
  startFakeUpstream,
  startGateway,
  until,
} from "./_fleet.ts";

async function world() {
  const gw = await startGateway();
  const up = startFakeUpstream();
  const dir = await Deno.makeTempDir({ prefix: "orchard-node-" });
  const node = await startNodeWorker({
    gatewayUrl: gw.url,
    joinToken: await joinToken(gw),
    engine: "openai",
    upstreamUrl: up.url,
    port: 0,
    host: "127.0.0.1",
    stateDir: dir,
    heartbeatMs: 60,
    linktest: null,
  });
  await until("healthy", async () => {
    await gw.fleet.refresh();
    return gw.fleet.candidates("tiny-chat").length === 1;
  });
  return {
    gw,
    up,
    node,
    state: async () => {
      await gw.fleet.refresh();
      return gw.fleet.nodes().find((n) => n.id === node.nodeId)?.state;
    },
    async [Symbol.asyncDispose]() {
      await node.close();
      await gw.close();
      await up.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

Deno.test("node answers its gateway and 401s everyone else in OpenAI shape", async () => {
  await using w = await world();
  const viaGateway = await w.gw.fleet.fetchNode(
    w.node.nodeId,
    "/v1/models",
    {},
  );
  assert.equal(viaGateway.status, 200);
  const models = await viaGateway.json();
  assert.deepEqual(models.data.map((m: { id: string }) => m.id).sort(), [
    "nomic-embed",
    "tiny-chat",
  ]);

  const anon = await fetch(`${w.node.url}/v1/models`);
  assert.equal(anon.status, 401);
  assert.deepEqual(await anon.json(), {
    error: {
      message: "This node only answers its gateway",
      type: "authentication_error",
      param: null,
      code: "invalid_api_key",
    },
  });
  const stranger = await importEd25519((await generateEd25519()).privateJwk);
  const forged = await signEdDSA(stranger, {}, {
    iss: "orchard-gateway",
    aud: w.node.nodeId,
    sub: "gateway",
    ttlSeconds: 60,
  });
  const wrongAud = await signEdDSA(w.gw.store.secrets.gatewayPrivateKey, {}, {
    iss: "orchard-gateway",
    aud: "some-other-node",
    sub: "gateway",
    ttlSeconds: 60,
  });
  for (const token of [forged, wrongAud]) {
    const res = await fetch(`${w.node.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${token}`,
        "content-type": "application/json",
      },
      body: JSON.stringify({ model: "tiny-chat", messages: [] }),
    });
    assert.equal(res.status, 401);
    await res.body?.cancel();
  }
  const health = await w.gw.fleet.fetchNode(w.node.nodeId, "/health", {});
  assert.equal((await health.json()).status, "ok");
});

Deno.test("node API rejects bad input, unknown models and oversized bodies in OpenAI shape", async () => {
  await using w = await world();
  const post = (body: string) =>
    w.gw.fleet.fetchNode(w.node.nodeId, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
  const bad = await post("{not json");
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.code, "invalid_json");
  const unknown = await post(JSON.stringify({ model: "nope", messages: [] }));
  assert.equal(unknown.status, 404);
  assert.equal((await unknown.json()).error.code, "model_not_found");
  const big = await post(
    JSON.stringify({ model: "tiny-chat", pad: "x".repeat(5 * 1024 * 1024) }),
  );
  assert.equal(big.status, 413);
  assert.equal((await big.json()).error.type, "invalid_request_error");
});

Deno.test("a node that misses 3 heartbeats (and 2 s) becomes unhealthy and gets no work", async () => {
  await using w = await world();
  assert.equal(await w.state(), "healthy");
  // Served models are built once per fleet read and shared, read only.
  const served = w.gw.fleet.servedModels();
  assert.deepEqual(served.map((m) => m.id), ["nomic-embed", "tiny-chat"]);
  assert.equal(w.gw.fleet.servedModels(), served);
  assert.ok(Object.isFrozen(served) && Object.isFrozen(served[0]));
  await w.node.close();
  await until("unhealthy", async () => (await w.state()) === "unhealthy", 5000);
  const view = w.gw.fleet.nodes()[0]!;
  assert.ok(Date.now() - Date.parse(view.lastHeartbeatAt!) > 3 * 60);
  assert.deepEqual(w.gw.fleet.candidates("tiny-chat"), []);
  assert.deepEqual(w.gw.fleet.servedModels(), []);
});

Deno.test("a drained node finishes its stream, refuses new work, reports drained, and undrains", async () => {
  await using w = await world();
  const stream = await w.gw.fleet.fetchNode(
    w.node.nodeId,
    "/v1/chat/completions",
    {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "tiny-chat",
        stream: true,
        messages: [{ role: "user", content: "hold" }],
      }),
    },
  );
  assert.equal(stream.status, 200);
  await w.up.held;

  const drained = await w.gw.admin("POST", `/nodes/${w.node.nodeId}/drain`);
  assert.equal(drained.status, 200);
  await until("draining", async () => (await w.state()) === "draining");
  assert.deepEqual(w.gw.fleet.candidates("tiny-chat"), []);
  await until("node refuses new work", async () => {
    const res = await w.gw.fleet.fetchNode(
      w.node.nodeId,
      "/v1/chat/completions",
      {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "tiny-chat", messages: [] }),
      },
    );
    const body = await res.json();
    return res.status === 503 && body.error.code === "node_draining" &&
      res.headers.get("retry-after");
  });

  w.up.release();
  const { data } = await readSse(stream);
  assert.equal(data.at(-1), "[DONE]");
  assert.deepEqual(JSON.parse(data.at(-2)!).choices, []);
  await until("drained", async () => (await w.state()) === "drained");
  const view = await (await w.gw.admin("GET", `/nodes/${w.node.nodeId}`))
    .json();
  assert.equal(view.state, "drained");
  assert.equal(view.status.drainState, "drained");

  assert.equal(
    (await w.gw.admin("POST", `/nodes/${w.node.nodeId}/undrain`)).status,
    200,
  );
  await until("healthy again", async () => (await w.state()) === "healthy");
  const ok = await w.gw.fleet.fetchNode(w.node.nodeId, "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "tiny-chat",
      messages: [{ role: "user", content: "hi" }],
    }),
  });
  assert.equal(ok.status, 200);
  assert.equal((await ok.json()).usage.total_tokens, 7);
});

Deno.test("nodes admin API is platform-admin only and audits drains", async () => {
  await using w = await world();
  for (
    const [m, p] of [
      ["GET", "/nodes"],
      ["POST", `/nodes/${w.node.nodeId}/drain`],
      ["POST", "/join-tokens"],
      ["GET", "/join-tokens"],
      ["GET", "/links"],
    ]
  ) {
    const res = await w.gw.admin(
      m!,
      p!,
      m === "POST" ? {} : undefined,
      "tenant",
    );
    assert.equal(res.status, 403, `${m} ${p}`);
  }
  await w.gw.admin("POST", `/nodes/${w.node.nodeId}/drain`);
  const actions: string[] = [];
  for await (
    const e of w.gw.kv.list<{ action: string }>({ prefix: ["audit"] })
  ) {
    actions.push(e.value.action);
  }
  assert.deepEqual(actions, ["join_token.create", "node.enroll", "node.drain"]);
});
