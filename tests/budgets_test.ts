/**
 * Budgets, alerts and signed webhooks through the gateway: hard budgets in
 * money and tokens admit nothing past them under concurrency, thresholds
 * alert once per month, alerts reach webhook receivers with a valid
 * signature, failing receivers are retried with backoff, and the admin
 * API manages it all within each tenant.
 */
import assert from "node:assert/strict";
import { priceTinyChat } from "./_helpers.ts";
import { createHmac } from "node:crypto";
import { createWorld, type World } from "../gateway/_testing.ts";
import {
  checkBudgets,
  listAlerts,
  openAlertCount,
} from "../store/budget_alerts.ts";
import {
  budgetStatus,
  setKeyBudget,
  setTenantBudget,
} from "../store/budgets.ts";
import { createApiKey } from "../store/api_keys.ts";
import { perMillion } from "../store/money.ts";
import { setPricing } from "../store/pricing.ts";
import { type Principal, SYSTEM } from "../store/principal.ts";
import { backoffMs, WebhookDispatcher } from "../store/webhook_dispatch.ts";
import {
  fetchPinned,
  privateHost,
  publicAddress,
  validateWebhookUrl,
} from "../store/webhook_url.ts";
import {
  createWebhook,
  listDeliveries,
  verifySignature,
} from "../store/webhooks.ts";
import { writeUsage } from "../store/usage_rollups.ts";
import { api, createWorld as createAppWorld } from "./_helpers.ts";
import {
  counterValue,
  countReservations,
  windowOf,
} from "../store/quota/mod.ts";

const PROMPT_PRICE = 1_000_000_000; // 1000 per 1M tokens: 1000 micro-units a token
const COMPLETION_PRICE = 2_000_000_000;

async function priced(w: World): Promise<void> {
  await priceTinyChat(w.store);
}

const cost = (u: { prompt_tokens: number; completion_tokens: number }) =>
  perMillion(u.prompt_tokens, PROMPT_PRICE) +
  perMillion(u.completion_tokens, COMPLETION_PRICE);

const chat = {
  model: "tiny-chat",
  messages: [{ role: "user", content: "Hi" }],
  max_tokens: 5,
};

