/**
 * Admin tokens in a real browser, on a laptop (1366 px) and a phone (390 px):
 * create one in the portal, see it once, reload (not shown again), revoke
 * it with the inline confirmation. Screenshots go to test-artifacts/.
 */
import assert from "node:assert/strict";
import type { Browser } from "playwright-core";
import { testConfig } from "../config.ts";
import { buildIslands } from "../lib/islands_build.ts";
import { createOrchardApp } from "../server.tsx";
import { verifyAdminToken } from "../store/admin_tokens.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore, type Store } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { createUser } from "../store/users.ts";
import { ARTIFACTS, launchBrowser } from "./_browser.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");

const PASSWORD = "a very long password";

async function createRevoke(
  browser: Browser,
  store: Store,
  base: string,
  viewport: { width: number; height: number },
  name: string,
) {
  const ctx = await browser.newContext({ viewport });
  const page = await ctx.newPage();
  const errors: string[] = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const shot = (what: string) =>
    page.screenshot({
      path: `${ARTIFACTS}admin-tokens-${viewport.width}-${what}.png`,
      fullPage: true,
    });
  await page.goto(`${base}/admin-tokens`);
  await page.waitForURL(/\/login/);
  await page.fill("#f-email", "root@orchard.test");
  await page.fill("#f-password", PASSWORD);
  await page.click("button[type=submit]");
  await page.waitForURL(`${base}/admin-tokens`);
  assert.ok(await page.isVisible("nav >> text=Admin tokens"));

  // Create: the token is shown once, with a working copy button.
  await page.fill("#f-name", name);
  await page.selectOption("#f-role", "tenant_admin");
  await page.selectOption("#f-tenantId", { label: "Acme Robotics (acme)" });
  await page.selectOption("#f-expires", "30");
  await page.click("button:has-text('Create token')");
  await page.waitForURL(`${base}/admin-tokens`);
  const shown = page.locator("[data-testid=new-admin-token]");
  await shown.waitFor();
  const token = (await shown.textContent())!.trim();
  assert.match(token, /^orchadm_[0-9a-z]{26}_[0-9A-Za-z]{38}$/);
  assert.ok(await page.isVisible(`text=Token "${name}" created.`));
  await page.click("[data-testid=copy]");
  await page.waitForSelector("text=Copied ✓");
  const width = await page.evaluate(() => ({
    scroll: document.documentElement.scrollWidth,
    inner: innerWidth,
  }));
  assert.ok(width.scroll <= width.inner, `no sideways scroll: ${width.scroll}`);
  await shot("created");
  const principal = await verifyAdminToken(store, token, null);
  assert.equal(principal?.role, "tenant_admin");

  // Reload: the secret is not shown again, but the token is listed.
  await page.reload();
  assert.equal(await page.isVisible("[data-testid=new-admin-token]"), false);
  assert.equal((await page.content()).includes(token), false);
  const row = page.locator("tr", { hasText: name });
  assert.ok(await row.isVisible());
  assert.ok(await row.locator("text=active").isVisible());

  // Revoke, confirming inline.
  await row.locator("button:has-text('Revoke')").click();
  await row.locator("button:has-text('Yes, revoke')").click();
  await page.waitForSelector(`text=Token "${name}" revoked.`);
  await page.locator("tr", { hasText: name }).locator("text=revoked")
    .waitFor();
  await shot("revoked");
  assert.equal(await verifyAdminToken(store, token, null), null);

  // The users page next to it lists who can sign in, with last sign-in.
  await page.click("nav >> text=Users");
  await page.waitForURL(`${base}/users`);
  const me = page.locator("tr", { hasText: "root@orchard.test" });
  assert.ok(await me.locator("text=active").isVisible());
  assert.equal(await me.locator("button").count(), 0); // not on yourself
  await page.screenshot({
    path: `${ARTIFACTS}users-${viewport.width}.png`,
    fullPage: true,
  });
  assert.deepEqual(errors, []);
  await ctx.close();
}

Deno.test({
  name:
    "admin tokens in Chromium at 1366 px and 390 px: create, shown once, reload hides it, revoke",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    await createTenant(store, SYSTEM, { name: "Acme Robotics", slug: "acme" });
    await createUser(store, SYSTEM, {
      email: "root@orchard.test",
      password: PASSWORD,
      role: "platform_admin",
      tenantId: null,
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
      await createRevoke(browser, store, base, {
        width: 1366,
        height: 800,
      }, "laptop deploy");
      await createRevoke(browser, store, base, {
        width: 390,
        height: 844,
      }, "phone deploy");
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
