/** Fleet pages without a browser: live events, actions, join tokens, mesh colours, probe reading. */
import assert from "node:assert/strict";
import { SSEReader } from "../lib/sse.ts";
import { listAudit } from "../store/audit.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import {
  enrollNode,
  recordHeartbeat,
  saveLinkTest,
  setNodeDedication,
} from "../store/nodes.ts";
import { SYSTEM } from "../store/principal.ts";
import { hardwareOf, linkCell } from "../routes/_fleet.ts";
import { createWorld, portalLogin, type TestWorld } from "./_helpers.ts";

async function node(
  w: TestWorld,
  name: string,
  x: string,
  model = "tiny",
) {
  const { token } = await createJoinToken(w.store, SYSTEM, {});
  const n = await enrollNode(w.store, {
    token,
    publicJwk: { kty: "OKP", crv: "Ed25519", x: x.padEnd(43, "A") },
    url: "http://10.0.0.1:8100",
    name,
    engine: "openai",
    models: [{ id: model, loaded: true, kind: "chat", aliases: [] }],
    probe: null,
    version: null,
  });
  await recordHeartbeat(w.store, n.id, {
    intervalMs: 60_000,
    inFlight: 1,
    queued: 0,
    slots: 4,
    tokensPerSecond: 12.5,
    healthy: true,
    memory: { totalBytes: 2 ** 34, freeBytes: 2 ** 33 },
    models: [{
      id: model,
      loaded: true,
      kind: "chat",
      aliases: model === "tiny" ? ["t"] : [],
    }],
    drainState: "none",
  });
  return n;
}

