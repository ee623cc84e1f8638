/**
 * The dashboards in a real browser, after real traffic through the
 * gateway to two node workers (openai engine over a scripted upstream):
 * usage chart with data points, statement CSV with the expected total,
 * mesh link test with progress, playground streaming, models, and a live
 * node drained from the nodes page. Screenshots go to test-artifacts/.
 */
import assert from "node:assert/strict";
import { testConfig } from "../config.ts";
import { buildIslands } from "../lib/islands_build.ts";
import type { LinkTester } from "../node/server.ts";
import { startNodeWorker } from "../node/worker.ts";
import { createOrchard } from "../orchard.ts";
import { createApiKey } from "../store/api_keys.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import { formatMoney, perMillion, toCents } from "../store/money.ts";
import { setPricing } from "../store/pricing.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { usageReport } from "../store/usage_report.ts";
import { createUser } from "../store/users.ts";
import { ARTIFACTS, launchBrowser } from "./_browser.ts";
import { startFakeUpstream, until } from "./_fleet.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");

/** A loopback TCP ping-pong standing in for liborchard's link test. */
function tcpLinkTester(): LinkTester {
  return {
    listen() {
      const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      (async () => {
        const conn = await l.accept();
        l.close();
        const buf = new Uint8Array(1);
        for (let i = 0; i < 16; i++) {
          if (await conn.read(buf) === null) break;
          await conn.write(buf);
        }
        conn.close();
      })();
      return Promise.resolve({ port: l.addr.port });
    },
    async connect(body) {
      const conn = await Deno.connect({
        hostname: String(body.host),
        port: Number(body.port),
      });
      const buf = new Uint8Array(1);
      const t0 = performance.now();
      for (let i = 0; i < 16; i++) {
        await conn.write(buf);
        await conn.read(buf);
      }
      conn.close();
      return {
        schema: "orchard.linktest/1",
        transport: "tcp",
        latencyUs: ((performance.now() - t0) / 32) * 1000,
      };
    },
  };
}

