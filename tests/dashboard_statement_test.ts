/** Chargeback: money parsing, pricing settings, statement math and CSV, through the service layer, the portal and the admin API. */
import assert from "node:assert/strict";
import { listAudit } from "../store/audit.ts";
import {
  formatMoney,
  moneyJson,
  moneyText,
  parseMoney,
  perMillion,
  toCents,
} from "../store/money.ts";
import { getPricing, setPricing } from "../store/pricing.ts";
import { SYSTEM } from "../store/principal.ts";
import { buildStatement, csvField, statementCsv } from "../store/statements.ts";
import { updateTenant } from "../store/tenants.ts";
import { k } from "../store/kv_keys.ts";
import type { UsageRecord } from "../store/usage.ts";
import { writeUsage } from "../store/usage_rollups.ts";
import { api, createWorld, portalLogin, type TestWorld } from "./_helpers.ts";

const PRICING = {
  currency: "eur",
  models: [{
    model: "tiny",
    promptPerMillion: "0.50",
    completionPerMillion: "1.5",
  }],
  cluster: {
    hardwarePricePerNode: "3600",
    amortisationMonths: 36,
    idleWatts: 10,
    busyWatts: 60,
    tariffPerKwh: "0.30",
  },
};

function rec(
  tenantId: string,
  over: Partial<UsageRecord>,
): UsageRecord {
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

/** September 2026 (720 h): A uses 3 of node n1's 4 busy hours. */
async function seed(w: TestWorld) {
  await setPricing(w.store, SYSTEM, PRICING);
  await writeUsage(w.store, [
    rec(w.tenantA.id, {
      promptTokens: 1_500_000,
      completionTokens: 400_000,
      latencyMs: 7_200_000,
    }),
    rec(w.tenantA.id, {
      promptTokens: 500_000,
      completionTokens: 600_000,
      latencyMs: 3_600_000,
    }),
    rec(w.tenantB.id, { promptTokens: 10, latencyMs: 3_600_000 }),
    // another month and an unpriced model
    rec(w.tenantA.id, { at: "2026-08-31T23:59:59.000Z", promptTokens: 99 }),
    rec(w.tenantA.id, { model: "free-model", promptTokens: 7, nodeId: null }),
  ]);
}

Deno.test("parseMoney() reads decimals exactly and refuses the rest; formatMoney() rounds half-up", () => {
  assert.equal(parseMoney("0.1"), 100_000);
  assert.equal(parseMoney("1234.567891"), 1_234_567_891);
  assert.equal(parseMoney(" 12 "), 12_000_000);
  assert.equal(parseMoney("3.1000000"), 3_100_000);
  for (const bad of ["-1", "1e3", "", "1.2345678", "abc", "1,5", null]) {
    assert.throws(() => parseMoney(bad), /at most 6 decimals/, String(bad));
  }
  // a number is ambiguous between units and micro-units: refused
  assert.throws(
    () => parseMoney(400_000_000, "promptPerMillion"),
    /^ValidationError: promptPerMillion: must be a decimal string in major units like "0\.40", not a number/,
  );
  // moneyText is exact, and parseMoney reads it back
  for (
    const micro of [0, 1, 10, 100_000, 400_000_000, 123_456, 1_234_567_891]
  ) {
    assert.equal(parseMoney(moneyText(micro)), micro, String(micro));
  }
  assert.equal(moneyText(400_000_000), "400.00");
  assert.equal(moneyText(123_456), "0.123456");
  assert.equal(moneyText(2_875_000), "2.875");
  assert.deepEqual(
    moneyJson({
      tokens: 5,
      tokensMicro: 1_500_000,
      lines: [{ amountMicro: 10_000, unitPriceMicro: null }],
    }),
    {
      tokens: 5,
      tokensAmount: "1.50",
      lines: [{ amount: "0.01", unitPrice: null }],
    },
  );
  assert.equal(formatMoney(5_000), "0.01");
  assert.equal(formatMoney(4_999), "0.00");
  assert.equal(formatMoney(1_234_567, 4), "1.2346");
  assert.equal(toCents(1_664_999.9999998), 1_670_000);
  // 10^12 tokens at 123.456789 per 1M stays exact in BigInt.
  assert.equal(perMillion(1e12, 123_456_789), 123_456_789_000_000);
});

Deno.test("buildStatement() charges tokens per model and the node-hours the tenant kept busy; idle capacity is nobody's", async () => {
  const w = await createWorld();
  try {
    await seed(w);
    const s = await buildStatement(w.store, SYSTEM, w.tenantA.id, "2026-09");
    assert.equal(s.currency, "EUR");
    assert.equal(s.period.complete, true);
    assert.equal(s.promptTokens, 2_000_007);
    assert.equal(s.completionTokens, 1_000_000);
    assert.equal(s.requests, 3);
    assert.equal(s.busyMs, 10_800_000);
    const by = (kind: string) =>
      s.lines.filter((l) => l.kind === kind).map((l) => [
        l.quantity,
        l.amountMicro,
      ]);
    // 2M prompt tokens × 0.50 / 1M = 1.00; the unpriced model is free (noted).
    assert.deepEqual(by("prompt_tokens"), [[7, 0], [2_000_000, 1_000_000]]);
    assert.deepEqual(by("completion_tokens"), [[1_000_000, 1_500_000]]);
    assert.match(s.notes.join(" "), /No price is set for model free-model/);
    // Node n1 was busy 4 h of its 720: A kept it busy 3 h at 60 W = 0.18 kWh
    // × 0.30 = 0.054 → 0.05; the 716 idle hours are the provider's.
    assert.deepEqual(by("energy"), [[0.18, 50_000]]);
    // Hardware: 3600 / 36 months = 100 per node-month = 0.1389 per hour;
    // A pays its 3 busy hours: 0.4167 → 0.42.
    assert.deepEqual(by("hardware"), [[3, 420_000]]);
    assert.equal(s.totalMicro, 2_970_000);
    assert.match(s.notes.join(" "), /idle capacity is the provider's/);
    assert.equal(
      s.totalMicro,
      s.lines.reduce((a, l) => a + l.amountMicro, 0),
    );
    const b = await buildStatement(w.store, SYSTEM, w.tenantB.id, "2026-09");
    assert.deepEqual(
      b.lines.filter((l) => l.kind === "hardware").map((l) => l.amountMicro),
      [140_000], // 1 busy hour
    );
    const aug = await buildStatement(w.store, SYSTEM, w.tenantA.id, "2026-08");
    assert.equal(aug.promptTokens, 99);
    assert.equal(aug.totalMicro, 0);
  } finally {
    await w.close();
  }
});

Deno.test("buildStatement() refuses malformed and future months and hides other tenants", async () => {
  const w = await createWorld();
  try {
    for (const m of ["2026-13", "26-01", "2026-1", "x"]) {
      await assert.rejects(
        buildStatement(w.store, SYSTEM, w.tenantA.id, m),
        /must be YYYY-MM/,
      );
    }
    await assert.rejects(
      buildStatement(w.store, SYSTEM, w.tenantA.id, "2999-01"),
      /has not started/,
    );
    const now = Date.UTC(2026, 8, 16); // half of September
    await seed(w);
    const half = await buildStatement(
      w.store,
      SYSTEM,
      w.tenantA.id,
      "2026-09",
      now,
    );
    assert.equal(half.period.complete, false);
    // half the month elapsed: A still pays its 3 busy hours, nothing more
    const hw = half.lines.find((l) => l.kind === "hardware")!;
    assert.equal(hw.amountMicro, 420_000);
    const res = await api(
      w,
      "GET",
      `/statements?tenant=${w.tenantB.id}&month=2026-09`,
      w.tokens.adminA,
    );
    assert.equal(res.status, 404);
  } finally {
    await w.close();
  }
});

Deno.test("statementCsv() quotes commas and quotes and defuses formulas", async () => {
  assert.equal(csvField('a,"b"', true), '"a,""b"""');
  assert.equal(csvField("=SUM(A1)", true), "'=SUM(A1)");
  assert.equal(csvField("line\nbreak"), '"line\nbreak"');
  assert.equal(csvField(-5), "-5");
  const w = await createWorld();
  try {
    await seed(w);
    await updateTenant(w.store, SYSTEM, w.tenantA.id, {
      name: '=Acme, "Robotics"',
    });
    const csv = statementCsv(
      await buildStatement(w.store, SYSTEM, w.tenantA.id, "2026-09"),
    );
    const lines = csv.split("\r\n");
    assert.equal(
      lines[0],
      "tenant,month,currency,kind,description,quantity,unit,unit_price,amount",
    );
    assert.ok(lines.every((l, i) => i === lines.length - 1 || l.length > 0));
    assert.ok(lines[1]!.startsWith(`"'=Acme, ""Robotics""",2026-09,EUR,`));
    assert.equal(
      lines.at(-2),
      `"'=Acme, ""Robotics""",2026-09,EUR,total,Total,,,,2.97`,
    );
    assert.ok(
      lines.some((l) =>
        l.endsWith(",tiny prompt tokens,2000000,tokens,0.500000,1.00")
      ),
    );
  } finally {
    await w.close();
  }
});

Deno.test("GET /api/admin/v1/statements answers JSON or CSV and readable 400s", async () => {
  const w = await createWorld();
  try {
    await seed(w);
    const json = await api(
      w,
      "GET",
      `/statements?tenant=acme&month=2026-09`,
      w.tokens.platform,
    );
    assert.equal(json.status, 200);
    // money in the admin API: decimal strings in major units, never micro-units
    const body = await json.json();
    assert.equal(body.total, "2.97");
    assert.equal(body.currency, "EUR");
    assert.equal(body.totalMicro, undefined);
    assert.ok(
      body.lines.every((l: { amount: unknown }) =>
        typeof l.amount === "string"
      ),
    );
    const csv = await api(
      w,
      "GET",
      `/statements?month=2026-09&format=csv`,
      w.tokens.viewerA,
    );
    assert.equal(csv.status, 200);
    assert.match(csv.headers.get("content-type")!, /^text\/csv/);
    assert.match(
      csv.headers.get("content-disposition")!,
      /statement-acme-2026-09\.csv/,
    );
    assert.match(await csv.text(), /,total,Total,,,,2\.97\r\n$/);
    for (
      const [q, field] of [
        ["month=2026-09", "tenant"],
        ["tenant=acme&month=2026-9", "month"],
        ["tenant=acme&month=2026-09&format=xml", "format"],
      ]
    ) {
      const res = await api(w, "GET", `/statements?${q}`, w.tokens.platform);
      assert.equal(res.status, 400, q);
      assert.equal((await res.json()).error.field, field);
    }
  } finally {
    await w.close();
  }
});

Deno.test("pricing settings: validated, audited, platform admins only, portal form shows readable errors", async () => {
  const w = await createWorld();
  try {
    await assert.rejects(
      setPricing(w.store, SYSTEM, { ...PRICING, currency: "euro" }),
      /currency: must be a 3-letter ISO 4217 code/,
    );
    await assert.rejects(
      setPricing(w.store, SYSTEM, {
        ...PRICING,
        cluster: { ...PRICING.cluster, idleWatts: 100 },
      }),
      /busy power must be at least the idle power/,
    );
    await assert.rejects(
      setPricing(w.store, SYSTEM, {
        ...PRICING,
        models: [PRICING.models[0], PRICING.models[0]],
      }),
      /each model may be priced only once/,
    );
    const saved = await setPricing(w.store, SYSTEM, PRICING);
    assert.equal(saved.models[0]!.promptPerMillion, 500_000);
    assert.equal((await getPricing(w.store)).cluster.tariffPerKwh, 300_000);
    const audit = await listAudit(w.kv, SYSTEM, {});
    assert.ok(audit.items.some((e) => e.action === "pricing.set"));

    const put = await api(
      w,
      "PUT",
      "/settings/pricing",
      w.tokens.adminA,
      PRICING,
    );
    assert.equal(put.status, 403);
    const bad = await api(w, "PUT", "/settings/pricing", w.tokens.platform, {
      ...PRICING,
      models: [{ ...PRICING.models[0], promptPerMillion: "-2" }],
    });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.field, "models.0.promptPerMillion");

    const admin = await portalLogin(w, "root@example.com");
    const form = new URLSearchParams({
      _csrf: admin.csrf,
      currency: "CHF",
      hardwarePricePerNode: "4000",
      amortisationMonths: "24",
      idleWatts: "12",
      busyWatts: "90",
      tariffPerKwh: "0.25",
      model_0: "tiny",
      prompt_0: "abc",
      completion_0: "1",
    });
    const post = (body: URLSearchParams) =>
      w.app.request("/settings", {
        method: "POST",
        headers: {
          cookie: admin.cookie,
          origin: "http://localhost",
          "content-type": "application/x-www-form-urlencoded",
        },
        body,
      });
    const res = await post(form);
    assert.equal(res.status, 400);
    const html = await res.text();
    assert.match(
      html,
      /Model row 1, prompt price: must be a non-negative amount/,
    );
    assert.match(html, /value="abc"/);
    form.set("prompt_0", "0.2");
    const ok = await post(form);
    assert.equal(ok.status, 303);
    assert.equal(ok.headers.get("location"), "/settings");
    const savedPage = await w.app.request("/settings", {
      headers: {
        cookie: [
          admin.cookie,
          ...ok.headers.getSetCookie().map((c) => c.split(";")[0]!),
        ].join("; "),
      },
    });
    assert.match(await savedPage.text(), /Settings saved/);
    assert.equal((await getPricing(w.store)).currency, "CHF");
    const viewer = await portalLogin(w, "a-viewer@example.com");
    const denied = await w.app.request("/settings", {
      headers: { cookie: viewer.cookie },
    });
    assert.equal(denied.status, 403);
  } finally {
    await w.close();
  }
});

Deno.test("buildStatement() bills a node dedicated to a tenant for every enrolled hour to that tenant alone", async () => {
  const w = await createWorld();
  try {
    await seed(w);
    // n2, enrolled on 2026-09-16 (15 days = 360 h of September), dedicated to B.
    await w.store.kv.set(k.node("n2"), {
      id: "n2",
      name: "studio-2",
      url: "http://n2",
      engine: "openai",
      publicJwk: {},
      keyThumbprint: "t",
      drain: false,
      models: [],
      enrolledAt: "2026-09-16T00:00:00.000Z",
      joinTokenId: "j",
      version: null,
      dedicatedTo: w.tenantB.id,
    });
    const b = await buildStatement(w.store, SYSTEM, w.tenantB.id, "2026-09");
    const n2 = b.lines.filter((l) => l.description.includes("studio-2"));
    // 3600 / 36 months / 720 h × 360 h = 50.00, though B never used it.
    assert.deepEqual(
      n2.filter((l) => l.kind === "hardware").map((
        l,
      ) => [l.quantity, l.amountMicro]),
      [[360, 50_000_000]],
    );
    assert.match(
      b.notes.join(" "),
      /dedicated to you are billed for every hour/,
    );
    const a = await buildStatement(w.store, SYSTEM, w.tenantA.id, "2026-09");
    assert.ok(!a.lines.some((l) => l.description.includes("studio-2")));
  } finally {
    await w.close();
  }
});