Deno.test("fleet pages: nodes, live events, drain, join token command, models and mesh", async () => {
  const w = await createWorld();
  try {
    const a = await node(w, "mac-a", "a");
    const b = await node(w, "mac-b", "b");
    await w.orchard.fleet.refresh();
    const { cookie, csrf } = await portalLogin(w, "root@example.com");
    const get = (path: string) => w.app.request(path, { headers: { cookie } });
    const post = (path: string, form: Record<string, string> = {}) =>
      w.app.request(path, {
        method: "POST",
        headers: {
          cookie,
          origin: "http://localhost",
          "content-type": "application/x-www-form-urlencoded",
        },
        body: new URLSearchParams({ _csrf: csrf, ...form }),
      });

    const html = await (await get("/nodes")).text();
    assert.match(html, /data-node="[^"]+"/);
    assert.match(html, /mac-a/);
    assert.match(html, /1 \/ 4 \(\+0 queued\)/);
    assert.match(html, /8\.0 GiB free of 16\.0 GiB/);

    // The live stream pushes every node's state at once.
    const ac = new AbortController();
    const res = await w.app.request("/nodes/events", {
      headers: { cookie },
      signal: ac.signal,
    });
    assert.match(res.headers.get("content-type")!, /text\/event-stream/);
    const events = new SSEReader(res.body!);
    const data = await events.next();
    ac.abort();
    events.cancel();
    assert.equal(events.event, "nodes");
    const live = JSON.parse(data!);
    assert.deepEqual(
      live.map((n: { id: string; state: string; tokensPerSecond: number }) => [
        n.id,
        n.state,
        n.tokensPerSecond,
      ]).sort(),
      [[a.id, "healthy", 12.5], [b.id, "healthy", 12.5]].sort(),
    );

    // without the confirmation it only asks
    const asked = await post(`/nodes/${a.id}/drain`);
    assert.equal(asked.status, 200);
    assert.match(await asked.text(), /Yes, drain/);
    const drained = await post(`/nodes/${a.id}/drain`, { confirm: "1" });
    assert.equal(drained.status, 303);
    assert.equal(drained.headers.get("location"), "/nodes#nodes");
    // the page shows the one-time flash the redirect left in a cookie
    const flashed = (res: Response, path: string) =>
      w.app.request(path, {
        headers: {
          cookie: [
            cookie,
            ...res.headers.getSetCookie().map((c) => c.split(";")[0]!),
          ].join("; "),
        },
      });
    const after = await (await flashed(drained, "/nodes")).text();
    assert.match(after, /Node is draining/);
    assert.match(after, /data-action="undrain"/);
    const missing = await post(`/nodes/nope/drain`, { confirm: "1" });
    assert.equal(missing.status, 404);
    const noCsrf = await w.app.request(`/nodes/${b.id}/remove`, {
      method: "POST",
      headers: { cookie, "content-type": "application/x-www-form-urlencoded" },
      body: "",
    });
    assert.equal(noCsrf.status, 403);
    const audit = await listAudit(w.kv, SYSTEM, {});
    assert.ok(audit.items.some((e) => e.action === "node.drain"));

    const joined = await post("/nodes/join-tokens", {
      uses: "2",
      ttlMinutes: "30",
    });
    assert.equal(joined.status, 303);
    assert.equal(joined.headers.get("location"), "/nodes#join");
    assert.equal(joined.headers.get("cache-control"), "no-store");
    const joinPage = await flashed(joined, "/nodes");
    assert.equal(joinPage.headers.get("cache-control"), "no-store");
    const jt = await joinPage.text();
    assert.match(
      jt,
      /deno task node join --gateway http:\/\/localhost:8000 --join [0-9a-z]+\.[0-9A-Za-z]+ &amp;&amp; deno task node service install/,
    );
    const badJoin = await post("/nodes/join-tokens", { ttlMinutes: "9999" });
    assert.equal(badJoin.status, 400);
    assert.match(await badJoin.text(), /Valid for: must be 1 to 1440 minutes/);

    const models = await (await get("/models")).text();
    assert.match(models, /data-model="tiny"/);
    assert.match(models, /mac-b/);
    assert.match(models, /id="spans"/);

    // a model across several nodes, from the form: refused saying why, then
    // placed (audited), listed and removed
    const badSpan = await post("/models/spans", { model: "tiny", head: a.id });
    assert.equal(badSpan.status, 400);
    assert.match(await badSpan.text(), /at least two nodes/);
    const spanned = await post("/models/spans", {
      model: "tiny",
      head: a.id,
      workers: b.id,
      split: "2, 1",
    });
    assert.equal(spanned.status, 303);
    assert.equal(spanned.headers.get("location"), "/models#spans");
    const spans = await (await flashed(spanned, "/models")).text();
    assert.match(spans, /data-span="tiny"/);
    assert.match(spans, /placed across 2 nodes/);
    assert.match(spans, /2 : 1/);
    const unspanned = await post("/models/spans/remove", { model: "tiny" });
    assert.equal(unspanned.status, 303);
    assert.doesNotMatch(
      await (await get("/models")).text(),
      /data-span="tiny"/,
    );
    const spanAudit = await listAudit(w.kv, SYSTEM, {});
    assert.ok(
      spanAudit.items.some((e) => e.action === "placement.span.set"),
    );

    await saveLinkTest(w.store, SYSTEM, {
      a: a.id,
      b: b.id,
      at: new Date().toISOString(),
      ok: true,
      result: {
        transport: "rdma-uc",
        latency: { one_way_us: { p50: 6.2 } },
        bandwidth: { bytes_per_sec: 8.1e9 },
      },
      error: null,
    });
    const mesh = await (await get("/mesh")).text();
    assert.match(mesh, /data-health="ok"/);
    assert.match(mesh, /6\.2 µs/);
    assert.match(mesh, /8\.10 GB\/s/);
    const progress = await (await get("/mesh/progress")).json();
    assert.equal(progress.running, false);
    const pg = await (await get("/playground")).text();
    assert.match(pg, /data-name="Playground"/);
    assert.doesNotMatch(pg, /orch_[0-9a-z]{26}_/);
  } finally {
    await w.close();
  }
});

