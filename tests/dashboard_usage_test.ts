/** Usage reports: the admin API, the /usage page and quota status, read from rollups. */
import assert from "node:assert/strict";
import { setTenantLimits } from "../store/limits.ts";
import {
  formatMoney,
  parseMoney,
  perMillion,
  toCents,
} from "../store/money.ts";
import { setPricing } from "../store/pricing.ts";
import { buildStatement } from "../store/statements.ts";
import { SYSTEM } from "../store/principal.ts";
import { Admitter, limitPlan } from "../store/quota/mod.ts";
import type { UsageRecord } from "../store/usage.ts";
import { writeUsage } from "../store/usage_rollups.ts";
import { parseUsageQuery } from "../store/usage_report.ts";
import { api, createWorld, portalLogin, type TestWorld } from "./_helpers.ts";

const HOUR = 3_600_000;

function rec(w: TestWorld, i: number, over: Partial<UsageRecord> = {}) {
  return {
    id: `r${i}`,
    at: new Date(Date.UTC(2026, 9, 5, 10) + i * HOUR).toISOString(),
    requestId: `req${i}`,
    tenantId: w.tenantA.id,
    keyId: "key1",
    model: "tiny",
    nodeId: "n1",
    endpoint: "chat" as const,
    promptTokens: 10,
    completionTokens: 5,
    latencyMs: 120,
    ttftMs: 40,
    status: 200,
    outcome: "ok" as const,
    ...over,
  };
}

async function seed(w: TestWorld) {
  await writeUsage(w.store, [
    rec(w, 0),
    rec(w, 1),
    rec(w, 1, { id: "r1b", keyId: "key2", model: "big", latencyMs: 3000 }),
    rec(w, 2, {
      status: 429,
      outcome: "error",
      completionTokens: 0,
      promptTokens: 0,
      nodeId: null,
      ttftMs: null,
    }),
    rec(w, 3, {
      status: 503,
      outcome: "error",
      completionTokens: 0,
      nodeId: null,
      ttftMs: null,
    }),
    rec(w, 0, { id: "rb", tenantId: w.tenantB.id, promptTokens: 1000 }),
  ]);
}

const RANGE = "from=2026-10-05T10:00:00Z&to=2026-10-05T13:59:59Z";

Deno.test("GET /api/admin/v1/usage returns totals and one point per hour from the rollups", async () => {
  const w = await createWorld();
  try {
    await seed(w);
    const res = await api(
      w,
      "GET",
      `/usage?tenant=acme&${RANGE}&granularity=hour`,
      w.tokens.platform,
    );
    assert.equal(res.status, 200);
    const body = await res.json();
    assert.equal(body.query.tenantId, w.tenantA.id);
    assert.deepEqual(body.series.map((p: { requests: number }) => p.requests), [
      1,
      2,
      1,
      1,
    ]);
    assert.equal(body.totals.requests, 5);
    assert.equal(body.totals.promptTokens, 40);
    assert.equal(body.totals.completionTokens, 15);
    assert.equal(body.totals.errors, 2);
    assert.equal(body.totals.limited, 1);
    assert.equal(body.totals.latencyP50Ms, 250);
    assert.equal(body.totals.latencyP95Ms, 5000);
    assert.equal(body.totals.ttftP50Ms, 50);
    const byKey = await (await api(
      w,
      "GET",
      `/usage?tenant=acme&key=key2&${RANGE}`,
      w.tokens.adminA,
    )).json();
    assert.equal(byKey.totals.requests, 1);
    const byModel = await (await api(
      w,
      "GET",
      `/usage?tenant=acme&model=big&${RANGE}`,
      w.tokens.viewerA,
    )).json();
    assert.equal(byModel.totals.latencyMsSum, 3000);
    const cluster = await (await api(
      w,
      "GET",
      `/usage?${RANGE}&granularity=day`,
      w.tokens.platform,
    )).json();
    assert.equal(cluster.series.length, 1);
    assert.equal(cluster.totals.promptTokens, 1040);
    // A tenant token without a tenant gets its own tenant, never the cluster.
    const own = await (await api(w, "GET", `/usage?${RANGE}`, w.tokens.adminA))
      .json();
    assert.equal(own.query.tenantId, w.tenantA.id);
    assert.equal(own.totals.promptTokens, 40);
  } finally {
    await w.close();
  }
});

