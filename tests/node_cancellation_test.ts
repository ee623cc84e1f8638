/**
 * Cancellation end to end, with a real node process (`--engine openai` in
 * front of an Exo-like fake upstream that stalls): a gateway timeout, a
 * client that goes away and the end of a graceful stop's drain each close
 * the node's upstream request within a second, and the node's in-flight
 * count follows what its engine is really doing.
 */
import assert from "node:assert/strict";
import { silentLogger } from "../lib/log.ts";
import type { GatewayOptions } from "../gateway/mod.ts";
import { type FakeUpstream, startFakeUpstream, until } from "./_fleet.ts";
import { api, createWorld, type TestWorld } from "./_helpers.ts";
import { startGatewayProcess } from "./fixtures/cluster.ts";
import { spawnNode, stopNode } from "./fixtures/node_process.ts";

/** A served gateway (in this process), a fake upstream and a real node process in front of it. */
interface Rig {
  w: TestWorld;
  up: FakeUpstream;
  url: string;
  key: string;
  nodeId: string;
  /** The node's engine stats, read through the gateway's signed call. */
  stats(): Promise<{ inFlight: number }>;
  close(): Promise<void>;
}

/** Starts the rig; resolves once the gateway routes to the node. */
async function startRig(gateway: GatewayOptions): Promise<Rig> {
  const w = await createWorld({
    gateway: { logger: silentLogger, ...gateway },
    fleetRefreshMs: 50,
  });
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    w.app.fetch,
  );
  const url = `http://127.0.0.1:${server.addr.port}`;
  const up = startFakeUpstream();
  const dir = await Deno.makeTempDir({ prefix: "orchard-cancel-" });
  const p = w.tokens.platform;
  const join = await (await api(w, "POST", "/join-tokens", p, {})).json();
  const key = await (await api(w, "POST", `/tenants/${w.tenantA.id}/keys`, p, {
    name: "cancel",
  })).json();
  const node = await spawnNode([
    "--gateway",
    url,
    "--join",
    join.token,
    "--engine",
    "openai",
    "--upstream",
    up.url,
    "--port",
    "0",
    "--heartbeat-ms",
    "100",
  ], { ORCHARD_NODE_STATE_DIR: dir, ORCHARD_NODE_HOST: "127.0.0.1" });
  const nodeId = /^Orchard node (\S+) serving/.exec(node.line)?.[1] ?? "";
  const fleet = w.orchard.fleet;
  const close = async () => {
    await stopNode(node.child);
    await server.shutdown();
    await up.close();
    await w.close();
    await Deno.remove(dir, { recursive: true });
  };
  try {
    assert.ok(nodeId, node.line);
    await until("routable", async () => {
      await fleet.refresh();
      return fleet.candidates("tiny-chat")[0]?.id === nodeId;
    }, 10_000);
  } catch (e) {
    await close();
    throw e;
  }
  return {
    w,
    up,
    url,
    key: key.key,
    nodeId,
    async stats() {
      const res = await fleet.fetchNode(nodeId, "/health", {});
      return (await res.json()).stats;
    },
    close,
  };
}

/**
 * Starts a chat the fake upstream holds: "hold" after its first chunk,
 * "hold-head" before answering anything.
 */
function holdRequest(
  rig: Rig,
  opts: {
    hold?: "hold" | "hold-head";
    stream?: boolean;
    signal?: AbortSignal;
  } = {},
): Promise<Response> {
  return fetch(`${rig.url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${rig.key}`,
      "content-type": "application/json",
    },
    body: JSON.stringify({
      model: "tiny-chat",
      messages: [{ role: "user", content: opts.hold ?? "hold" }],
      stream: opts.stream ?? true,
    }),
    signal: opts.signal,
  });
}

/** Reads a stream until `pattern` appears; returns what was read. */
async function readUntil(
  reader: ReadableStreamDefaultReader<string>,
  pattern: RegExp,
): Promise<string> {
  let text = "";
  while (!pattern.test(text)) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
  }
  return text;
}

/** Asserts the fake upstream saw its held requests closed within 1 s of `since`, and the node is idle. */
async function assertClosedSoon(rig: Rig, since: number): Promise<void> {
  await until("the upstream requests closed", () => rig.up.holding === 0, 1500);
  const ms = Math.round(performance.now() - since);
  assert.ok(ms < 1000, `closed ${ms} ms after`);
  await until("idle node", async () => (await rig.stats()).inFlight === 0);
}

Deno.test("a gateway idle timeout closes the node's upstream request within 1 s, and the node reports nothing in flight", async () => {
  const rig = await startRig({ proxy: { idleTimeoutMs: 400 } });
  try {
    const res = await holdRequest(rig);
    assert.equal(res.status, 200);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    await readUntil(reader, /"Hi"/);
    assert.equal((await rig.stats()).inFlight, 1);
    assert.equal(rig.up.holding, 1);
    // The next thing the client gets is the gateway's timeout frame.
    const text = await readUntil(reader, /\[DONE\]|"error"/);
    const timedOutAt = performance.now();
    assert.match(text, /"code":"timeout"/);
    await assertClosedSoon(rig, timedOutAt);
    await reader.cancel();
  } finally {
    await rig.close();
  }
});