Deno.test("a hard money budget admits nothing past it under waves of 60 concurrent requests", async () => {
  const w = await createWorld();
  try {
    await priced(w);
    const budget = 200_000; // 0.20: about 15 requests of 0.013
    await setTenantBudget(w.store, SYSTEM, w.tenant.id, "money", {
      amount: "0.20",
      hard: true,
    });
    const ok: {
      usage: { prompt_tokens: number; completion_tokens: number };
    }[] = [];
    let refusal: { error: { code: string; message: string } } | null = null;
    // Waves until one admits nothing: each reserves its worst case, so a
    // wave admits only what the budget's room left can pay for.
    for (let wave = 0; wave < 20; wave++) {
      const rs = await Promise.all(Array.from({ length: 60 }, async () => {
        const r = await w.post("/v1/chat/completions", chat);
        return { status: r.status, body: await r.json() };
      }));
      for (const r of rs) {
        if (r.status === 200) ok.push(r.body);
        else {
          assert.equal(r.status, 429);
          refusal = r.body;
        }
      }
      if (rs.every((r) => r.status === 429)) break;
    }
    const spent = ok.reduce((a, r) => a + cost(r.usage), 0);
    assert.ok(spent <= budget, `spent ${spent} of ${budget}`);
    assert.ok(ok.length >= 10, `${ok.length} admitted`);
    assert.equal(w.up.requests.length, ok.length, "no refused request ran");
    assert.equal(refusal!.error.code, "insufficient_quota");
    assert.match(
      refusal!.error.message,
      // what is left, and what the request would need: its worst case
      /Budget reached for your organization: the monthly spend budget of 0\.20 EUR (is used up \(this request needs up to 0\.\d+ EUR\)|has 0\.\d+ EUR left; this request needs up to 0\.\d+ EUR \(its prompt and max_tokens at the model's prices\))\. The budget resets in/,
    );
    await w.gw.idle();
    assert.equal(
      await counterValue(
        w.store,
        `t:${w.tenant.id}`,
        windowOf("spend", Date.now())[0],
      ),
      spent,
      "the budget's counter holds exactly what was billed",
    );
    assert.equal(await countReservations(w.store), 0);
  } finally {
    await w.close();
  }
});

const tenantAdmin = (tenantId: string): Principal => ({
  kind: "user",
  id: "u-admin",
  label: "admin@acme.test",
  role: "tenant_admin",
  tenantId,
  ip: null,
});

Deno.test("a key's hard token budget, set by its tenant's admin within the tenant's, admits nothing past it; other keys go on", async () => {
  const w = await createWorld();
  try {
    const admin = tenantAdmin(w.tenant.id);
    await assert.rejects(
      setTenantBudget(w.store, admin, w.tenant.id, "tokens", { amount: 1 }),
      /Only platform admins/,
    );
    await setTenantBudget(w.store, SYSTEM, w.tenant.id, "tokens", {
      amount: 1000,
    });
    await assert.rejects(
      setKeyBudget(w.store, admin, w.keyId, "tokens", { amount: 1001 }),
      /amount: must be within the tenant's tokens budget of 1,000/,
    );
    await setKeyBudget(w.store, admin, w.keyId, "tokens", {
      amount: 300,
      hard: true,
    });
    let billed = 0;
    let admitted = 0;
    let refusal = "";
    for (let wave = 0; wave < 20; wave++) {
      const rs = await Promise.all(Array.from({ length: 40 }, async () => {
        const r = await w.post("/v1/chat/completions", chat);
        return { status: r.status, body: await r.json() };
      }));
      for (const r of rs) {
        if (r.status === 200) {
          admitted++;
          billed += r.body.usage.total_tokens;
        } else refusal = r.body.error.message;
      }
      if (rs.every((r) => r.status === 429)) break;
    }
    assert.ok(billed <= 300 && admitted >= 10, `${admitted}: ${billed}`);
    assert.match(
      refusal,
      /Budget reached for this API key: the monthly token budget of 300 tokens (is used up \(this request needs up to \d+ tokens\)|has \d+ tokens left; this request needs up to \d+ tokens)\./,
    );
    await w.gw.idle();
    assert.equal(
      await counterValue(
        w.store,
        `k:${w.keyId}`,
        windowOf("month", Date.now())[0],
      ),
      billed,
    );
    const other = await w.newKey();
    const r = await w.post("/v1/chat/completions", chat, {
      authorization: `Bearer ${other.key}`,
    });
    assert.equal(r.status, 200, "the tenant's soft budget refuses nothing");
    await r.body?.cancel();
  } finally {
    await w.close();
  }
});

/** A loopback webhook receiver answering `statuses` in turn (the last one after). */
function receiver(statuses: number[] = [200]) {
  const got: { headers: Headers; body: string }[] = [];
  let i = 0;
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    async (req) => {
      got.push({ headers: req.headers, body: await req.text() });
      const status = statuses[Math.min(i++, statuses.length - 1)]!;
      return new Response(status < 300 ? "ok" : "down", { status });
    },
  );
  return {
    url: `http://127.0.0.1:${server.addr.port}/hook`,
    got,
    close: () => server.shutdown(),
  };
}

Deno.test("crossing thresholds alerts once each per month, and the alert reaches the tenant's and the provider's webhooks, signed", async () => {
  const w = await createWorld();
  const tenantHook = receiver();
  const providerHook = receiver();
  try {
    await priced(w);
    await setTenantBudget(w.store, SYSTEM, w.tenant.id, "money", {
      amount: "0.10",
      thresholds: [100, 50, 80],
    });
    const { secret } = await createWebhook(
      w.store,
      tenantAdmin(w.tenant.id),
      w.tenant.id,
      { url: tenantHook.url, description: "ops" },
      true,
    );
    const provider = await createWebhook(
      w.store,
      SYSTEM,
      null,
      { url: providerHook.url },
      true,
    );
    const prompt = "PROMPT-TEXT-NEVER-IN-A-WEBHOOK";
    const send = async (n: number) => {
      for (let i = 0; i < n; i++) {
        const r = await w.post("/v1/chat/completions", {
          ...chat,
          messages: [{ role: "user", content: prompt }],
        });
        assert.equal(r.status, 200, "a soft budget refuses nothing");
        await r.body?.cancel();
      }
      await w.gw.idle();
    };
    const thresholds = async () =>
      (await listAlerts(w.store, SYSTEM, w.tenant.id)).items.map((a) =>
        a.threshold
      );
    await send(4); // 4 × 0.0xx: past 50%
    const first = await thresholds();
    assert.ok(first.length >= 1 && first.includes(50), String(first));
    await send(10); // past 100%: each threshold once
    assert.deepEqual(await thresholds(), [100, 80, 50]);
    await send(3);
    assert.deepEqual(await thresholds(), [100, 80, 50], "never twice");
    assert.deepEqual(await checkBudgets(w.store, w.tenant.id), []);
    assert.equal(await openAlertCount(w.store, w.tenant.id), 3);
    assert.equal(await openAlertCount(w.store, "provider"), 3);

    // Both receivers got each alert once, signed with their own secret.
    assert.equal(tenantHook.got.length, 3);
    assert.equal(providerHook.got.length, 3);
    for (const d of tenantHook.got) {
      const sig = d.headers.get("orchard-signature")!;
      assert.match(sig, /^t=\d+,v1=[0-9a-f]{64}$/);
      assert.ok(await verifySignature(secret, sig, d.body));
      // the receiver's own check, by the README's recipe
      const [, t, v1] = /^t=(\d+),v1=([0-9a-f]+)$/.exec(sig)!;
      const mac = createHmac("sha256", secret).update(`${t}.${d.body}`)
        .digest("hex");
      assert.equal(mac, v1);
      assert.equal(await verifySignature("whsec_wrong", sig, d.body), false);
      assert.equal(
        await verifySignature(secret, sig, d.body.replace("}", " }")),
        false,
      );
      const event = JSON.parse(d.body);
      assert.equal(event.type, "budget.threshold_reached");
      assert.match(event.id, /^evt_/);
      assert.equal(d.headers.get("orchard-event-id"), event.id);
      assert.equal(event.data.alert.tenant.id, w.tenant.id);
      assert.equal(event.data.alert.budget.currency, "EUR");
      assert.equal(event.data.alert.budget.amountFormatted, "0.10");
      assert.doesNotMatch(d.body, /PROMPT-TEXT|orch_|whsec_/);
    }
    const ids = (r: ReturnType<typeof receiver>) =>
      r.got.map((d) => JSON.parse(d.body).id).sort();
    assert.deepEqual(ids(tenantHook), ids(providerHook), "same event ids");
    const providerSig = providerHook.got[0]!.headers.get("orchard-signature");
    assert.equal(
      await verifySignature(secret, providerSig, providerHook.got[0]!.body),
      false,
      "each endpoint has its own secret",
    );
    assert.ok(provider.secret.startsWith("whsec_"));
  } finally {
    await w.close();
    await tenantHook.close();
    await providerHook.close();
  }
});

Deno.test("a failing receiver is retried with exponential backoff, across a restart of the dispatcher, until it succeeds; the log shows each attempt", async () => {
  const w = await createWorld({ gateway: { webhooks: false } });
  const hook = receiver([500, 503, 200]);
  try {
    await priced(w);
    await setTenantBudget(w.store, SYSTEM, w.tenant.id, "tokens", {
      amount: 10,
      thresholds: [100],
    });
    await createWebhook(w.store, SYSTEM, w.tenant.id, { url: hook.url }, true);
    const r = await w.post("/v1/chat/completions", chat);
    await r.body?.cancel();
    await w.gw.idle();
    assert.equal(hook.got.length, 0, "nothing sent: no dispatcher runs");
    let now = Date.now();
    const dispatcher = () =>
      new WebhookDispatcher(w.store, {
        allowPrivate: true,
        now: () => now,
        baseDelayMs: 60_000,
      });
    const log = async () =>
      (await listDeliveries(w.store, SYSTEM, w.tenant.id)).items[0]!;
    let d = dispatcher();
    assert.equal(await d.runOnce(), 1);
    assert.equal(hook.got.length, 1);
    let entry = await log();
    assert.equal(entry.status, "pending");
    assert.equal(entry.attempts, 1);
    assert.equal(entry.lastError, "HTTP 500");
    assert.equal(entry.nextAttemptAt, now + 60_000, "1 min after the first");
    now += 59_000;
    assert.equal(await d.runOnce(), 0, "not before its time");
    now += 1_000;
    // A restart: the queue is in KV.
    await d.close();
    d = dispatcher();
    assert.equal(await d.runOnce(), 1);
    entry = await log();
    assert.equal(entry.attempts, 2);
    assert.equal(entry.lastStatus, 503);
    assert.equal(entry.nextAttemptAt, now + 120_000, "then 2 min");
    now += 120_000;
    assert.equal(await d.runOnce(), 1);
    entry = await log();
    assert.equal(entry.status, "delivered");
    assert.equal(entry.attempts, 3);
    assert.equal(entry.nextAttemptAt, null);
    assert.deepEqual(entry.log.map((a) => a.status), [500, 503, 200]);
    assert.equal(await d.runOnce(), 0, "delivered once");
    // The same bytes every attempt: receivers deduplicate by the event id.
    assert.equal(new Set(hook.got.map((g) => g.body)).size, 1);
    assert.equal(backoffMs(12, 60_000, 86_400_000), 86_400_000, "capped");
    await d.close();
  } finally {
    await w.close();
    await hook.close();
  }
});

Deno.test("webhook URLs must be http(s) and public unless the operator allows private ones", async () => {
  for (
    const bad of [
      "ftp://example.com/x",
      "http://user:pw@example.com/x",
      "http://127.0.0.1:9/x",
      "http://localhost/x",
      "http://10.1.2.3/x",
      "http://172.20.0.1/x",
      "http://192.168.1.10/x",
      "http://169.254.169.254/latest",
      "http://[::1]/x",
      "http://[fd00::1]/x",
      "http://[::ffff:127.0.0.1]/x",
      "http://metadata.google.internal/x",
      "http://100.64.0.1/x",
      "not a url",
    ]
  ) {
    assert.throws(() => validateWebhookUrl(bad, false), /url:/, bad);
  }
  assert.equal(
    validateWebhookUrl("https://hooks.example.com/orchard", false),
    "https://hooks.example.com/orchard",
  );
  assert.equal(
    validateWebhookUrl("http://127.0.0.1:9/x", true),
    "http://127.0.0.1:9/x",
  );
  assert.equal(privateHost("8.8.8.8"), null);
  assert.equal(privateHost("[2001:db8::1]"), null);
  // A delivery to a private address is refused when they are not allowed.
  const w = await createWorld({ gateway: { webhooks: false } });
  const hook = receiver();
  try {
    await setTenantBudget(w.store, SYSTEM, w.tenant.id, "tokens", {
      amount: 1,
      thresholds: [100],
    });
    await createWebhook(w.store, SYSTEM, w.tenant.id, { url: hook.url }, true);
    const r = await w.post("/v1/chat/completions", chat);
    await r.body?.cancel();
    await w.gw.idle();
    const d = new WebhookDispatcher(w.store, { allowPrivate: false });
    assert.equal(await d.runOnce(), 1);
    const entry = (await listDeliveries(w.store, SYSTEM, w.tenant.id))
      .items[0]!;
    assert.match(entry.lastError!, /refused: a loopback address/);
    assert.equal(hook.got.length, 0);
  } finally {
    await w.close();
    await hook.close();
  }
});

Deno.test("webhooks resist DNS rebinding: the host is resolved once per attempt and the delivery connects to the address checked", async () => {
  // fetchPinned reaches the given address: this name resolves nowhere.
  const hook = receiver();
  const port = new URL(hook.url).port;
  try {
    const res = await fetchPinned(
      `http://hooks.example.test:${port}/hook`,
      { method: "POST", body: "{}" },
      "127.0.0.1",
    );
    assert.equal(res.status, 200);
    assert.equal(
      hook.got[0]!.headers.get("host"),
      `hooks.example.test:${port}`,
    );
  } finally {
    await hook.close();
  }
  // A resolver that answers public first, then private (a rebinding name).
  const answers = [["203.0.113.7"], ["127.0.0.1"]];
  let lookups = 0;
  const rebinding = () => Promise.resolve(answers[lookups++] ?? []);
  assert.deepEqual(
    await publicAddress("https://hooks.example.test/x", rebinding),
    { why: null, address: "203.0.113.7" },
  );
  assert.deepEqual(
    await publicAddress("https://hooks.example.test/x", rebinding),
    { why: "hooks.example.test resolves to a loopback address", address: null },
  );
  assert.deepEqual(await publicAddress("https://10.1.2.3/x"), {
    why: "a private address",
    address: null,
  });
  // The dispatcher connects to the address it checked, looked up once.
  const w = await createWorld({ gateway: { webhooks: false } });
  try {
    await setTenantBudget(w.store, SYSTEM, w.tenant.id, "tokens", {
      amount: 1,
      thresholds: [100],
    });
    await createWebhook(w.store, SYSTEM, w.tenant.id, {
      url: "https://hooks.example.test/orchard",
    }, false);
    const r = await w.post("/v1/chat/completions", chat);
    await r.body?.cancel();
    await w.gw.idle();
    lookups = 0;
    const sent: (string | null)[] = [];
    const d = new WebhookDispatcher(w.store, {
      allowPrivate: false,
      resolve: rebinding,
      fetch: (_url, _init, address) => {
        sent.push(address);
        return Promise.resolve(new Response("ok"));
      },
    });
    assert.equal(await d.runOnce(), 1);
    assert.equal(lookups, 1, "one lookup per attempt");
    assert.deepEqual(sent, ["203.0.113.7"]);
  } finally {
    await w.close();
  }
});

Deno.test("admin API: budgets, alerts and webhooks, each within its tenant and role", async () => {
  const w = await createAppWorld();
  try {
    const { platform, adminA, viewerA } = w.tokens;
    const put = (path: string, token: string, body: unknown) =>
      api(w, "PUT", path, token, body);
    assert.equal(
      (await put("/tenants/acme/budgets/money", adminA, { amount: "1" }))
        .status,
      403,
      "tenant admins do not set their tenant's budget",
    );
    const tb = await put("/tenants/acme/budgets/money", platform, {
      amount: "5.00",
      hard: true,
    });
    assert.equal(tb.status, 200);
    assert.deepEqual((await tb.json()).thresholds, [80, 100]);
    const bad = await put("/tenants/acme/budgets/euros", platform, {
      amount: 1,
    });
    assert.equal(bad.status, 400);
    const { apiKey } = await createApiKey(w.store, SYSTEM, w.tenantA.id, {
      name: "prod",
    });
    const over = await put(`/keys/${apiKey.id}/budgets/money`, adminA, {
      amount: "6",
    });
    assert.equal(over.status, 400);
    assert.equal((await over.json()).error.field, "amount");
    assert.equal(
      (await put(`/keys/${apiKey.id}/budgets/money`, viewerA, { amount: "1" }))
        .status,
      403,
    );
    assert.equal(
      (await put(`/keys/${apiKey.id}/budgets/money`, adminA, {
        amount: "0.01",
        thresholds: [50],
      })).status,
      200,
    );
    // A's admin sees nothing of B's.
    for (
      const path of [
        "/tenants/globex/budgets",
        "/tenants/globex/alerts",
        "/tenants/globex/webhooks",
        "/tenants/globex/webhooks/deliveries",
      ]
    ) {
      assert.equal((await api(w, "GET", path, adminA)).status, 404, path);
    }
    assert.equal((await api(w, "GET", "/alerts", adminA)).status, 403);
    assert.equal((await api(w, "GET", "/webhooks", adminA)).status, 403);

    const hook = await api(w, "POST", "/tenants/acme/webhooks", adminA, {
      url: "http://127.0.0.1:9/hook",
      description: "pager",
    });
    assert.equal(hook.status, 201);
    assert.equal(hook.headers.get("cache-control"), "no-store");
    const created = await hook.json();
    assert.match(created.secret, /^whsec_[A-Za-z0-9_-]{43}$/);
    const listed =
      await (await api(w, "GET", "/tenants/acme/webhooks", viewerA))
        .json();
    assert.equal(listed.items.length, 1);
    assert.equal(listed.items[0].secretLast4, created.secret.slice(-4));
    assert.doesNotMatch(JSON.stringify(listed), /whsec_|secretBox/);
    const ftp = await api(w, "POST", "/tenants/acme/webhooks", adminA, {
      url: "ftp://example.com/x",
    });
    assert.equal(ftp.status, 400);
    assert.equal((await ftp.json()).error.field, "url");

    // Traffic past the key's budget (seeded as the gateway writes it).
    await setPricing(w.store, SYSTEM, {
      currency: "EUR",
      models: [{
        model: "tiny",
        promptPerMillion: "10",
        completionPerMillion: "10",
      }],
      cluster: {
        hardwarePricePerNode: "0",
        amortisationMonths: 36,
        idleWatts: 0,
        busyWatts: 0,
        tariffPerKwh: "0",
      },
    });
    await writeUsage(w.store, [{
      id: "u1",
      at: new Date().toISOString(),
      requestId: "r1",
      tenantId: w.tenantA.id,
      keyId: apiKey.id,
      model: "tiny",
      nodeId: null,
      endpoint: "chat",
      promptTokens: 600,
      completionTokens: 400,
      latencyMs: 10,
      ttftMs: 5,
      status: 200,
      outcome: "ok",
    }]);
    // Checked by several gateways at once: one alert.
    const alerts = (await Promise.all(
      Array.from({ length: 4 }, () => checkBudgets(w.store, w.tenantA.id)),
    )).flat();
    assert.deepEqual(alerts.map((a) => [a.keyId, a.threshold]), [[
      apiKey.id,
      50,
    ]]);
    const status = await (await api(w, "GET", "/tenants/acme/budgets", viewerA))
      .json();
    const keyBudget = status.budgets.find((b: { keyId: string | null }) =>
      b.keyId === apiKey.id
    );
    // money in the admin API: decimal strings in major units
    assert.equal(keyBudget.spent, "0.01", "1,000 tokens at 10 per 1M: 0.01");
    assert.equal(keyBudget.amount, "0.01");
    assert.equal(status.currency, "EUR");
    assert.equal(keyBudget.percent, 100);
    const listedAlerts = await (await api(
      w,
      "GET",
      "/tenants/acme/alerts",
      viewerA,
    )).json();
    assert.equal(listedAlerts.items.length, 1);
    const alertId = listedAlerts.items[0].id;
    assert.equal(
      (await api(w, "POST", `/tenants/acme/alerts/${alertId}/ack`, viewerA))
        .status,
      403,
    );
    assert.equal(
      (await api(w, "POST", `/tenants/globex/alerts/${alertId}/ack`, platform))
        .status,
      404,
    );
    const acked = await api(
      w,
      "POST",
      `/tenants/acme/alerts/${alertId}/ack`,
      adminA,
    );
    assert.equal(acked.status, 200);
    assert.ok((await acked.json()).acknowledgedAt);
    assert.equal(await openAlertCount(w.store, w.tenantA.id), 0);
    const all = await (await api(w, "GET", "/alerts", platform)).json();
    assert.equal(all.items[0].acknowledgedBy, "a-admin");
    const deliveries = await (await api(
      w,
      "GET",
      "/tenants/acme/webhooks/deliveries",
      adminA,
    )).json();
    assert.equal(deliveries.items.length, 1);
    assert.equal(deliveries.items[0].status, "pending");
    assert.equal(deliveries.items[0].body, undefined, "bodies are not listed");
    const del = await api(
      w,
      "DELETE",
      `/tenants/acme/webhooks/${created.id}`,
      adminA,
    );
    assert.equal(del.status, 200);
    const audit = await (await api(
      w,
      "GET",
      `/audit?tenant=${w.tenantA.id}`,
      platform,
    )).json();
    const actions = audit.items.map((e: { action: string }) => e.action);
    for (
      const a of [
        "budget.set",
        "webhook.create",
        "webhook.delete",
        "alert.acknowledge",
      ]
    ) assert.ok(actions.includes(a), a);
    assert.doesNotMatch(JSON.stringify(audit), /whsec_[A-Za-z0-9_-]{20}/);
  } finally {
    await w.close();
  }
});

Deno.test("a hard budget set in the middle of its month counts what was spent before it", async () => {
  const w = await createWorld();
  try {
    await priced(w);
    let spent = 0;
    for (let i = 0; i < 3; i++) {
      const r = await w.post("/v1/chat/completions", chat);
      spent += cost((await r.json()).usage);
    }
    await w.gw.idle(); // the month's rollups hold them
    await setTenantBudget(w.store, SYSTEM, w.tenant.id, "money", {
      // less than what is spent plus one more request's worst case, more
      // than that worst case alone (else the request is too large for it)
      amount: "0.05",
      hard: true,
    });
    // What the statement bills so far (its lines rounded to the cent).
    const billed = (await budgetStatus(w.store, SYSTEM, w.tenant.id))
      .budgets[0]!.spent;
    assert.ok(Math.abs(billed - spent) <= 10_000, `${billed} ~ ${spent}`);
    assert.equal(
      await counterValue(
        w.store,
        `t:${w.tenant.id}`,
        windowOf("spend", Date.now())[0],
      ),
      billed,
    );
    const r = await w.post("/v1/chat/completions", chat);
    assert.equal(r.status, 429);
    assert.equal((await r.json()).error.code, "insufficient_quota");
  } finally {
    await w.close();
  }
});