Deno.test("GET /api/admin/v1/usage refuses other tenants (404) and bad queries (400 with the field)", async () => {
  const w = await createWorld();
  try {
    await seed(w);
    for (const t of [w.tenantB.id, "globex"]) {
      const res = await api(w, "GET", `/usage?tenant=${t}`, w.tokens.adminA);
      assert.equal(res.status, 404);
      assert.doesNotMatch(await res.text(), /1000/);
    }
    for (
      const [q, field] of [
        ["granularity=week", "granularity"],
        ["from=yesterday", "from"],
        ["from=2026-10-05&to=2026-10-01", "from"],
        ["from=2026-01-01&to=2026-10-01&granularity=hour", "to"],
        ["key=key1", "key"],
      ]
    ) {
      const res = await api(w, "GET", `/usage?${q}`, w.tokens.platform);
      assert.equal(res.status, 400, q);
      const body = await res.json();
      assert.equal(body.error.field, field, q);
      assert.equal(typeof body.error.message, "string");
    }
    const anon = await api(w, "GET", "/usage", null);
    assert.equal(anon.status, 401);
  } finally {
    await w.close();
  }
});

Deno.test("parseUsageQuery() defaults to the last 24 h by hour and includes the whole `to` day", () => {
  const now = Date.UTC(2026, 9, 5, 12);
  const q = parseUsageQuery({}, now);
  assert.equal(q.granularity, "hour");
  assert.equal(q.to - q.from, 24 * HOUR - 1);
  const d = parseUsageQuery({
    from: "2026-10-01",
    to: "2026-10-03",
    granularity: "day",
  }, now);
  assert.equal(new Date(d.to).toISOString(), "2026-10-03T23:59:59.999Z");
});

Deno.test("/usage renders charts with data, top tenants, quota status (also on the tenant page); a tenant viewer sees only their tenant", async () => {
  const w = await createWorld();
  try {
    await seed(w);
    await setTenantLimits(w.store, SYSTEM, w.tenantA.id, {
      tokensPerDay: 100,
      rpm: 1000,
    });
    const admitted = await new Admitter(w.store).admit({
      plan: limitPlan(w.tenantA.id, "key1", {
        rpm: 1000,
        tpm: null,
        concurrency: null,
        tokensPerDay: 100,
        tokensPerMonth: null,
      }, null),
      tokens: 85,
      minTokens: 85,
      reclaimTokens: 85,
      ttlMs: 60_000,
    });
    assert.ok(admitted.ok);
    const admin = await portalLogin(w, "root@example.com");
    const get = (path: string, cookie = admin.cookie) =>
      w.app.request(path, { headers: { cookie } });
    const cluster = await get(`/usage?${RANGE}&granularity=hour`);
    assert.equal(cluster.status, 200);
    const html = await cluster.text();
    const props = [
      ...html.matchAll(/data-name="UsageChart" data-props="([^"]+)"/g),
    ]
      .map((m) => JSON.parse(m[1]!.replaceAll("&quot;", '"')));
    assert.equal(props.length, 3);
    assert.deepEqual(props[0].datasets[2].data, [2, 2, 1, 1]);
    assert.deepEqual(props[2].datasets[0].data, [0, 0, 1, 0]);
    assert.match(html, /Top tenants in 2026-10/);
    const top = html.slice(html.indexOf("Top tenants"));
    assert.ok(top.indexOf("Globex") < top.indexOf("Acme"), "B used more");

    const tenant = await (await get(`/usage?tenant=${w.tenantA.id}&range=24h`))
      .text();
    assert.match(tenant, /data-quota="tokensPerDay" class="hot"/);
    assert.match(tenant, />85%</);
    assert.match(tenant, /data-quota="rpm"><td data-label="Limit">/);

    const tenantPage = await (await get(`/tenants/${w.tenantA.id}`)).text();
    assert.match(tenantPage, /data-quota="tokensPerDay" class="hot"/);

    const viewer = await portalLogin(w, "a-viewer@example.com");
    const own = await get(`/usage?${RANGE}`, viewer.cookie);
    assert.equal(own.status, 200);
    const ownHtml = await own.text();
    assert.match(ownHtml, /Acme/);
    assert.doesNotMatch(ownHtml, /Globex|Top tenants/);
    const other = await get(`/usage?tenant=${w.tenantB.id}`, viewer.cookie);
    assert.equal(other.status, 404);
    assert.doesNotMatch(await other.text(), /Globex/);
    const bad = await get(`/usage?granularity=minute`);
    assert.equal(bad.status, 400);
    assert.match(await bad.text(), /granularity: must be hour or day/);
  } finally {
    await w.close();
  }
});