Deno.test({
  name:
    "dashboards in Chromium: usage chart, statement CSV, mesh, playground, models, live drain",
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
      liveIntervalMs: 250,
    });
    app = orchard.app;
    const up = startFakeUpstream();
    const nodes: Awaited<ReturnType<typeof startNodeWorker>>[] = [];
    const browser = await launchBrowser();
    try {
      await createUser(store, SYSTEM, {
        email: "ops@orchard.test",
        password: "a very long password",
        role: "platform_admin",
        tenantId: null,
      });
      const tenant = await createTenant(store, SYSTEM, { name: "Acme" });
      const { key } = await createApiKey(store, SYSTEM, tenant.id, {
        name: "dash",
      });
      const { token } = await createJoinToken(store, SYSTEM, { uses: 2 });
      for (const name of ["mac-a", "mac-b"]) {
        nodes.push(
          await startNodeWorker({
            gatewayUrl: base,
            joinToken: token,
            engine: "openai",
            upstreamUrl: up.url,
            port: 0,
            host: "127.0.0.1",
            name,
            stateDir: await Deno.makeTempDir(),
            heartbeatMs: 150,
            linktest: tcpLinkTester(),
          }),
        );
      }
      await until(
        "two healthy nodes",
        () =>
          orchard.fleet.nodes().filter((n) => n.state === "healthy").length ===
            2,
        5000,
      );

      // Traffic through the gateway: plain and streamed chats.
      for (let i = 0; i < 4; i++) {
        const res = await fetch(`${base}/v1/chat/completions`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${key}`,
            "content-type": "application/json",
          },
          body: JSON.stringify({
            model: "tiny-chat",
            messages: [{ role: "user", content: `hello ${i}` }],
            stream: i % 2 === 1,
          }),
        });
        assert.equal(res.status, 200);
        await res.text();
      }
      await orchard.gateway.idle();
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
      const month = new Date().toISOString().slice(0, 7);
      const totals = (await usageReport(store, SYSTEM, {
        tenantId: tenant.id,
        keyId: null,
        model: null,
        granularity: "day",
        from: Date.parse(`${month}-01T00:00:00Z`),
        to: Date.now(),
      })).totals;
      assert.equal(totals.requests, 4);
      const expected = formatMoney(
        toCents(perMillion(totals.promptTokens, 1_000_000_000)) +
          toCents(perMillion(totals.completionTokens, 2_500_000_000)),
      );

      const page = await browser.newPage({
        viewport: { width: 1400, height: 900 },
        acceptDownloads: true,
      });
      const errors: string[] = [];
      page.on("pageerror", (e) => errors.push(String(e)));
      await page.goto(`${base}/login`);
      await page.fill("#f-email", "ops@orchard.test");
      await page.fill("#f-password", "a very long password");
      await page.click("button[type=submit]");
      await page.waitForURL(`${base}/tenants`);

      // Usage: the chart draws non-empty data points.
      await page.goto(`${base}/usage?tenant=${tenant.id}&range=24h`);
      await page.waitForSelector("#chart-tokens[data-points]");
      const points = Number(
        await page.getAttribute("#chart-tokens", "data-points"),
      );
      assert.ok(points > 0, `points: ${points}`);
      assert.ok(await page.isVisible("#quota"));
      await page.screenshot({
        path: `${ARTIFACTS}dashboard-usage.png`,
        fullPage: true,
      });

      // Statement and its CSV download with the expected total.
      await page.goto(`${base}/tenants/${tenant.id}/statements/${month}`);
      assert.equal(
        (await page.textContent("[data-testid=statement-total]"))?.trim(),
        `${expected} EUR`,
      );
      await page.screenshot({
        path: `${ARTIFACTS}dashboard-statement.png`,
        fullPage: true,
      });
      const [download] = await Promise.all([
        page.waitForEvent("download"),
        page.click("[data-testid=statement-csv]"),
      ]);
      const csv = await Deno.readTextFile((await download.path())!);
      const rows = csv.trimEnd().split("\r\n");
      assert.equal(rows.at(-1), `Acme,${month},EUR,total,Total,,,,${expected}`);
      assert.ok(
        rows.some((r) =>
          r.includes(`tiny-chat prompt tokens,${totals.promptTokens},tokens`)
        ),
      );

      // Mesh: test all pairs, with progress, then a coloured result.
      await page.goto(`${base}/mesh`);
      await page.click("text=Test all pairs");
      // The page reloads itself when the run ends; on a loaded machine the
      // run may end between render and hydration, so look again if needed.
      for (let i = 0;; i++) {
        try {
          await page.waitForSelector("td[data-health]", { timeout: 5000 });
          break;
        } catch (e) {
          if (i >= 7) {
            throw new Error(
              `no link-test result: ${await page.textContent("main")}`,
              { cause: e },
            );
          }
          await page.reload();
        }
      }
      const cell = await page.textContent("td[data-health]");
      assert.match(cell ?? "", /tcp/);
      assert.match(cell ?? "", /µs/);
      await page.screenshot({
        path: `${ARTIFACTS}dashboard-mesh.png`,
        fullPage: true,
      });

      // Playground: a streamed reply with tokens/s and usage.
      await page.goto(`${base}/playground`);
      await page.fill("#pg-key", key);
      await page.click("[data-testid=load-models]");
      await page.waitForSelector("#pg-model option[value=tiny-chat]", {
        state: "attached",
      });
      await page.selectOption("#pg-model", "tiny-chat");
      await page.fill("#pg-input", "Say hello");
      await page.click("button:has-text('Send')");
      await page.waitForSelector(
        ".msg[data-role=assistant]:has-text('Hi there')",
      );
      const stats = await page.textContent("[data-testid=stats]");
      assert.match(stats ?? "", /tokens\/s/);
      assert.match(stats ?? "", /usage: \d+ prompt \+ 2 completion/);
      assert.equal((await page.content()).includes(key), false);
      await page.screenshot({
        path: `${ARTIFACTS}dashboard-playground.png`,
        fullPage: true,
      });

      // Models: which node serves which model.
      await page.goto(`${base}/models`);
      const row = await page.textContent("tr[data-model=tiny-chat]");
      assert.match(row ?? "", /mac-a/);
      assert.match(row ?? "", /mac-b/);

      // Nodes: live, then drained from the page; the live feed shows "drained".
      await page.goto(`${base}/nodes`);
      await page.waitForSelector("[data-testid=live][data-live='1']");
      const a = nodes[0]!.nodeId;
      const state = `[data-node="${a}"] [data-field=state]`;
      assert.equal((await page.textContent(state))?.trim(), "healthy");
      await page.click(`[data-node="${a}"] button[data-action=drain]`);
      await page.click(`[data-node="${a}"] button:has-text('Yes, drain')`);
      await page.waitForSelector("text=Node is draining");
      assert.match(page.url(), /\/nodes#nodes$/);
      await page.waitForSelector(`${state}:has-text('drained')`, {
        timeout: 10_000,
      });
      await page.screenshot({
        path: `${ARTIFACTS}dashboard-nodes.png`,
        fullPage: true,
      });
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
      for (const n of nodes) await n.close();
      await up.close();
      await server.shutdown();
      await orchard.close();
      kv.close();
    }
  },
});
