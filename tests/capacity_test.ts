/**
 * The capacity report: its figures from usage records written by the real
 * rollup writer (known inputs, known outputs), its exports (CSV and JSON,
 * portal and admin API), who may see it, and a real gateway metering the
 * wait for a node slot and refusals for lack of capacity.
 */
import assert from "node:assert/strict";
import { startNodeWorker } from "../node/worker.ts";
import { capacityReport } from "../store/capacity.ts";
import { CAPACITY_CSV_HEAD } from "../store/capacity_csv.ts";
import { createApiKey } from "../store/api_keys.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import { k } from "../store/kv_keys.ts";
import type { NodeRecord, NodeStatus } from "../store/nodes.ts";
import { setPricing } from "../store/pricing.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore, type Store } from "../store/store.ts";
import { listUsageRecords, type UsageRecord } from "../store/usage.ts";
import { UsageRollups, writeUsage } from "../store/usage_rollups.ts";
import { api, createWorld, portalLogin } from "./_helpers.ts";
import { startFakeUpstream, until } from "./_fleet.ts";

const HOUR = 3_600_000;
/** Thursday 2026-11-26, 12:30 UTC: the window is 2026-10-30 00:00 … now. */
const NOW = Date.UTC(2026, 10, 26, 12, 30);
const FROM = Date.UTC(2026, 9, 30);
/** Wednesday 2026-11-25, 10:00 UTC. */
const BUSY_HOUR = Date.UTC(2026, 10, 25, 10);

/** Writes a node's record and last heartbeat as enrollment and heartbeats do. */
async function seedNode(
  store: Store,
  id: string,
  name: string,
  enrolledAt: number,
  slots: number,
): Promise<void> {
  const record: NodeRecord = {
    id,
    name,
    url: `http://${id}.test`,
    engine: "openai",
    publicJwk: {},
    keyThumbprint: `thumb-${id}`,
    drain: false,
    models: [],
    enrolledAt: new Date(enrolledAt).toISOString(),
    joinTokenId: "jt",
    version: null,
  };
  const status: NodeStatus = {
    at: new Date(NOW).toISOString(),
    intervalMs: 1000,
    stats: {
      inFlight: 0,
      queued: 0,
      slots,
      tokensPerSecond: 0,
      healthy: true,
    },
    memory: null,
    models: [],
    drainState: "none",
  };
  await store.kv.atomic().set(k.node(id), record).set(k.nodeStatus(id), status)
    .commit();
}

let seq = 0;
function rec(
  at: number,
  o: Partial<UsageRecord> & Pick<UsageRecord, "model">,
): UsageRecord {
  seq++;
  return {
    id: `r${String(seq).padStart(4, "0")}`,
    at: new Date(at).toISOString(),
    requestId: `req${seq}`,
    tenantId: "t1",
    keyId: "k1",
    nodeId: null,
    endpoint: "chat",
    promptTokens: 0,
    completionTokens: 0,
    latencyMs: 0,
    ttftMs: null,
    status: 200,
    outcome: "ok",
    ...o,
  };
}