Deno.test("the playground: tenant admins try their keys on shared and their own dedicated models; viewers may not", async () => {
  const w = await createWorld();
  try {
    await node(w, "mac-shared", "s");
    const mine = await node(w, "mac-a-only", "m", "a-private");
    const theirs = await node(w, "mac-b-only", "t", "b-private");
    await setNodeDedication(w.store, SYSTEM, mine.id, w.tenantA.id);
    await setNodeDedication(w.store, SYSTEM, theirs.id, w.tenantB.id);
    await w.orchard.fleet.refresh();
    const page = async (email: string) => {
      const { cookie } = await portalLogin(w, email);
      return await w.app.request("/playground", { headers: { cookie } });
    };
    const admin = await page("a-admin@example.com");
    assert.equal(admin.status, 200);
    const html = await admin.text();
    assert.match(html, /data-name="Playground"/);
    assert.match(html, /href="\/playground" aria-current="page"/);
    assert.match(html, /tiny/);
    assert.match(html, /a-private/);
    assert.doesNotMatch(html, /b-private/, "another tenant's dedicated model");
    const root = await (await page("root@example.com")).text();
    assert.match(root, /b-private/);
    const viewer = await page("a-viewer@example.com");
    assert.equal(viewer.status, 403);
    await viewer.body?.cancel();
  } finally {
    await w.close();
  }
});

Deno.test("linkCell() colours by TB5 thresholds; hardwareOf() reads GPU, thermal and RDMA ports", () => {
  const rec = (result: unknown, ok = true) => ({
    a: "a",
    b: "b",
    at: "2026-11-01T00:00:00Z",
    ok,
    result,
    error: ok ? null : "refused",
  });
  const lat = (us: number, gbs: number) => ({
    latency: { one_way_us: { p50: us } },
    bandwidth: { bytes_per_sec: gbs * 1e9 },
  });
  assert.equal(linkCell(rec(lat(10, 7))).health, "ok");
  assert.equal(linkCell(rec(lat(11, 9))).health, "warn");
  assert.equal(linkCell(rec(lat(5, 5))).health, "warn");
  assert.equal(linkCell(rec(lat(26, 9))).health, "bad");
  assert.equal(linkCell(rec(lat(5, 3.9))).health, "bad");
  assert.equal(linkCell(rec(null, false)).health, "bad");
  const hw = hardwareOf({
    native: {
      gpu: {
        name: "Apple M4 Max",
        core_count: 40,
        recommended_max_working_set_bytes: 100 * 2 ** 30,
      },
      thermal: { state: "nominal" },
      memory: { pressure: "warn" },
      rdma: {
        available: true,
        devices: [{
          name: "rdma_en2",
          limits: { max_qp: 10, max_mr: 100 },
          in_use: { qp: 3, mr: 7, source: "rdma resource show" },
          ports: [{ port: 1, usable: false, reason: "no IPv4-mapped GID" }],
        }, {
          name: "rdma_en3",
          limits: { max_qp: 10, max_mr: 100 },
          in_use: null,
          ports: [{ port: 1, usable: true }],
        }],
      },
    },
  });
  assert.equal(hw.gpu, "Apple M4 Max, 40 cores, 100 GiB working set");
  assert.equal(hw.thermal, "nominal");
  assert.equal(hw.memoryPressure, "warn");
  assert.deepEqual(hw.ports, [
    { name: "rdma_en2/1", usable: false, reason: "no IPv4-mapped GID" },
    { name: "rdma_en3/1", usable: true, reason: null },
  ]);
  assert.deepEqual(hw.headroom, [
    { device: "rdma_en2", maxQp: 10, maxMr: 100, qpInUse: 3, mrInUse: 7 },
    {
      device: "rdma_en3",
      maxQp: 10,
      maxMr: 100,
      qpInUse: null,
      mrInUse: null,
    },
  ]);
  assert.deepEqual(hardwareOf(null).ports, []);
  assert.deepEqual(hardwareOf(null).headroom, []);
});