for (const stream of [true, false]) {
  Deno.test(`a gateway timeout before the node answered (${stream ? "stream" : "non-stream"}) closes the node's upstream request within 1 s`, async () => {
    // The node's server does not see the gateway's connection close while
    // its handler is still waiting: the gateway's cancellation does it.
    // A stream's node answers with headers once its model took the
    // request (first-byte timeout); a non-stream answer comes whole after
    // its generation (total timeout).
    const rig = await startRig({
      proxy: stream ? { firstByteTimeoutMs: 500 } : { totalTimeoutMs: 500 },
    });
    try {
      const res = await holdRequest(rig, { hold: "hold-head", stream });
      const timedOutAt = performance.now();
      const text = await res.text();
      if (stream) {
        assert.equal(res.status, 503, text);
        assert.equal(res.headers.get("retry-after"), "2");
        assert.match(text, /no answer within 500 ms/);
      } else {
        assert.equal(res.status, 504, text);
        assert.match(text, /"code":"timeout"/);
      }
      await assertClosedSoon(rig, timedOutAt);
    } finally {
      await rig.close();
    }
  });
}

Deno.test("a non-stream generation longer than the connect timeout is answered (only the total timeout bounds it)", async () => {
  const rig = await startRig({ proxy: { connectTimeoutMs: 300 } });
  try {
    const pending = holdRequest(rig, { hold: "hold-head", stream: false });
    await rig.up.held;
    await new Promise((r) => setTimeout(r, 1000));
    rig.up.release();
    const res = await pending;
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.equal(body.object, "chat.completion");
  } finally {
    await rig.close();
  }
});

Deno.test("a client that disconnects mid-stream closes the node's upstream request", async () => {
  const rig = await startRig({});
  try {
    const ac = new AbortController();
    const res = await holdRequest(rig, { signal: ac.signal });
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    await readUntil(reader, /"Hi"/);
    assert.equal(rig.up.holding, 1);
    const leftAt = performance.now();
    ac.abort();
    await reader.cancel().catch(() => {});
    await assertClosedSoon(rig, leftAt);
  } finally {
    await rig.close();
  }
});

Deno.test("the end of a graceful stop's drain ends calls in flight with 503 and closes their upstream requests", async () => {
  const rig = await startRig({});
  try {
    const res = await holdRequest(rig);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    await readUntil(reader, /"Hi"/);
    const waiting = holdRequest(rig, { hold: "hold-head", stream: false });
    await until("both held", () => rig.up.holding === 2);
    const stoppedAt = performance.now();
    rig.w.orchard.gateway.stopCalls();
    const text = await readUntil(reader, /\[DONE\]|"error"/);
    assert.match(text, /"code":"service_unavailable"/);
    const other = await waiting;
    assert.equal(other.status, 503);
    assert.equal(other.headers.get("retry-after"), "1");
    await other.body?.cancel();
    await assertClosedSoon(rig, stoppedAt);
    const late = await holdRequest(rig, { stream: false });
    assert.equal(late.status, 503, "new calls are refused");
    await late.body?.cancel();
    await reader.cancel();
  } finally {
    await rig.close();
  }
});

Deno.test("a gateway process stopped with SIGTERM ends its streams after ORCHARD_DRAIN_TIMEOUT_MS and closes their upstream requests", async () => {
  const dir = await Deno.makeTempDir({ prefix: "orchard-drain-" });
  const up = startFakeUpstream();
  const gw = await startGatewayProcess({
    dataDir: `${dir}/data`,
    adminToken: `orchard-test-${crypto.randomUUID()}`,
    env: { ORCHARD_DRAIN_TIMEOUT_MS: "300" },
  });
  let node: Awaited<ReturnType<typeof spawnNode>> | null = null;
  try {
    const tenant = await gw.admin("POST", "/tenants", { name: "Acme" }) as {
      id: string;
    };
    const { key } = await gw.admin("POST", `/tenants/${tenant.id}/keys`, {
      name: "drain",
    }) as { key: string };
    const { token } = await gw.admin("POST", "/join-tokens", {}) as {
      token: string;
    };
    node = await spawnNode([
      "--gateway",
      gw.url,
      "--join",
      token,
      "--engine",
      "openai",
      "--upstream",
      up.url,
      "--port",
      "0",
      "--heartbeat-ms",
      "100",
    ], {
      ORCHARD_NODE_STATE_DIR: `${dir}/node`,
      ORCHARD_NODE_HOST: "127.0.0.1",
    });
    const chat = () =>
      fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${key}`,
          "content-type": "application/json",
        },
        body: JSON.stringify({
          model: "tiny-chat",
          messages: [{ role: "user", content: "hold" }],
          stream: true,
        }),
      });
    let res = await chat();
    await until("routable", async () => {
      if (res.status === 200) return true;
      await res.body?.cancel();
      res = await chat();
      return false;
    }, 10_000);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    await readUntil(reader, /"Hi"/);
    const stoppedAt = performance.now();
    gw.child.kill("SIGTERM");
    const text = await readUntil(reader, /\[DONE\]|"error"/);
    assert.match(text, /"code":"service_unavailable"/);
    const endedAfter = performance.now() - stoppedAt;
    assert.ok(endedAfter >= 300, `ended ${Math.round(endedAfter)} ms after`);
    await until("the upstream request closed", () => up.holding === 0, 1500);
    assert.ok(performance.now() - stoppedAt < 300 + 1000);
    assert.equal((await gw.child.status).code, 0);
    await reader.cancel().catch(() => {});
  } finally {
    if (node) await stopNode(node.child);
    await gw.stop();
    await up.close();
    await Deno.remove(dir, { recursive: true });
  }
});