Deno.test("capacityReport() computes busy share, wait, refusals, tokens/s against the measured peak, heatmaps, the forecast and cost per 1M tokens from written usage", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  await seedNode(store, "node-a", "mac-a", Date.UTC(2026, 0, 1), 2);
  await seedNode(store, "node-b", "mac-b", Date.UTC(2026, 10, 20), 1);
  await setPricing(store, SYSTEM, {
    currency: "EUR",
    models: [],
    cluster: {
      hardwarePricePerNode: "3600",
      amortisationMonths: 36,
      idleWatts: 10,
      busyWatts: 60,
      tariffPerKwh: "0.30",
    },
  });
  await writeUsage(store, [
    // node A, 2 slots: 30 min each on the node → half its slot-time
    rec(BUSY_HOUR + 60_000, {
      model: "m1",
      nodeId: "node-a",
      slots: 2,
      latencyMs: 1_800_000,
      promptTokens: 100,
      completionTokens: 7200,
    }),
    rec(BUSY_HOUR + 120_000, {
      model: "m1",
      nodeId: "node-a",
      slots: 2,
      latencyMs: 2_400_000,
      queueMs: 600_000,
      promptTokens: 100,
      completionTokens: 3600,
    }),
    // node B, 1 slot: 6 minutes
    rec(BUSY_HOUR + 180_000, {
      model: "m2",
      nodeId: "node-b",
      slots: 1,
      latencyMs: 360_000,
      promptTokens: 40,
      completionTokens: 360,
    }),
    // refused after waiting 10 s; then one refused at once (queue full)
    rec(BUSY_HOUR + 240_000, {
      model: "m1",
      status: 503,
      outcome: "error",
      latencyMs: 10_001,
      queueMs: 10_000,
      refused: "queue_timeout",
    }),
    rec(BUSY_HOUR + 250_000, {
      model: "m1",
      status: 503,
      outcome: "error",
      latencyMs: 1,
      refused: "queue_full",
    }),
    // rejected before routing (a 429): no capacity figure counts it
    rec(BUSY_HOUR + 260_000, { model: "m1", status: 429, outcome: "error" }),
    // before the window: not counted
    rec(Date.UTC(2026, 9, 1, 10), {
      model: "m1",
      nodeId: "node-a",
      slots: 2,
      latencyMs: 3_600_000,
      completionTokens: 99_999,
    }),
  ]);
  const r = await capacityReport(store, SYSTEM, NOW);
  assert.equal(r.window.from, new Date(FROM).toISOString());
  assert.equal(r.window.hours, 27 * 24 + 13); // the last hour is half over
  const h = (BUSY_HOUR - FROM) / HOUR;
  const [a, b] = r.nodes;
  assert.equal(a!.name, "mac-a");
  assert.equal(b!.name, "mac-b");
  assert.equal(a!.slots, 2);

  // node A: 1,800,000 ms of slot-time in its busy hour → 50%
  assert.equal(a!.series.busy[h], 0.5);
  assert.equal(a!.series.tokensPerSecond[h], 10_800 / 3600);
  assert.equal(a!.series.queueMs[h], 300_000);
  assert.equal(a!.capacityHours, 27 * 24 + 12.5);
  assert.ok(close(a!.busyShare!, 0.5 / a!.capacityHours));
  assert.deepEqual(a!.peakBusy, {
    share: 0.5,
    at: new Date(BUSY_HOUR).toISOString(),
  });
  assert.deepEqual(a!.peakTokensPerSecond, {
    value: 3,
    at: new Date(BUSY_HOUR).toISOString(),
  });
  assert.ok(close(a!.tokensPerSecond, 10_800 / (a!.capacityHours * 3600)));
  assert.ok(close(a!.deliveredVsPeak!, a!.tokensPerSecond / 3));
  assert.equal(a!.requests, 2);
  // node B: enrolled 2026-11-20 00:00
  assert.equal(b!.capacityHours, 6 * 24 + 12.5);
  assert.ok(close(b!.series.busy[h]!, 0.1));
  assert.equal(b!.series.busy[0], null, "no capacity before it enrolled");

  // the cluster: both nodes' slot-time over both nodes' hour
  const cl = r.cluster;
  assert.equal(cl.nodes, 2);
  assert.equal(cl.slots, 3);
  assert.ok(close(cl.series.busy[h]!, 2_160_000 / (2 * HOUR)));
  assert.equal(cl.requests, 3, "served");
  assert.equal(cl.routed, 5, "served and refused");
  assert.equal(cl.refused, 2);
  assert.equal(cl.refusedSeries[h], 2);
  assert.equal(cl.queued, 2);
  assert.equal(cl.series.queueMs[h], 610_000 / 5);
  // Wednesday 10:00 was in the window four times: node A's four hours and
  // node B's one are the cell's capacity
  assert.ok(close(cl.heatmap.busy[2]![10]!, 2_160_000 / (5 * HOUR)));
  assert.equal(a!.heatmap.busy[2]![10], 0.5 / 4);
  assert.equal(a!.heatmap.queueMs[2]![10], 300_000);
  assert.equal(a!.heatmap.busy[5]![10], 0, "a Saturday with capacity, idle");
  // by day, and by hour of day: 20 weekday 10:00 hours in the window
  const d = (BUSY_HOUR - FROM) / 86_400_000 | 0;
  assert.ok(close(a!.daily.busy[d]!, 0.5 / 24));
  assert.equal(a!.daily.peakBusy[d], 0.5);
  assert.equal(a!.daily.peakBusy[0], 0);
  assert.equal(cl.refusedDaily[d], 2);
  assert.equal(cl.refusedDaily.length, 28);
  assert.equal(a!.byHour.weekdayBusy[10], 0.5 / 20);
  assert.equal(a!.byHour.weekendBusy[10], 0);
  assert.equal(a!.byHour.weekdayTokensPerSecond[10], 3 / 20);

  // weekly weekday peaks, and the forecast through them
  assert.deepEqual(r.weeks.map((w) => w.weekdayPeak), [0, 0, 0, 0.3]);
  assert.equal(r.forecast.kind, "date");
  if (r.forecast.kind === "date") {
    // +0.09 a week from -0.06: 0.9 at week 10.67 after 2026-11-02 12:00
    assert.equal(r.forecast.date, "2027-01-16");
    assert.ok(close(r.forecast.slopePerWeek, 0.09));
  }
  assert.match(r.forecastText, /around 2027-01-16\.$/);

  // cost: hardware per enrolled node-hour at each month's hours, energy
  // busy at 60 W and idle at 10 W, at 0.30 a kWh
  const hwOct = 3600e6 / 36 / 744, hwNov = 3600e6 / 36 / 720;
  const hardware = 48 * hwOct + (a!.capacityHours - 48) * hwNov +
    b!.capacityHours * hwNov;
  const kwh = (busy: number, cap: number) => busy * 0.06 + (cap - busy) * 0.01;
  const energy = (kwh(0.5, a!.capacityHours) + kwh(0.1, b!.capacityHours)) *
    0.3e6;
  assert.ok(close(r.cost.hardwareMicro, hardware));
  assert.ok(close(r.cost.energyMicro, energy));
  const total = hardware + energy;
  assert.ok(close(r.cost.totalMicro, total));
  const busyCost = 0.6 * hwNov + 0.6 * 0.06 * 0.3e6;
  assert.ok(close(r.cost.busyMicro, busyCost));
  const [m1, m2] = r.cost.models;
  assert.equal(m1!.model, "m1");
  assert.equal(m1!.requests, 2);
  assert.ok(close(m1!.share, 1800 / 2160));
  assert.ok(close(m1!.slotHours, 0.5));
  assert.ok(close(m1!.per1MMicro!, total * (1800 / 2160) / 11_000 * 1e6));
  assert.ok(
    close(m1!.busyPer1MMicro!, busyCost * (1800 / 2160) / 11_000 * 1e6),
  );
  assert.ok(close(m2!.per1MMicro!, total * (360 / 2160) / 400 * 1e6));
  kv.close();
});

