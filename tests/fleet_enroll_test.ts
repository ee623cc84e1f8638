import assert from "node:assert/strict";
import { k } from "../store/kv_keys.ts";
import type { JoinToken } from "../store/join_tokens.ts";
import { startNodeWorker } from "../node/worker.ts";
import { generateEd25519, importEd25519 } from "../lib/jwt.ts";
import { sendHeartbeat } from "../node/heartbeat.ts";
import { loadIdentity } from "../node/identity.ts";
import {
  joinToken,
  startFakeUpstream,
  startGateway,
  type TestGateway,
  until,
} from "./_fleet.ts";

async function world() {
  const gw = await startGateway();
  const up = startFakeUpstream();
  const dirs: string[] = [];
  const node = async (token: string | null, stateDir?: string) => {
    const dir = stateDir ?? await Deno.makeTempDir({ prefix: "orchard-node-" });
    if (!dirs.includes(dir)) dirs.push(dir);
    return await startNodeWorker({
      gatewayUrl: gw.url,
      joinToken: token,
      engine: "openai",
      upstreamUrl: up.url,
      port: 0,
      host: "127.0.0.1",
      stateDir: dir,
      heartbeatMs: 100,
      name: "mac-1",
      linktest: null,
    });
  };
  return {
    gw,
    up,
    node,
    dirs,
    async [Symbol.asyncDispose]() {
      await gw.close();
      await up.close();
      for (const d of dirs) await Deno.remove(d, { recursive: true });
    },
  };
}

async function enrollRaw(gw: TestGateway, token: string, url: string) {
  const { publicJwk } = await generateEd25519();
  const res = await fetch(`${gw.url}/api/node/v1/enroll`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token, publicJwk, url, engine: "openai" }),
  });
  return { status: res.status, body: await res.json() };
}

Deno.test("node enrolls with a join token, heartbeats, and restarts with the same identity and no token", async () => {
  await using w = await world();
  const created = await w.gw.admin("POST", "/join-tokens", { uses: 1 });
  assert.equal(created.status, 201);
  const { token, command } = await created.json();
  assert.equal(
    command,
    `deno task node join --gateway http://gw --join ${token} && deno task node service install`,
  );

  const first = await w.node(token);
  const stateDir = w.dirs[0]!;
  const info = await Deno.stat(`${stateDir}/identity.json`);
  assert.equal(info.mode! & 0o777, 0o600);
  const view = await until("healthy node", async () => {
    const res = await w.gw.admin("GET", `/nodes/${first.nodeId}`);
    const n = await res.json();
    return n.state === "healthy" && n.reachable !== null ? n : null;
  });
  // The gateway checked it reaches the node at the URL it advertised.
  assert.equal(view.reachable, true);
  assert.equal(view.reachability.url, first.url);
  assert.equal(view.name, "mac-1");
  assert.equal(view.url, first.url);
  // what the engine serves, and what its upstream lists but cannot serve
  assert.deepEqual(
    view.status.models.map((
      m: { id: string; servable?: boolean },
    ) => [m.id, m.servable ?? true]).sort(),
    [["ghost-model", false], ["nomic-embed", true], ["tiny-chat", true]],
  );
  assert.equal(view.probe.schema, "orchard.probe.basic/1");
  assert.equal("publicJwk" in view, false);
  await first.close();

  const again = await w.node(null, stateDir);
  assert.equal(again.nodeId, first.nodeId);
  await w.gw.fleet.refresh();
  assert.equal(w.gw.fleet.candidates("tiny-chat")[0]?.id, first.nodeId);
  await again.close();
});

