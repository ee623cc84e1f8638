/**
 * Budgets in a real browser (Chromium at 1366 px and 390 px): the provider
 * sets a tenant's budget, the tenant's admin sets a key's (hard) budget and
 * adds a webhook (its secret shown once), traffic flows through the
 * gateway to a node worker, then spend, the alerts (a list and a badge) and
 * the delivery log show, and the receiver got signed deliveries.
 * Screenshots go to test-artifacts/.
 */
import assert from "node:assert/strict";
import { testConfig } from "../config.ts";
import { buildIslands } from "../lib/islands_build.ts";
import { startNodeWorker } from "../node/worker.ts";
import { createOrchard } from "../orchard.ts";
import { createApiKey } from "../store/api_keys.ts";
import { budgetStatus } from "../store/budgets.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import { formatMoney } from "../store/money.ts";
import { setPricing } from "../store/pricing.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { usageReport } from "../store/usage_report.ts";
import { createUser } from "../store/users.ts";
import { verifySignature } from "../store/webhooks.ts";
import { ARTIFACTS, fitsWidth, launchBrowser, signIn } from "./_browser.ts";
import { startFakeUpstream, until } from "./_fleet.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");

const PASSWORD = "a very long password";

Deno.test({
  name:
    "budgets in Chromium at 1366 and 390 px: set a budget, traffic, then spend, alerts, badge and delivered webhooks",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    const islands = await buildIslands();
    let app: ReturnType<typeof createOrchard>["app"] | null = null;
    const server = Deno.serve({
      port: 0,
      hostname: "127.0.0.1",
      onListen: () => {},
    }, (req, info) => app!.fetch(req, { remoteAddr: info.remoteAddr }));
    const base = `http://127.0.0.1:${server.addr.port}`;
    const orchard = createOrchard({
      store,
      config: testConfig({ publicUrl: base }),
      islands,
      fleetRefreshMs: 50,
      gateway: { webhooks: { pollMs: 100 }, budgetCheckMs: 50 },
    });
    app = orchard.app;
    await orchard.gateway.start();
    const received: { headers: Headers; body: string }[] = [];
    const hook = Deno.serve(
      { port: 0, hostname: "127.0.0.1", onListen() {} },
      async (req) => {
        received.push({ headers: req.headers, body: await req.text() });
        return new Response("ok");
      },
    );
    const hookUrl = `http://127.0.0.1:${hook.addr.port}/orchard`;
    const up = startFakeUpstream();
    let node: Awaited<ReturnType<typeof startNodeWorker>> | null = null;
    const browser = await launchBrowser();
    try {
      await createUser(store, SYSTEM, {
        email: "ops@orchard.test",
        password: PASSWORD,
        role: "platform_admin",
        tenantId: null,
      });
      const tenant = await createTenant(store, SYSTEM, { name: "Acme" });
      await createUser(store, SYSTEM, {
        email: "admin@acme.test",
        password: PASSWORD,
        role: "tenant_admin",
        tenantId: tenant.id,
      });
      const { key, apiKey } = await createApiKey(store, SYSTEM, tenant.id, {
        name: "production",
      });
      await setPricing(store, SYSTEM, {
        currency: "EUR",
        models: [{
          model: "tiny-chat",
          promptPerMillion: "1000",
          completionPerMillion: "2500",
        }],
        cluster: {
          hardwarePricePerNode: "0",
          amortisationMonths: 36,
          idleWatts: 0,
          busyWatts: 0,
          tariffPerKwh: "0",
        },
      });
      const { token } = await createJoinToken(store, SYSTEM, { uses: 1 });
      node = await startNodeWorker({
        gatewayUrl: base,
        joinToken: token,
        engine: "openai",
        upstreamUrl: up.url,
        port: 0,
        host: "127.0.0.1",
        name: "mac-a",
        stateDir: await Deno.makeTempDir(),
        heartbeatMs: 150,
      });
      await until(
        "a healthy node",
        () => orchard.fleet.nodes().some((n) => n.state === "healthy"),
        5000,
      );
      const errors: string[] = [];
      const wide = await browser.newPage({
        viewport: { width: 1366, height: 900 },
      });
      const narrow = await browser.newPage({
        viewport: { width: 390, height: 844 },
        isMobile: true,
      });
      for (const p of [wide, narrow]) {
        p.on("pageerror", (e) => errors.push(String(e)));
      }
      const budgets = `${base}/tenants/${tenant.id}/budgets`;

      // The provider sets the tenant's money budget (1366 px).
      await signIn(wide, base, "ops@orchard.test", PASSWORD);
      await wide.goto(budgets);
      await wide.selectOption("#tb-unit", "money");
      await wide.fill("#tb-amount", "0.05");
      await wide.fill("#tb-thresholds", "50, 100");
      await wide.click("#tenant-budget-form button[type=submit]");
      await wide.waitForURL(/done=budget-saved/);
      assert.match(
        await wide.textContent("tr[data-budget='tenant:money']") ?? "",
        /0\.05 EUR/,
      );

      // The tenant's admin (390 px): a hard token budget on the key, and a webhook.
      await signIn(narrow, base, "admin@acme.test", PASSWORD);
      await narrow.goto(budgets);
      await fitsWidth(narrow);
      assert.equal(await narrow.$("#tenant-budget-form"), null);
      await narrow.selectOption("#kb-key", apiKey.id);
      await narrow.selectOption("#kb-unit", "tokens");
      await narrow.fill("#kb-amount", "100");
      await narrow.check("#key-budget-form input[name=hard]");
      await narrow.click("#key-budget-form button[type=submit]");
      await narrow.waitForURL(/done=budget-saved/);
      assert.ok(
        await narrow.isVisible(`tr[data-budget='${apiKey.id}:tokens']`),
      );
      await narrow.fill("#f-url", hookUrl);
      await narrow.fill("#f-description", "on-call");
      await narrow.click("#webhook-form button[type=submit]");
      const secret = (await narrow.textContent(
        "[data-testid=webhook-secret]",
      ))!.trim();
      assert.match(secret, /^whsec_/);
      await narrow.screenshot({
        path: `${ARTIFACTS}budgets-secret-390.png`,
        fullPage: true,
      });
      await narrow.goto(budgets);
      assert.equal(
        (await narrow.content()).includes(secret),
        false,
        "the secret is shown once",
      );

      // Traffic until the key's hard budget refuses.
      let ok = 0, refused = 0;
      for (let i = 0; i < 30 && refused === 0; i++) {
        const res = await fetch(`${base}/v1/chat/completions`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${key}`,
            "content-type": "application/json",
          },
          body: JSON.stringify({
            model: "tiny-chat",
            messages: [{ role: "user", content: `hello ${i}` }],
            max_tokens: 4,
          }),
        });
        const body = await res.json();
        if (res.status === 200) ok++;
        else {
          assert.equal(res.status, 429);
          assert.equal(body.error.code, "insufficient_quota");
          assert.match(body.error.message, /token budget of 100 tokens/);
          refused++;
        }
      }
      assert.ok(ok > 0 && refused === 1, `${ok} ok, ${refused} refused`);
      await orchard.gateway.idle();
      await until("deliveries", () => received.length >= 3, 5000);
      const status = await budgetStatus(store, SYSTEM, tenant.id);
      const money = status.budgets.find((b) => b.unit === "money")!;
      assert.ok(money.percent >= 100, `${money.percent}%`);

      // Spend, alerts and the badge, at both widths.
      for (const [page, width] of [[narrow, 390], [wide, 1366]] as const) {
        await page.goto(`${base}/tenants/${tenant.id}`);
        assert.match(
          await page.textContent("[data-testid=tenant-alerts]") ?? "",
          /\d+ budget alerts/,
        );
        assert.ok(await page.isVisible("[data-testid=alert-badge]"));
        assert.ok(await page.isVisible("#alerts tr[data-alert]"));
        await page.screenshot({
          path: `${ARTIFACTS}budgets-tenant-${width}.png`,
          fullPage: true,
        });
        await page.goto(budgets);
        await fitsWidth(page);
        assert.equal(
          (await page.textContent(
            "tr[data-budget='tenant:money'] [data-spent]",
          ))?.trim(),
          `${formatMoney(money.spent)} EUR`,
        );
        const alerts = await page.$$eval(
          "#alerts tr[data-alert]",
          (rows) => rows.map((r) => r.textContent ?? ""),
        );
        assert.ok(alerts.some((t) => /100%/.test(t) && /money/.test(t)));
        assert.ok(alerts.some((t) => /requests refused/.test(t)));
        await page.waitForSelector("#deliveries tr[data-delivery]");
        assert.match(
          await page.textContent("#deliveries") ?? "",
          /delivered/,
        );
        await page.screenshot({
          path: `${ARTIFACTS}budgets-page-${width}.png`,
          fullPage: true,
        });
        await page.goto(`${base}/usage?tenant=${tenant.id}&range=24h`);
        await fitsWidth(page);
        const report = await usageReport(store, SYSTEM, {
          tenantId: tenant.id,
          keyId: null,
          model: null,
          granularity: "hour",
          from: Date.now() - 86_400_000,
          to: Date.now(),
        });
        assert.ok(report.spend.totalMicro > 0);
        assert.equal(
          (await page.textContent("[data-testid=usage-cost]"))?.trim(),
          `${formatMoney(report.spend.totalMicro)} EUR`,
        );
        assert.ok(await page.isVisible(`tr[data-spend-key='${apiKey.id}']`));
        await page.screenshot({
          path: `${ARTIFACTS}budgets-usage-${width}.png`,
          fullPage: true,
        });
      }

      // The provider's page: every tenant's alerts; acknowledging lowers the badge.
      await wide.goto(`${base}/alerts`);
      const badge = Number(
        await wide.textContent("[data-testid=alert-badge]"),
      );
      assert.ok(badge >= 3, `badge ${badge}`);
      await wide.click("#alerts tr[data-alert] button:has-text('Acknowledge')");
      await wide.waitForURL(/\/alerts\?done=alert-acknowledged/);
      assert.equal(
        Number(await wide.textContent("[data-testid=alert-badge]")),
        badge - 1,
      );
      assert.match(await wide.textContent("#alerts") ?? "", /seen by/);

      // The receiver got signed deliveries, each event once.
      const ids = new Set<string>();
      for (const d of received) {
        assert.ok(
          await verifySignature(
            secret,
            d.headers.get("orchard-signature"),
            d.body,
          ),
        );
        const event = JSON.parse(d.body);
        assert.ok(!ids.has(event.id), "each event once");
        ids.add(event.id);
        assert.doesNotMatch(d.body, /hello \d|orch_/);
      }
      assert.deepEqual(errors, []);
    } catch (err) {
      for (const ctx of browser.contexts()) {
        for (const p of ctx.pages()) {
          await p.screenshot({ path: `${ARTIFACTS}failure-${Date.now()}.png` })
            .catch(() => {});
          // deno-lint-ignore no-console
          console.error(
            `page at failure: ${p.url()}\n${
              (await p.innerText("body").catch(() => "")).slice(0, 1500)
            }`,
          );
        }
      }
      throw err;
    } finally {
      await browser.close();
      await node?.close();
      await up.close();
      await server.shutdown();
      await hook.shutdown();
      await orchard.close();
      kv.close();
    }
  },
});