Deno.test("capacityReport() says not enough data on an empty cluster, and counts a removed node from its first to its last hour served", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  let r = await capacityReport(store, SYSTEM, NOW);
  assert.equal(r.nodes.length, 0);
  assert.equal(r.cluster.busyShare, null);
  assert.deepEqual(r.forecast, {
    kind: "not_enough_data",
    weeks: 0,
    needed: 3,
  });
  assert.deepEqual(r.cost.models, []);
  assert.deepEqual(r.cost.notes, [
    "No cluster cost model is set (Settings): costs are zero.",
  ]);
  await writeUsage(store, [
    rec(BUSY_HOUR - 24 * HOUR, {
      model: "m1",
      nodeId: "gone",
      slots: 1,
      latencyMs: 900_000,
    }),
    rec(BUSY_HOUR, { model: "m1", nodeId: "gone", slots: 1, latencyMs: 1 }),
  ]);
  r = await capacityReport(store, SYSTEM, NOW);
  assert.equal(r.nodes.length, 1);
  assert.equal(r.nodes[0]!.name, "removed node gone");
  assert.equal(r.nodes[0]!.slots, null);
  assert.equal(r.nodes[0]!.capacityHours, 25);
  assert.equal(r.nodes[0]!.peakBusy!.share, 0.25);
  kv.close();
});

