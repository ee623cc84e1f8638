/**
 * Chargeback allocation end to end: the rule chosen in settings (portal form)
 * changes how a shared node's busy hours are split in the tenants' statements
 * (admin API) and the cluster's month (portal page and admin API), where idle
 * capacity is the provider's own line and everything adds up. README's worked
 * example, with these numbers.
 */
import assert from "node:assert/strict";
import { clusterChargeback } from "../store/chargeback.ts";
import { k } from "../store/kv_keys.ts";
import { parseMoney } from "../store/money.ts";
import { setPricing } from "../store/pricing.ts";
import { SYSTEM } from "../store/principal.ts";
import { buildStatement } from "../store/statements.ts";
import type { UsageRecord } from "../store/usage.ts";
import { writeUsage } from "../store/usage_rollups.ts";
import { api, createWorld, portalLogin, type TestWorld } from "./_helpers.ts";

const MONTH = "2026-09";

/** 3,600 per node over 36 months, 10 W idle, 60 W busy, 0.30 per kWh; tokens free. */
const PRICING = {
  currency: "EUR",
  models: [],
  cluster: {
    hardwarePricePerNode: "3600",
    amortisationMonths: 36,
    idleWatts: 10,
    busyWatts: 60,
    tariffPerKwh: "0.30",
  },
};

function rec(tenantId: string, over: Partial<UsageRecord>): UsageRecord {
  return {
    id: crypto.randomUUID(),
    at: "2026-09-10T12:00:00.000Z",
    requestId: "req",
    tenantId,
    keyId: "k1",
    model: "tiny",
    nodeId: "n1",
    endpoint: "chat",
    promptTokens: 0,
    completionTokens: 0,
    latencyMs: 0,
    ttftMs: null,
    status: 200,
    outcome: "ok",
    ...over,
  };
}

/**
 * Node n1 (enrolled before September, shared) busy 4 h of 720: A 3 h with
 * 250,000 tokens, B 1 h with 750,000. Node n2 enrolled on 2026-09-16 and
 * never used: 360 idle hours.
 */
async function seed(w: TestWorld) {
  await setPricing(w.store, SYSTEM, PRICING);
  const node = (id: string, enrolledAt: string) =>
    w.store.kv.set(k.node(id), {
      id,
      name: `studio-${id}`,
      url: `http://${id}`,
      engine: "openai",
      publicJwk: {},
      keyThumbprint: "t",
      drain: false,
      models: [],
      enrolledAt,
      joinTokenId: "j",
      version: null,
      dedicatedTo: null,
    });
  await node("n1", "2026-08-01T00:00:00.000Z");
  await node("n2", "2026-09-16T00:00:00.000Z");
  await writeUsage(w.store, [
    rec(w.tenantA.id, {
      promptTokens: 200_000,
      completionTokens: 50_000,
      latencyMs: 3 * 3_600_000,
    }),
    rec(w.tenantB.id, {
      promptTokens: 700_000,
      completionTokens: 50_000,
      latencyMs: 3_600_000,
    }),
  ]);
}

/** A statement's node lines as [kind, amount in cents]. */
async function nodeLines(w: TestWorld, tenant: string) {
  const res = await api(
    w,
    "GET",
    `/statements?tenant=${tenant}&month=${MONTH}`,
    w.tokens.platform,
  );
  assert.equal(res.status, 200);
  const s = await res.json();
  return {
    total: parseMoney(s.total),
    lines: (s.lines as { kind: string; amount: string }[])
      .filter((l) => l.kind === "energy" || l.kind === "hardware")
      .map((l) => [l.kind, parseMoney(l.amount) / 10_000]),
  };
}