Deno.test("the mesh page shows cabling findings from a node's probe with the fix, and failed or fallen-back links in words", async () => {
  const w = await createWorld();
  try {
    const a = await node(w, "mac-a", "a");
    const b = await node(w, "mac-b", "b");
    const probeDoc = JSON.parse(
      await Deno.readTextFile(
        new URL("./fixtures/probes/mac_shared_subnet.json", import.meta.url),
      ),
    );
    await recordHeartbeat(w.store, a.id, {
      intervalMs: 60_000,
      inFlight: 0,
      queued: 0,
      slots: 4,
      tokensPerSecond: 0,
      healthy: true,
      memory: { totalBytes: 2 ** 34, freeBytes: 2 ** 33 },
      models: [{ id: "tiny", loaded: true, kind: "chat", aliases: ["t"] }],
      drainState: "none",
      probe: { os: "darwin", native: probeDoc },
    });
    await saveLinkTest(w.store, SYSTEM, {
      a: a.id,
      b: b.id,
      at: new Date().toISOString(),
      ok: true,
      result: {
        transport: "tcp",
        fallback_reason:
          "RDMA setup failed: peer: RTR transition failed (errno 22): known macOS issue until reboot",
        latency: { one_way_us: { p50: 30 } },
      },
      error: null,
    });
    const { cookie } = await portalLogin(w, "root@example.com");
    const html = await (await w.app.request("/mesh", { headers: { cookie } }))
      .text();
    assert.match(html, /data-code="shared-subnet"/);
    const nodesPage = await (await w.app.request("/nodes", {
      headers: { cookie },
    })).text();
    assert.match(
      nodesPage,
      /rdma_en2<\/span>: QP max 10 \(in use unknown\), MR max 100 \(in use unknown\)/,
    );
    assert.match(
      html,
      /mac-a<\/strong>: en2 and en3 are both in 10\.0\.0\.0\/24/,
    );
    assert.match(html, /Fix: Give each Thunderbolt link its own small subnet/);
    assert.match(
      html,
      /mac-a ↔ mac-b<\/strong> fell back to TCP: RDMA setup failed: peer: RTR transition failed \(errno 22\)/,
    );
  } finally {
    await w.close();
  }
});

Deno.test("the nodes page says which llama.cpp each llama node runs: built with RPC, or prebuilt", async () => {
  const w = await createWorld();
  try {
    const a = await node(w, "mac-a", "a");
    const b = await node(w, "mac-b", "b");
    const beat = (id: string, llama: Record<string, unknown>) =>
      recordHeartbeat(w.store, id, {
        intervalMs: 60_000,
        inFlight: 0,
        queued: 0,
        slots: 4,
        tokensPerSecond: 0,
        healthy: true,
        memory: { totalBytes: 2 ** 34, freeBytes: 2 ** 33 },
        models: [{ id: "tiny", loaded: true, kind: "chat", aliases: [] }],
        drainState: "none",
        // node/worker.ts: the engine's facts (protocol/engine.ts LlamaRuntime)
        probe: { os: "darwin", llama },
      });
    await beat(a.id, {
      build: "built",
      version: "0.4.0-dev",
      tag: "v0.4.0",
      commit: "80fb11ac73e66d89eae2c6a91d8a77428fa733ed",
      rpc: true,
      rdma: true,
    });
    await beat(b.id, {
      build: "prebuilt",
      version: "0.4.0-dev",
      tag: null,
      commit: null,
      rpc: false,
      rdma: false,
    });
    const { cookie } = await portalLogin(w, "root@example.com");
    const html = await (await w.app.request("/nodes", { headers: { cookie } }))
      .text();
    const row = (id: string) => {
      const at = html.indexOf(`data-node="${id}"`);
      assert.ok(at >= 0, `row of ${id}`);
      return html.slice(at, html.indexOf("</tr>", at));
    };
    assert.match(
      row(a.id),
      /data-build="built"[^>]*>llama\.cpp v0\.4\.0 built, RPC \+ RDMA</,
    );
    assert.match(
      row(b.id),
      /data-build="prebuilt"[^>]*>llama\.cpp 0\.4\.0-dev prebuilt, no RPC</,
    );
  } finally {
    await w.close();
  }
});