Deno.test("capacity rollups replayed from a journal count each record once: after a crash part way, and again after all of it landed", async () => {
  const records = [0, 1, 2, 3, 4, 5].map((i) =>
    rec(BUSY_HOUR + i * 60_000, {
      model: i % 2 ? "m1" : "m2",
      nodeId: i < 5 ? "node-a" : null,
      slots: i < 5 ? 2 : undefined,
      latencyMs: 600_000,
      queueMs: i === 1 ? 60_000 : undefined,
      completionTokens: 360,
      ...(i === 5 ? { status: 503, refused: "queue_full" as const } : {}),
    })
  );
  const entries = records.map((record, i) => ({ seq: i + 1, record }));
  const figures = async (store: Store) => {
    const r = await capacityReport(store, SYSTEM, NOW);
    const h = (BUSY_HOUR - FROM) / HOUR;
    return {
      busy: r.nodes[0]?.series.busy[h],
      tps: r.nodes[0]?.series.tokensPerSecond[h],
      queue: r.nodes[0]?.series.queueMs[h],
      refused: r.cluster.refused,
      routed: r.cluster.routed,
      models: r.cost.models.map((m) => [m.model, m.requests, m.slotHours]),
    };
  };
  const want = {
    // each request's time on the node over 2 slots; one waited 60 s of its 600
    busy: (4 * 300_000 + 270_000) / HOUR,
    tps: 5 * 360 / 3600,
    queue: 12_000,
    refused: 1,
    routed: 6,
    models: [["m2", 3, 900_000 / HOUR], ["m1", 2, 570_000 / HOUR]],
  };
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  await seedNode(store, "node-a", "mac-a", Date.UTC(2026, 0, 1), 2);
  // a writer that crashed after writing its first 3 records' groups
  const first = new UsageRollups({ writer: "w1" });
  await first.write(store, records.slice(0, 3));
  assert.equal(await UsageRollups.replay(store, "w1", entries), 3);
  assert.deepEqual(await figures(store), want);
  assert.equal(await UsageRollups.replay(store, "w1", entries), 0);
  assert.deepEqual(await figures(store), want, "nothing added twice");
  kv.close();
});

Deno.test("capacityReport() is for platform admins only", async () => {
  const w = await createWorld();
  await assert.rejects(
    () =>
      capacityReport(w.store, {
        ...SYSTEM,
        role: "tenant_admin",
        tenantId: w.tenantA.id,
      }),
    (e: Error & { status?: number }) => e.status === 403,
  );
  await w.close();
});

