/**
 * The portal in a real browser: first-run setup, tenants, a key shown once,
 * revocation with confirmation, limits, and a tenant admin who cannot see
 * another tenant. Screenshots go to test-artifacts/.
 */
import assert from "node:assert/strict";
import { testConfig } from "../config.ts";
import { buildIslands } from "../lib/islands_build.ts";
import { createOrchardApp } from "../server.tsx";
import { SYSTEM } from "../store/principal.ts";
import { bootstrapAdmin } from "../store/sessions.ts";
import { createStore } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { ARTIFACTS, launchBrowser } from "./_browser.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");

Deno.test({
  name:
    "portal in Chromium: setup, tenant, key shown once, revoke, limits, tenant isolation",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    const boot = await bootstrapAdmin(store, {});
    assert.ok(boot?.setupToken);
    const other = await createTenant(store, SYSTEM, {
      name: "Globex Secret",
      slug: "globex",
    });
    const islands = await buildIslands();
    const server = Deno.serve({
      port: 0,
      hostname: "127.0.0.1",
      onListen: () => {},
    }, (req, info) => app.fetch(req, { remoteAddr: info.remoteAddr }));
    const base = `http://127.0.0.1:${server.addr.port}`;
    const app = createOrchardApp({
      store,
      config: testConfig({ publicUrl: base }),
    }, islands);
    const browser = await launchBrowser();
    try {
      const page = await browser.newPage({
        viewport: { width: 1280, height: 800 },
      });
      const errors: string[] = [];
      page.on("pageerror", (e) => errors.push(String(e)));

      // First run: the one-time setup link creates the platform admin and signs in.
      await page.goto(`${base}/setup?token=${boot.setupToken}`);
      await page.fill("#f-email", "admin@orchard.test");
      await page.fill("#f-password", "a very long password");
      await page.click("button[type=submit]");
      await page.waitForURL(`${base}/tenants`);
      await page.screenshot({ path: `${ARTIFACTS}portal-tenants-empty.png` });

      // Sign out and in again with the new credentials.
      await page.click("text=Sign out");
      await page.waitForURL(/\/login/);
      await page.fill("#f-email", "admin@orchard.test");
      await page.fill("#f-password", "wrong password!!");
      await page.click("button[type=submit]");
      assert.ok(await page.isVisible("text=Wrong email or password"));
      await page.fill("#f-password", "a very long password");
      await page.click("button[type=submit]");
      await page.waitForURL(`${base}/`.replace(/\/$/, "") + "/tenants");

      // Create a tenant.
      await page.fill("#f-name", "Acme Robotics");
      await page.click("text=Create tenant");
      await page.waitForURL(/\/tenants\/[0-9a-z]{26}$/);
      const tenantUrl = page.url().split(/[?#]/)[0]!;
      assert.ok(await page.isVisible("h1:has-text('Acme Robotics')"));
      assert.ok(await page.isVisible('text=Tenant "Acme Robotics" created.'));

      // Create a key: shown once, with a working copy button (an island).
      await page.fill(
        "input[name=name][placeholder*='production']",
        "production app",
      );
      await page.click("text=Create key");
      await page.waitForURL(`${tenantUrl}#keys`);
      const keyText = (await page.textContent("[data-testid=new-key]"))!.trim();
      assert.match(keyText, /^orch_[0-9a-z]{26}_[0-9A-Za-z]{38}$/);
      await page.click("[data-testid=copy]");
      await page.waitForSelector("text=Copied ✓");
      await page.screenshot({
        path: `${ARTIFACTS}portal-key-created.png`,
        fullPage: true,
      });
      // a reload shows it no more, and creates nothing
      await page.reload();
      assert.equal(await page.isVisible("[data-testid=new-key]"), false);
      assert.equal((await page.content()).includes(keyText), false);
      assert.equal(await page.locator("tr[data-key-id]").count(), 1);
      await page.goto(tenantUrl);
      assert.equal(await page.isVisible("[data-testid=new-key]"), false);
      assert.equal((await page.content()).includes(keyText), false);
      assert.ok(await page.isVisible(`text=…${keyText.slice(-4)}`));

      // Revoke with an inline confirmation.
      await page.click("button:has-text('Revoke')");
      await page.click("button:has-text('Yes, revoke')");
      await page.waitForSelector("text=revoked");
      assert.ok(await page.isVisible('text=Key "production app" revoked.'));

      // Limits: a bad value gets a readable message; a good one is saved.
      await page.fill("#f-rpm", "-5");
      await page.evaluate(() =>
        document.querySelectorAll("input[type=number]").forEach((el) =>
          el.removeAttribute("min")
        )
      );
      await page.click("text=Save limits");
      assert.ok(
        await page.isVisible("text=Requests / minute must be 0 or more"),
      );
      await page.fill("#f-rpm", "120");
      await page.fill("#f-tokensPerDay", "2000000");
      await page.click("text=Save limits");
      await page.waitForSelector("text=Limits saved.");
      assert.equal(await page.inputValue("#f-rpm"), "120");
      assert.equal(await page.inputValue("#f-tokensPerDay"), "2000000");

      // Invite a tenant admin; they sign up through the one-time link.
      await page.fill("#members input[name=email]", "ops@acme.test");
      await page.click("text=Create invite link");
      const link = (await page.textContent("[data-testid=invite-link]"))!
        .trim();
      await page.screenshot({
        path: `${ARTIFACTS}portal-tenant.png`,
        fullPage: true,
      });
      const ctx2 = await browser.newContext({
        viewport: { width: 390, height: 844 },
      });
      const p2 = await ctx2.newPage();
      await p2.goto(link);
      await p2.fill("#f-password", "tenant admin password");
      await p2.click("button[type=submit]");
      await p2.waitForURL(tenantUrl);
      assert.ok(await p2.isVisible("h1:has-text('Acme Robotics')"));
      await p2.screenshot({
        path: `${ARTIFACTS}portal-tenant-admin-phone.png`,
        fullPage: true,
      });
      // The tenant's limits are the provider's: shown, not editable.
      assert.equal(await p2.inputValue("#f-rpm"), "120");
      assert.equal(await p2.isVisible("text=Save limits"), false);
      assert.ok(await p2.isVisible("text=Your provider sets these"));
      // …and cannot see the other tenant, not even its name.
      const res = await p2.goto(`${base}/tenants/${other.id}`);
      assert.equal(res?.status(), 404);
      assert.equal((await p2.content()).includes("Globex"), false);
      await p2.goto(`${base}/tenants`);
      assert.equal((await p2.content()).includes("Globex"), false);

      // The audit log shows what happened.
      await page.goto(`${base}/audit`);
      for (
        const action of [
          "tenant.create",
          "key.create",
          "key.revoke",
          "limits.set",
          "user.invite",
        ]
      ) {
        assert.ok(await page.isVisible(`td:has-text('${action}')`), action);
      }
      await page.screenshot({
        path: `${ARTIFACTS}portal-audit.png`,
        fullPage: true,
      });
      assert.deepEqual(errors, []);
      await ctx2.close();
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
      await server.shutdown();
      kv.close();
    }
  },
});