Deno.test("enrollment refuses a used, an expired and a wrong join token", async () => {
  await using w = await world();
  const token = await joinToken(w.gw, { uses: 1 });
  const ok = await enrollRaw(w.gw, token, "http://127.0.0.1:9");
  assert.equal(ok.status, 201);
  assert.ok(ok.body.nodeId);
  assert.equal(ok.body.gatewayJwks.keys[0].crv, "Ed25519");

  const reused = await enrollRaw(w.gw, token, "http://127.0.0.1:9");
  assert.equal(reused.status, 401);

  const wrong = await enrollRaw(
    w.gw,
    `${token.split(".")[0]}.nope`,
    "http://127.0.0.1:9",
  );
  assert.equal(wrong.status, 401);
  assert.equal(wrong.body.error.message, "Join token is not valid");

  const old = await joinToken(w.gw, { uses: 5 });
  const id = old.split(".")[0]!;
  const rec = (await w.gw.kv.get<JoinToken>(k.joinToken(id))).value!;
  await w.gw.kv.set(k.joinToken(id), {
    ...rec,
    expiresAt: new Date(Date.now() - 1000).toISOString(),
  });
  const expired = await enrollRaw(w.gw, old, "http://127.0.0.1:9");
  assert.equal(expired.status, 401);
  assert.equal(expired.body.error.message, "Join token has expired");

  await assert.rejects(() => w.node(null), /not enrolled/);
});

Deno.test("a multi-use join token enrolls exactly as many nodes as it has uses, even concurrently", async () => {
  await using w = await world();
  const token = await joinToken(w.gw, { uses: 2 });
  const results = await Promise.all(
    Array.from(
      { length: 5 },
      () => enrollRaw(w.gw, token, "http://127.0.0.1:9"),
    ),
  );
  assert.equal(results.filter((r) => r.status === 201).length, 2);
  assert.ok(
    results.every((r) =>
      r.status === 201 || r.status === 401 || r.status === 409
    ),
  );
  const list = await (await w.gw.admin("GET", "/nodes")).json();
  assert.equal(list.items.length, 2);
});

Deno.test("enrollment refuses metadata and link-local node URLs and leaves the token unspent", async () => {
  await using w = await world();
  const token = await joinToken(w.gw);
  for (
    const url of [
      "http://169.254.169.254/latest",
      "http://[fe80::1]:8100",
      "http://metadata.google.internal",
      "http://[::ffff:169.254.169.254]/",
      "http://2852039166/",
      "file:///etc/passwd",
      "http://user:pw@10.0.0.5:8100",
    ]
  ) {
    const r = await enrollRaw(w.gw, token, url);
    assert.equal(r.status, 400, url);
    assert.equal(r.body.error.field, "url");
  }
  const fine = await enrollRaw(w.gw, token, "http://10.0.0.5:8100/");
  assert.equal(fine.status, 201);
  assert.equal(fine.body.url, "http://10.0.0.5:8100");
});

Deno.test("a removed node leaves nothing behind and its heartbeats are refused", async () => {
  await using w = await world();
  const n = await w.node(await joinToken(w.gw));
  await until(
    "status",
    async () => (await w.gw.kv.get(k.nodeStatus(n.nodeId))).value,
  );
  await w.gw.kv.set(k.linkTest(n.nodeId, "other"), { a: n.nodeId, b: "other" });
  await w.gw.kv.set(k.linkTest("other", n.nodeId), { a: "other", b: n.nodeId });
  const forbidden = await w.gw.admin(
    "DELETE",
    `/nodes/${n.nodeId}`,
    undefined,
    "tenant",
  );
  assert.equal(forbidden.status, 403);
  const del = await w.gw.admin("DELETE", `/nodes/${n.nodeId}`);
  assert.equal(del.status, 200);
  const left: unknown[] = [];
  for (
    const prefix of [
      ["node"],
      ["node_status"],
      ["node_probe"],
      ["node_by_key"],
      ["node_reach"],
      ["link_test"],
    ]
  ) {
    for await (const e of w.gw.kv.list({ prefix })) left.push(e.key);
  }
  assert.deepEqual(left, []);
  assert.equal((await w.gw.admin("GET", `/nodes/${n.nodeId}`)).status, 404);
  const id = await loadIdentity(w.dirs[0]!);
  const hb = await sendHeartbeat({
    gatewayUrl: w.gw.url,
    nodeId: n.nodeId,
    privateKey: await importEd25519(id.privateJwk),
  }, {
    intervalMs: 100,
    inFlight: 0,
    queued: 0,
    slots: 1,
    tokensPerSecond: 0,
    healthy: true,
    memory: null,
    models: [],
    drainState: "none",
  });
  assert.equal(hb.status, 401);
  await n.close();
  assert.equal((await w.gw.kv.get(k.nodeStatus(n.nodeId))).value, null);
});