Deno.test("the capacity page and its exports: figures, CSV rows and JSON for platform admins; 403 for a tenant's admin and viewer", async () => {
  const w = await createWorld();
  const now = Date.now();
  await seedNode(w.store, "node-a", "mac-a", now - 3 * 86_400_000, 4);
  await writeUsage(w.store, [
    rec(now - 2 * HOUR, {
      model: "m1",
      nodeId: "node-a",
      slots: 4,
      latencyMs: 720_000,
      completionTokens: 36_000,
    }),
    rec(now - 2 * HOUR, {
      model: "m1",
      status: 503,
      outcome: "error",
      refused: "queue_full",
    }),
  ]);
  const root = await portalLogin(w, "root@example.com");
  const page = await w.app.request("/capacity", {
    headers: { cookie: root.cookie },
  });
  assert.equal(page.status, 200);
  const html = await page.text();
  assert.match(html, /data-testid="refused"[^>]*>1</);
  assert.match(html, /Not enough data for a forecast/);
  assert.match(html, /<tr data-node="node-a"/);
  // one hour 5% busy (720,000 / 4 slots) and at 10 tokens/s: the peak
  assert.match(html, /data-testid="peak"[^>]*>10\.00 at \d\d-\d\d \d\d:00</);
  assert.match(html, /data-name="CapacityHeatmap"/);
  const one = await w.app.request("/capacity?node=node-a", {
    headers: { cookie: root.cookie },
  });
  assert.match(await one.text(), /data-testid="subject"[^>]*>mac-a</);
  const missing = await w.app.request("/capacity?node=nope", {
    headers: { cookie: root.cookie },
  });
  assert.equal(missing.status, 404);
  await missing.body?.cancel();

  const csv = await w.app.request("/capacity/export.csv", {
    headers: { cookie: root.cookie },
  });
  assert.equal(csv.status, 200);
  assert.match(csv.headers.get("content-type")!, /^text\/csv/);
  const lines = (await csv.text()).split("\r\n");
  assert.equal(lines[0], CAPACITY_CSV_HEAD.join(","));
  const report = await capacityReport(w.store, SYSTEM);
  const hours = report.window.hours;
  assert.equal(lines.length, 1 + 2 * hours + 1, "cluster + node, hourly");
  const bucket = new Date(now - 2 * HOUR).toISOString().slice(0, 13);
  const row = (subject: string) =>
    lines.find((l) => l.startsWith(`${subject},`) && l.includes(bucket))!
      .split(",");
  assert.deepEqual(row("node-a").slice(1), [
    "mac-a",
    `${bucket}:00Z`,
    "0.0500",
    "10.000",
    "1",
    "0.0",
    "",
  ]);
  const cluster = row("cluster");
  assert.equal(cluster[3], "0.0500");
  assert.equal(cluster[5], "2", "routed: served and refused");
  assert.equal(cluster[7], "1", "refused");

  const json = await w.app.request("/capacity/export.json", {
    headers: { cookie: root.cookie },
  });
  const body = await json.json();
  assert.equal(body.cluster.refused, 1);
  assert.equal(body.nodes[0].id, "node-a");
  assert.equal(body.nodes[0].peakTokensPerSecond.value, 10);
  assert.equal(body.forecast.kind, "not_enough_data");
  assert.equal(body.cost.models[0].model, "m1");
  const viaApi = await api(w, "GET", "/capacity", w.tokens.platform);
  assert.equal((await viaApi.json()).cluster.refused, 1);
  const apiCsv = await api(w, "GET", "/capacity?format=csv", w.tokens.platform);
  assert.equal((await apiCsv.text()).split("\r\n")[0], lines[0]);
  const bad = await api(w, "GET", "/capacity?format=xml", w.tokens.platform);
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.field, "format");

  // tenant admins and viewers: refused, nothing shown
  for (const email of ["a-admin@example.com", "a-viewer@example.com"]) {
    const { cookie } = await portalLogin(w, email);
    for (
      const path of [
        "/capacity",
        "/capacity/export.csv",
        "/capacity/export.json",
      ]
    ) {
      const res = await w.app.request(path, { headers: { cookie } });
      const text = await res.text();
      assert.equal(res.status, 403, `${email} ${path}`);
      assert.ok(!text.includes("mac-a"), `${email} ${path} leaked a node`);
    }
  }
  for (const token of [w.tokens.adminA, w.tokens.viewerA]) {
    const res = await api(w, "GET", "/capacity", token);
    assert.equal(res.status, 403);
    await res.body?.cancel();
  }
  await w.close();
});