Deno.test("the usage page's cost of a calendar month is the statement's token lines, per key and per model too", async () => {
  const w = await createWorld();
  try {
    await setPricing(w.store, SYSTEM, {
      currency: "EUR",
      models: [
        {
          model: "tiny",
          promptPerMillion: "0.333",
          completionPerMillion: "1.7",
        },
        {
          model: "big",
          promptPerMillion: "12.5",
          completionPerMillion: "37.49",
        },
      ],
      cluster: {
        hardwarePricePerNode: "0",
        amortisationMonths: 36,
        idleWatts: 0,
        busyWatts: 0,
        tariffPerKwh: "0",
      },
    });
    const at = (d: number, h = 12) =>
      new Date(Date.UTC(2026, 8, d, h)).toISOString();
    await writeUsage(w.store, [
      rec(w, 0, {
        id: "s1",
        at: at(1, 0),
        promptTokens: 123_457,
        completionTokens: 98_765,
      }),
      rec(w, 0, {
        id: "s2",
        at: at(15),
        keyId: "key2",
        promptTokens: 7_777,
        completionTokens: 3_333,
      }),
      rec(w, 0, {
        id: "s3",
        at: at(30, 23),
        model: "big",
        promptTokens: 45_001,
        completionTokens: 12_345,
      }),
      rec(w, 0, {
        id: "s4",
        at: at(20),
        keyId: "key2",
        model: "big",
        promptTokens: 999,
        completionTokens: 1,
      }),
      rec(w, 0, { id: "s5", at: at(21), model: "unpriced", promptTokens: 50 }),
      // outside the month, and another tenant
      rec(w, 0, {
        id: "s6",
        at: "2026-08-31T23:59:59.000Z",
        promptTokens: 1e6,
      }),
      rec(w, 0, {
        id: "s7",
        at: "2026-10-01T00:00:00.000Z",
        promptTokens: 1e6,
      }),
      rec(w, 0, {
        id: "s8",
        at: at(10),
        tenantId: w.tenantB.id,
        promptTokens: 1e6,
      }),
    ]);
    const statement = await buildStatement(
      w.store,
      SYSTEM,
      w.tenantA.id,
      "2026-09",
    );
    const tokenLines = statement.lines.filter((l) =>
      l.kind === "prompt_tokens" || l.kind === "completion_tokens"
    );
    const total = tokenLines.reduce((a, l) => a + l.amountMicro, 0);
    assert.ok(total > 0);
    const month = "from=2026-09-01&to=2026-09-30";
    for (const g of ["day", "hour"]) {
      const res = await api(
        w,
        "GET",
        `/usage?tenant=acme&${month}&granularity=${g}`,
        w.tokens.adminA,
      );
      assert.equal(res.status, 200);
      const { spend } = await res.json();
      assert.equal(parseMoney(spend.total), total, `by ${g}`);
      assert.equal(spend.currency, "EUR");
      for (const m of spend.byModel) {
        const mine = tokenLines.filter((l) =>
          l.description.startsWith(`${m.model} `)
        );
        assert.equal(
          parseMoney(m.amount),
          mine.reduce((a, l) => a + l.amountMicro, 0),
          m.model,
        );
      }
      const byKey = Object.fromEntries(
        spend.byKey.map((k: { keyId: string; amount: string }) => [
          k.keyId,
          parseMoney(k.amount),
        ]),
      );
      // key2: 7,777 × 0.333 + 3,333 × 1.7 (tiny), 999 × 12.5 + 1 × 37.49 (big)
      assert.equal(
        byKey.key2,
        toCents(perMillion(7_777, 333_000)) +
          toCents(perMillion(3_333, 1_700_000)) +
          toCents(perMillion(999, 12_500_000)) +
          toCents(perMillion(1, 37_490_000)),
      );
      assert.ok(byKey.key1 > 0);
    }
    const key2 = await (await api(
      w,
      "GET",
      `/usage?tenant=acme&key=key2&${month}&granularity=day`,
      w.tokens.platform,
    )).json();
    assert.deepEqual(
      key2.spend.byModel.map((m: { model: string }) => m.model),
      ["big", "tiny"],
    );
    const admin = await portalLogin(w, "a-admin@example.com");
    const html = await (await w.app.request(
      `/usage?${month}&granularity=day`,
      { headers: { cookie: admin.cookie } },
    )).text();
    assert.match(
      html,
      new RegExp(`data-testid="usage-cost">${formatMoney(total)} EUR<`),
    );
    assert.match(html, /data-spend-key="key2"/);
    assert.match(html, /No price is set for model unpriced/);
    assert.doesNotMatch(html, /Globex/);
  } finally {
    await w.close();
  }
});