Deno.test("the allocation rule chosen in settings changes the statements; idle capacity stays the provider's and the month adds up", async () => {
  const w = await createWorld();
  try {
    await seed(w);
    // By busy time (the default): A 3 h, B 1 h.
    assert.deepEqual(await nodeLines(w, "acme"), {
      total: 470_000,
      lines: [["energy", 5], ["hardware", 42]],
    });
    assert.deepEqual(await nodeLines(w, "globex"), {
      total: 160_000,
      lines: [["energy", 2], ["hardware", 14]],
    });
    const before = await clusterChargeback(w.store, SYSTEM, MONTH);
    assert.equal(before.rule, "busy_time");
    // n1: 716 idle h → 99.44 + 2.15; n2: 360 idle h → 50.00 + 1.08
    assert.equal(before.idle.totalMicro, 152_670_000);
    assert.equal(before.idle.hours, 716 + 360);
    // 1.5 nodes-months of hardware (150.00) + energy (0.24 + 7.16 + 3.6 kWh × 0.30 = 3.30)
    assert.equal(before.nodeCostMicro, 153_300_000);
    assert.equal(before.totalMicro, 153_300_000);

    // The platform admin picks "share of tokens" in the portal.
    const admin = await portalLogin(w, "root@example.com");
    const page = await w.app.request("/settings", {
      headers: { cookie: admin.cookie },
    });
    const html = await page.text();
    assert.match(html, /<option value="busy_time" selected/);
    const once = /name="_once" value="([^"]+)"/.exec(html)?.[1] ?? "";
    const post = await w.app.request("/settings", {
      method: "POST",
      headers: {
        cookie: admin.cookie,
        origin: "http://localhost",
        "content-type": "application/x-www-form-urlencoded",
      },
      body: new URLSearchParams({
        _csrf: admin.csrf,
        _once: once,
        currency: "EUR",
        hardwarePricePerNode: "3600",
        amortisationMonths: "36",
        idleWatts: "10",
        busyWatts: "60",
        tariffPerKwh: "0.30",
        allocation: "tokens",
      }),
    });
    assert.equal(post.status, 303);

    // By tokens: A 25 % of the 4 busy hours, B 75 %.
    assert.deepEqual(await nodeLines(w, "acme"), {
      total: 160_000,
      lines: [["energy", 2], ["hardware", 14]],
    });
    assert.deepEqual(await nodeLines(w, "globex"), {
      total: 470_000,
      lines: [["energy", 5], ["hardware", 42]],
    });
    const after = await api(
      w,
      "GET",
      `/chargeback?month=${MONTH}`,
      w.tokens.platform,
    );
    assert.equal(after.status, 200);
    const cb = await after.json();
    assert.equal(cb.rule, "tokens");
    // money in the admin API: decimal strings in major units
    assert.equal(cb.idle.total, "152.67");
    assert.equal(cb.total, "153.30");
    // Each tenant's row is its statement's total.
    for (const t of cb.tenants) {
      const s = await buildStatement(w.store, SYSTEM, t.tenantId, MONTH);
      assert.equal(parseMoney(t.total), s.totalMicro, t.slug);
    }

    // The portal page shows the provider's line and the rule.
    const view = await w.app.request(`/chargeback/${MONTH}`, {
      headers: { cookie: admin.cookie },
    });
    assert.equal(view.status, 200);
    const text = await view.text();
    assert.match(text, /Idle capacity \(provider\)/);
    assert.match(text, /data-testid="idle-total">152\.67 EUR/);
    assert.match(text, /data-testid="rule">share of tokens/);

    // Tenants see neither the page nor the API.
    const viewer = await portalLogin(w, "a-viewer@example.com");
    const denied = await w.app.request(`/chargeback/${MONTH}`, {
      headers: { cookie: viewer.cookie },
    });
    assert.equal(denied.status, 403);
    const apiDenied = await api(
      w,
      "GET",
      `/chargeback?month=${MONTH}`,
      w.tokens.adminA,
    );
    assert.equal(apiDenied.status, 403);
    const bad = await api(
      w,
      "GET",
      `/chargeback?month=2026-9`,
      w.tokens.platform,
    );
    assert.equal(bad.status, 400);
  } finally {
    await w.close();
  }
});

Deno.test("a dedicated node's whole cost is its tenant's statement, and no idle capacity", async () => {
  const w = await createWorld();
  try {
    await seed(w);
    const n2 = (await w.store.kv.get<Record<string, unknown>>(k.node("n2")))
      .value!;
    await w.store.kv.set(k.node("n2"), { ...n2, dedicatedTo: w.tenantB.id });
    const b = await buildStatement(w.store, SYSTEM, w.tenantB.id, MONTH);
    const n2Lines = b.lines.filter((l) => l.description.includes("studio-n2"))
      .map((l) => [l.kind, l.amountMicro]);
    // 360 enrolled h: hardware 50.00; 360 h × 10 W = 3.6 kWh × 0.30 = 1.08
    assert.deepEqual(n2Lines, [["energy", 1_080_000], [
      "hardware",
      50_000_000,
    ]]);
    const cb = await clusterChargeback(w.store, SYSTEM, MONTH);
    assert.equal(cb.idle.totalMicro, 101_590_000); // n1's idle hours only
    assert.equal(cb.totalMicro, 153_300_000);
    const rowB = cb.tenants.find((t) => t.tenantId === w.tenantB.id)!;
    assert.equal(rowB.totalMicro, b.totalMicro);
  } finally {
    await w.close();
  }
});

Deno.test("a spanning instance's busy time is billed on every member: its statement has each member's lines, and none of it is idle capacity", async () => {
  const w = await createWorld();
  try {
    await setPricing(w.store, SYSTEM, PRICING);
    for (const id of ["n1", "n2"]) {
      await w.store.kv.set(k.node(id), {
        id,
        name: `studio-${id}`,
        url: `http://${id}`,
        engine: "openai",
        publicJwk: {},
        keyThumbprint: "t",
        drain: false,
        models: [],
        enrolledAt: "2026-08-01T00:00:00.000Z",
        joinTokenId: "j",
        version: null,
        dedicatedTo: null,
      });
    }
    // n1 fronts an Exo instance on n1 and n2: 2 h of A's requests.
    await writeUsage(w.store, [
      rec(w.tenantA.id, { latencyMs: 3_600_000, members: ["n2"] }),
      rec(w.tenantA.id, { latencyMs: 3_600_000, members: ["n2"] }),
    ]);
    const cb = await clusterChargeback(w.store, SYSTEM, MONTH);
    const rowA = cb.tenants.find((t) => t.tenantId === w.tenantA.id)!;
    assert.equal(rowA.nodeHours, 4, "2 h on each member");
    assert.equal(cb.idle.hours, 2 * 720 - 4);
    const a = await buildStatement(w.store, SYSTEM, w.tenantA.id, MONTH);
    const billed = (node: string) =>
      a.lines.filter((l) => l.description.includes(node)).map((l) => l.kind);
    assert.deepEqual(billed("studio-n1"), ["energy", "hardware"]);
    assert.deepEqual(billed("studio-n2"), ["energy", "hardware"]);
    assert.equal(rowA.totalMicro, a.totalMicro);
  } finally {
    await w.close();
  }
});