Deno.test({
  name:
    "a real gateway meters each request's wait for a node slot and its refusal for lack of capacity",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const w = await createWorld({
      gateway: { router: { queueMax: 1, queueTimeoutMs: 30_000 } },
      fleetRefreshMs: 50,
    });
    const up = startFakeUpstream({ models: ["tiny-chat"] });
    let node: Awaited<ReturnType<typeof startNodeWorker>> | null = null;
    const server = Deno.serve(
      { port: 0, hostname: "127.0.0.1", onListen: () => {} },
      (req, info) => w.app.fetch(req, { remoteAddr: info.remoteAddr }),
    );
    const base = `http://127.0.0.1:${server.addr.port}`;
    try {
      await w.orchard.gateway.start();
      const { key } = await createApiKey(w.store, SYSTEM, w.tenantA.id, {
        name: "k",
      });
      const { token } = await createJoinToken(w.store, SYSTEM, { uses: 1 });
      node = await startNodeWorker({
        gatewayUrl: base,
        joinToken: token,
        engine: "openai",
        upstreamUrl: up.url,
        port: 0,
        host: "127.0.0.1",
        name: "mac-a",
        slots: 1,
        stateDir: await Deno.makeTempDir(),
        heartbeatMs: 100,
      });
      await until(
        "a healthy node with 1 slot",
        () =>
          w.orchard.fleet.nodes().some((n) =>
            n.state === "healthy" && n.stats.slots === 1
          ),
        10_000,
      );
      const chat = (content: string, stream = false) =>
        fetch(`${base}/v1/chat/completions`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${key}`,
            "content-type": "application/json",
          },
          body: JSON.stringify({
            model: "tiny-chat",
            stream,
            max_tokens: 4,
            messages: [{ role: "user", content }],
          }),
        });
      // the one slot held; the next request waits; the one after is refused
      const holding = await chat("hold", true);
      await up.held;
      const waiting = chat("after the hold");
      await until(
        "a request waiting",
        () => w.orchard.gateway.core.router.queued === 1,
      );
      const refused = await chat("no room");
      assert.equal(refused.status, 503);
      assert.equal((await refused.json()).error.code, "server_busy");
      await new Promise((r) => setTimeout(r, 150));
      up.release();
      await holding.body?.cancel();
      const served = await waiting;
      assert.equal(served.status, 200);
      await served.body?.cancel();
      await w.orchard.gateway.idle();
      const { items } = await listUsageRecords(w.store, w.tenantA.id);
      const byStatus = (s: number) => items.filter((r) => r.status === s);
      assert.equal(byStatus(503).length, 1);
      assert.equal(byStatus(503)[0]!.refused, "queue_full");
      const ok = byStatus(200);
      assert.equal(ok.length, 2);
      assert.ok(ok.every((r) => r.slots === 1 && r.nodeId !== null));
      const waited = ok.find((r) => (r.queueMs ?? 0) > 0);
      assert.ok(waited && waited.queueMs! >= 100, `waited ${waited?.queueMs}`);
      const report = await capacityReport(w.store, SYSTEM);
      assert.equal(report.cluster.refused, 1);
      assert.equal(report.cluster.queued, 1);
      assert.equal(report.cluster.routed, 3);
      assert.equal(report.nodes[0]!.requests, 2);
      assert.ok(report.nodes[0]!.busyShare! > 0);
    } finally {
      await node?.close();
      await up.close();
      await server.shutdown();
      await w.close();
    }
  },
});

function close(a: number, b: number): boolean {
  return Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a), Math.abs(b));
}

Deno.test("capacityReport() counts a spanning instance's slots once, and its members busy while it works", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  try {
    const enrolled = Date.UTC(2026, 0, 1);
    for (const id of ["node-a", "node-b", "node-c"]) {
      await seedNode(store, id, id.replace("node", "mac"), enrolled, 4);
    }
    // node-a and node-b front one Exo instance on both Macs; node-c serves alone
    for (const id of ["node-a", "node-b"]) {
      const st = (await kv.get<NodeStatus>(k.nodeStatus(id))).value!;
      await kv.set(k.nodeStatus(id), {
        ...st,
        models: [{
          id: "big",
          loaded: true,
          kind: "chat",
          instance: {
            id: "exo:i1",
            kind: "exo",
            serves: true,
            state: "ready",
            members: [{ exoNodeId: "A" }, { exoNodeId: "B" }],
          },
        }],
      });
    }
    // an hour on the instance, taken by node-a: node-b was just as busy
    await writeUsage(store, [
      rec(BUSY_HOUR, {
        model: "big",
        nodeId: "node-a",
        members: ["node-b"],
        latencyMs: 3_600_000,
        slots: 4,
      }),
    ]);
    const r = await capacityReport(store, SYSTEM, NOW);
    assert.equal(r.cluster.slots, 8, "the instance's 4 and node-c's 4");
    const node = (id: string) => r.nodes.find((n) => n.id === id)!;
    assert.equal(node("node-a").requests, 1);
    assert.equal(
      node("node-b").requests,
      0,
      "requests stay the serving node's",
    );
    assert.ok(node("node-b").busyShare! > 0);
    assert.equal(node("node-b").busyShare, node("node-a").busyShare);
    assert.equal(node("node-c").busyShare, 0);
  } finally {
    kv.close();
  }
});
