/**
 * Key management, the request log, audit filters and statement downloads
 * in a real browser (Chromium at 1366 px and 390 px), against the real
 * gateway and a node worker: the tenant's admin rotates a key (the new
 * secret shown once; a reload rotates nothing), the old secret keeps
 * working for its grace period and then stops (real HTTP requests), edits
 * the key (limits within the tenant's), filters the request log, filters
 * the audit log and reads a change's diff, and downloads a statement as
 * CSV and JSON. Screenshots go to test-artifacts/.
 */
import assert from "node:assert/strict";
import { testConfig } from "../config.ts";
import { buildIslands } from "../lib/islands_build.ts";
import { startNodeWorker } from "../node/worker.ts";
import { createOrchard } from "../orchard.ts";
import { createApiKey, getApiKey, rotateApiKey } from "../store/api_keys.ts";
import { listAudit } from "../store/audit.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import { setTenantLimits } from "../store/limits.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { createUser } from "../store/users.ts";
import { ARTIFACTS, fitsWidth, launchBrowser, signIn } from "./_browser.ts";
import { startFakeUpstream, until } from "./_fleet.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");

const PASSWORD = "a very long password";

Deno.test({
  name:
    "keys, request log, audit filters and statements in Chromium at 1366 and 390 px: rotate (grace, reload), edit, filter, download",
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
      gateway: { webhooks: false },
    });
    app = orchard.app;
    await orchard.gateway.start();
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
      await setTenantLimits(store, SYSTEM, tenant.id, { rpm: 1000 });
      await createUser(store, SYSTEM, {
        email: "admin@acme.test",
        password: PASSWORD,
        role: "tenant_admin",
        tenantId: tenant.id,
      });
      const { key: first, apiKey } = await createApiKey(
        store,
        SYSTEM,
        tenant.id,
        { name: "production" },
      );
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
      const chat = async (key: string, model = "tiny-chat") => {
        const res = await fetch(`${base}/v1/chat/completions`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${key}`,
            "content-type": "application/json",
          },
          body: JSON.stringify({
            model,
            messages: [{ role: "user", content: "secret prompt text" }],
            max_tokens: 4,
          }),
        });
        return { status: res.status, body: await res.json() };
      };
      for (let i = 0; i < 3; i++) assert.equal((await chat(first)).status, 200);
      const missing = await chat(first, "no-such-model");
      assert.equal(missing.status, 404);
      assert.equal(missing.body.error.code, "model_not_found");
      await orchard.gateway.idle();

      const errors: string[] = [];
      const wide = await browser.newPage({
        viewport: { width: 1366, height: 900 },
        acceptDownloads: true,
      });
      const narrow = await browser.newPage({
        viewport: { width: 390, height: 844 },
        isMobile: true,
        acceptDownloads: true,
      });
      for (const p of [wide, narrow]) {
        p.on("pageerror", (e) => errors.push(String(e)));
      }
      await signIn(wide, base, "admin@acme.test", PASSWORD);
      await signIn(narrow, base, "admin@acme.test", PASSWORD);

      // Rotate at 1366 px with a 1 hour grace: the new secret once, a reload rotates nothing.
      await wide.goto(`${base}/tenants/${tenant.id}`);
      await wide.click(`tr[data-key-id='${apiKey.id}'] [data-testid=key-link]`);
      await wide.waitForURL(new RegExp(`/keys/${apiKey.id}$`));
      await fitsWidth(wide);
      await wide.selectOption("#f-grace", "3600");
      await wide.click("#rotate-form [data-action=rotate]");
      await wide.click("#rotate-form button[name=confirm]");
      await wide.waitForSelector("[data-testid=new-key]");
      const second = (await wide.textContent("[data-testid=new-key]"))!.trim();
      assert.match(second, /^orch_/);
      assert.notEqual(second, first);
      assert.match(await wide.textContent("body") ?? "", /works until/);
      await wide.screenshot({
        path: `${ARTIFACTS}keys-rotated-1366.png`,
        fullPage: true,
      });
      await wide.reload();
      assert.equal(await wide.$("[data-testid=new-key]"), null, "shown once");
      assert.match(
        await wide.textContent("[data-testid=key-mask]") ?? "",
        new RegExp(`${second.slice(-4)}$`),
      );
      assert.equal(
        (await listAudit(kv, SYSTEM, { action: "key.rotate" })).items.length,
        1,
        "the reload rotated nothing",
      );
      // Both secrets work during the grace period.
      assert.equal((await chat(first)).status, 200);
      assert.equal((await chat(second)).status, 200);

      // Edit at 390 px: a limit above the tenant's is refused with a message; then saved.
      await narrow.goto(`${base}/tenants/${tenant.id}/keys/${apiKey.id}`);
      await fitsWidth(narrow);
      await narrow.fill("#f-name", "production-eu");
      await narrow.fill("#f-rpm", "5000");
      await narrow.click("#edit-form button[type=submit]");
      assert.match(
        await narrow.textContent("#edit") ?? "",
        /cannot exceed the tenant's limit of 1,000/,
      );
      await narrow.fill("#f-rpm", "500");
      await narrow.uncheck("#edit-form input[value=embeddings]");
      await narrow.click("#edit-form button[type=submit]");
      await narrow.waitForSelector("#edit .alert.ok");
      const edited = await getApiKey(store, SYSTEM, apiKey.id);
      assert.equal(edited.name, "production-eu");
      assert.equal(edited.limits?.rpm, 500);
      assert.deepEqual(edited.scopes, ["chat", "models"]);
      await narrow.screenshot({
        path: `${ARTIFACTS}keys-edited-390.png`,
        fullPage: true,
      });

      // Rotate at 390 px with no grace: every earlier secret stops at once.
      await narrow.selectOption("#f-grace", "0");
      await narrow.click("#rotate-form [data-action=rotate]");
      await narrow.click("#rotate-form button[name=confirm]");
      await narrow.waitForSelector("[data-testid=new-key]");
      const third = (await narrow.textContent("[data-testid=new-key]"))!.trim();
      for (const old of [first, second]) {
        const r = await chat(old);
        assert.equal(r.status, 401);
        assert.equal(r.body.error.code, "invalid_api_key");
      }
      assert.equal((await chat(third)).status, 200);

      // A short grace period ends on its own: the old secret works, then is refused.
      const { key: fourth } = await rotateApiKey(
        store,
        SYSTEM,
        apiKey.id,
        1500,
      );
      const t0 = Date.now();
      const during = await chat(third);
      if (Date.now() - t0 < 1400) assert.equal(during.status, 200);
      await new Promise((r) =>
        setTimeout(r, Math.max(0, 1600 - (Date.now() - t0)))
      );
      const after = await chat(third);
      assert.equal(after.status, 401);
      assert.match(after.body.error.message, /rotated/);
      assert.equal((await chat(fourth)).status, 200);
      await orchard.gateway.idle();

      // The request log, at both widths: all requests, then only the 4xx ones, then by key.
      for (const [page, width] of [[wide, 1366], [narrow, 390]] as const) {
        await page.goto(`${base}/tenants/${tenant.id}`);
        await page.click("[data-testid=request-log-link]");
        await page.waitForURL(/\/requests$/);
        await fitsWidth(page);
        const rows = await page.$$("tr[data-request]");
        assert.ok(rows.length >= 8, `${rows.length} rows`);
        assert.doesNotMatch(await page.content(), /secret prompt text|orch_/);
        await page.selectOption("#l-status", "4xx");
        await page.click("#log-filter button[type=submit]");
        await page.waitForURL(/status=4xx/);
        const statuses = await page.$$eval(
          "tr[data-request]",
          (trs) => trs.map((t) => Number(t.getAttribute("data-status"))),
        );
        assert.ok(statuses.length >= 1, `${statuses}`);
        assert.ok(statuses.every((s) => s >= 400 && s < 500), `${statuses}`);
        const errorsShown = await page.$$eval(
          "tr[data-request] [data-error]",
          (tds) => tds.map((t) => t.textContent ?? ""),
        );
        assert.ok(errorsShown.some((e) => /model_not_found/.test(e)));
        await page.screenshot({
          path: `${ARTIFACTS}request-log-4xx-${width}.png`,
          fullPage: true,
        });
        await page.goto(
          `${base}/tenants/${tenant.id}/requests?key=${apiKey.id}&status=2xx`,
        );
        const ok = await page.$$("tr[data-request][data-status='200']");
        assert.ok(ok.length >= 6, `${ok.length} ok rows`);
      }

      // Audit log filters and the change's diff (1366 px and 390 px).
      for (const [page, width] of [[wide, 1366], [narrow, 390]] as const) {
        await page.goto(`${base}/audit`);
        await page.fill("#a-action", "key.");
        await page.click("#audit-filter button[type=submit]");
        await page.waitForURL(/action=key\./);
        const actions = await page.$$eval(
          "tr[data-audit]",
          (trs) => trs.map((t) => t.getAttribute("data-audit")),
        );
        assert.ok(actions.length >= 4);
        assert.ok(actions.every((a) => a!.startsWith("key.")), `${actions}`);
        await page.goto(`${base}/audit?action=key.update`);
        await page.click("tr[data-audit='key.update'] details summary");
        assert.match(
          await page.textContent(
            "tr[data-audit='key.update'] tr[data-field=name]",
          ) ??
            "",
          /production.*production-eu/,
        );
        await fitsWidth(page);
        await page.screenshot({
          path: `${ARTIFACTS}audit-diff-${width}.png`,
          fullPage: true,
        });
      }

      // Statements: the month picker, and CSV and JSON downloads.
      const month = new Date().toISOString().slice(0, 7);
      for (const [page, width] of [[wide, 1366], [narrow, 390]] as const) {
        await page.goto(`${base}/tenants/${tenant.id}/statements`);
        await page.waitForURL(new RegExp(`/statements/${month}$`));
        await page.fill("#month", month);
        await page.click("form[action$='/statements'] button[type=submit]");
        await page.waitForURL(new RegExp(`/statements/${month}$`));
        await fitsWidth(page);
        const [csv] = await Promise.all([
          page.waitForEvent("download"),
          page.click("[data-testid=statement-csv]"),
        ]);
        const csvText = await Deno.readTextFile((await csv.path())!);
        assert.match(csv.suggestedFilename(), /\.csv$/);
        assert.match(csvText, /tiny-chat/);
        const [json] = await Promise.all([
          page.waitForEvent("download"),
          page.click("[data-testid=statement-json]"),
        ]);
        assert.match(json.suggestedFilename(), /\.json$/);
        const s = JSON.parse(await Deno.readTextFile((await json.path())!));
        assert.equal(s.month, month);
        assert.ok(s.requests >= 7, `${s.requests} requests`);
        await page.screenshot({
          path: `${ARTIFACTS}statement-downloads-${width}.png`,
          fullPage: true,
        });
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
      await orchard.close();
      kv.close();
    }
  },
});
