/**
 * Portal forms in real Chromium, at 1366 px and at 390 px, doing what people
 * do: create a key and reload (one key, the secret not shown again),
 * double-click "Create key" and send one form twice (one key), drain and
 * suspend (asked first, with and without JavaScript), and open a form's
 * address by hand (its page, not a 404). Screenshots go to test-artifacts/.
 */
import assert from "node:assert/strict";
import type { Page } from "playwright-core";
import { buildIslands } from "../lib/islands_build.ts";
import { listApiKeys } from "../store/api_keys.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import { enrollNode, getNode } from "../store/nodes.ts";
import { SYSTEM } from "../store/principal.ts";
import { createTenant, getTenant } from "../store/tenants.ts";
import { ARTIFACTS, launchBrowser, signIn } from "./_browser.ts";
import { createWorld, type TestWorld } from "./_helpers.ts";

const VIEWPORTS = [
  { name: "desktop", width: 1366, height: 900 },
  { name: "phone", width: 390, height: 844 },
] as const;

async function keysNamed(w: TestWorld, tenantId: string, name: string) {
  const keys = await listApiKeys(w.store, SYSTEM, tenantId, { limit: 100 });
  return keys.items.filter((k) => k.name === name).length;
}

/** Waits for the page's load event: island scripts (modules) have run by then. */
async function hydrated(page: Page) {
  await page.waitForLoadState("load");
}

Deno.test({
  name:
    "portal forms in Chromium at 1366 and 390 px: reload and double-click make one key, destructive actions ask first, form addresses open their pages",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const islands = await buildIslands();
    let app: TestWorld["app"] | null = null;
    const server = Deno.serve({
      port: 0,
      hostname: "127.0.0.1",
      onListen: () => {},
    }, (req, info) => app!.fetch(req, { remoteAddr: info.remoteAddr }));
    const base = `http://127.0.0.1:${server.addr.port}`;
    const w = await createWorld({ islands, config: { publicUrl: base } });
    app = w.app;
    const browser = await launchBrowser();
    try {
      for (const vp of VIEWPORTS) {
        const shot = (what: string) =>
          `${ARTIFACTS}forms-${vp.name}-${what}.png`;
        const tenant = await createTenant(w.store, SYSTEM, {
          name: `Forms ${vp.name}`,
        });
        const { token } = await createJoinToken(w.store, SYSTEM, {});
        const node = await enrollNode(w.store, {
          token,
          publicJwk: {
            kty: "OKP",
            crv: "Ed25519",
            x: vp.name.padEnd(43, "A"),
          },
          url: "http://10.0.0.9:8100",
          name: `mac-${vp.name}`,
          engine: "openai",
          models: [],
          probe: null,
          version: null,
        });
        await w.orchard.fleet.refresh();
        const ctx = await browser.newContext({
          viewport: { width: vp.width, height: vp.height },
        });
        const page = await ctx.newPage();
        const errors: string[] = [];
        page.on("pageerror", (e) => errors.push(String(e)));
        await signIn(page, base, "root@example.com", w.password);
        const tenantUrl = `${base}/tenants/${tenant.id}`;

        // 1. Create a key, then reload: still one key, the secret not shown again.
        await page.goto(tenantUrl);
        await page.fill("#keys input[name=name]", "reloaded");
        await page.click("#keys button:has-text('Create key')");
        await page.waitForSelector("[data-testid=new-key]");
        assert.match(page.url(), new RegExp(`/tenants/${tenant.id}#keys$`));
        const secret = (await page.textContent("[data-testid=new-key]"))!
          .trim();
        assert.match(secret, /^orch_[0-9a-z]{26}_[0-9A-Za-z]{38}$/);
        assert.ok(await page.isVisible("text=shown only once"));
        await page.screenshot({ path: shot("key-created"), fullPage: true });
        await page.reload();
        await page.waitForSelector("#keys");
        assert.equal(await page.isVisible("[data-testid=new-key]"), false);
        assert.equal((await page.content()).includes(secret), false);
        assert.equal(await keysNamed(w, tenant.id, "reloaded"), 1);
        assert.equal(
          await page.locator("#keys tr[data-key-id]").count(),
          1,
        );
        await page.screenshot({ path: shot("key-reloaded"), fullPage: true });
        // Back and forward do not send the form again either.
        await page.goBack();
        await page.goForward();
        assert.equal(await keysNamed(w, tenant.id, "reloaded"), 1);

        // 2. Double-click "Create key": one key, sent once, its secret shown.
        await page.goto(tenantUrl);
        await hydrated(page);
        await page.fill("#keys input[name=name]", "dbl");
        const posts: string[] = [];
        const onRequest = (r: { method(): string; url(): string }) => {
          if (r.method() === "POST") posts.push(r.url());
        };
        page.on("request", onRequest);
        await page.dblclick("#keys button:has-text('Create key')");
        await page.waitForSelector("[data-testid=new-key]");
        page.off("request", onRequest);
        assert.equal(posts.length, 1, "the second click is not sent");
        assert.equal(await keysNamed(w, tenant.id, "dbl"), 1);
        await page.screenshot({ path: shot("double-click"), fullPage: true });
        // Without the guard (a form sent twice by the browser), the server
        // still acts once: the second post finds the first's token.
        await page.goto(tenantUrl);
        await hydrated(page);
        await page.fill("#keys input[name=name]", "unguarded");
        await page.evaluate(() => {
          const form = document.querySelector<HTMLFormElement>(
            "#keys form[action$='/keys']",
          )!;
          const button = form.querySelector<HTMLButtonElement>(
            "button[type=submit]",
          )!;
          // what an old browser does with a double click: two submissions
          form.addEventListener("submit", (e) => e.stopImmediatePropagation(), {
            capture: true,
          });
          button.click();
          button.click();
        });
        await page.waitForFunction(() =>
          document.querySelector("[data-testid=new-key]") ||
          document.querySelector("[data-testid=again]")
        );
        assert.equal(await keysNamed(w, tenant.id, "unguarded"), 1);
        await page.screenshot({
          path: shot("double-click-unguarded"),
          fullPage: true,
        });
        // …and the same form sent twice at once (same _once): one key, and
        // the page says the second was already done.
        await page.goto(tenantUrl);
        await page.fill("#keys input[name=name]", "twice");
        const statuses = await page.evaluate(async () => {
          const form = document.querySelector<HTMLFormElement>(
            "#keys form[action$='/keys']",
          )!;
          const send = () =>
            fetch(form.action, {
              method: "POST",
              body: new URLSearchParams(
                new FormData(form) as unknown as Record<string, string>,
              ),
              redirect: "manual",
            }).then((r) => r.type);
          return await Promise.all([send(), send()]);
        });
        assert.deepEqual(statuses, ["opaqueredirect", "opaqueredirect"]);
        assert.equal(await keysNamed(w, tenant.id, "twice"), 1);
        await page.goto(tenantUrl);
        await page.waitForSelector("[data-testid=again]");
        assert.ok(
          await page.isVisible("text=Already done by your first click"),
        );
        await page.screenshot({ path: shot("sent-twice"), fullPage: true });
        await page.reload();
        assert.equal(await page.isVisible("[data-testid=again]"), false);
        assert.equal(await keysNamed(w, tenant.id, "twice"), 1);

        // 3. Suspend asks first; Cancel leaves it active; confirming suspends.
        await page.goto(`${tenantUrl}#settings`);
        await hydrated(page);
        await page.click("button[data-action=suspend]");
        await page.waitForSelector("button:has-text('Yes, suspend')");
        assert.ok(await page.isVisible("text=Its keys stop working"));
        await page.screenshot({ path: shot("suspend-asks"), fullPage: true });
        assert.equal(
          (await getTenant(w.store, SYSTEM, tenant.id)).status,
          "active",
        );
        await page.click("#settings button:has-text('Cancel')");
        assert.ok(await page.isVisible("button[data-action=suspend]"));
        await page.click("button[data-action=suspend]");
        await page.click("button:has-text('Yes, suspend')");
        await page.waitForSelector("text=Tenant suspended.");
        assert.equal(
          (await getTenant(w.store, SYSTEM, tenant.id)).status,
          "suspended",
        );
        await page.click("#settings button:has-text('Resume tenant')");
        await page.waitForSelector("text=Tenant resumed.");

        // 4. Drain asks first; confirming drains.
        await page.goto(`${base}/nodes`);
        await hydrated(page);
        const row = `[data-node="${node.id}"]`;
        await page.click(`${row} button[data-action=drain]`);
        await page.waitForSelector(`${row} button:has-text('Yes, drain')`);
        assert.equal((await getNode(w.store, SYSTEM, node.id)).drain, false);
        await page.screenshot({ path: shot("drain-asks"), fullPage: true });
        await page.click(`${row} button:has-text('Yes, drain')`);
        await page.waitForSelector("text=Node is draining");
        assert.equal((await getNode(w.store, SYSTEM, node.id)).drain, true);
        assert.ok(await page.isVisible(`${row} button[data-action=undrain]`));
        await page.click(`${row} button[data-action=undrain]`);
        await page.waitForSelector("text=Node is back in service");

        // 5. A form's address opened by hand: its page, never a 404.
        for (
          const [path, lands] of [
            [`/tenants/${tenant.id}/keys`, `/tenants/${tenant.id}`],
            [`/tenants/${tenant.id}/limits`, `/tenants/${tenant.id}`],
            [`/tenants/${tenant.id}/invites`, `/tenants/${tenant.id}`],
            [`/nodes/${node.id}/drain`, "/nodes"],
            ["/nodes/join-tokens", "/nodes"],
            ["/mesh/test-all", "/mesh"],
            ["/settings", "/settings"],
            ["/logout", "/logout"],
          ] as const
        ) {
          const res = await page.goto(`${base}${path}`);
          assert.equal(res?.status(), 200, path);
          assert.equal(new URL(page.url()).pathname, lands, path);
        }
        assert.ok(await page.isVisible("text=Sign out of Orchard?"));
        await page.screenshot({ path: shot("get-logout"), fullPage: true });
        assert.deepEqual(errors, []);
        await ctx.close();

        // 6. Without JavaScript the same buttons still ask, on a page.
        const nojs = await browser.newContext({
          viewport: { width: vp.width, height: vp.height },
          javaScriptEnabled: false,
        });
        const p2 = await nojs.newPage();
        await signIn(p2, base, "root@example.com", w.password);
        await p2.goto(`${base}/nodes`);
        await p2.click(`${row} button[data-action=drain]`);
        await p2.waitForSelector("h1:has-text('Drain mac-')");
        assert.equal((await getNode(w.store, SYSTEM, node.id)).drain, false);
        await p2.screenshot({ path: shot("drain-asks-nojs"), fullPage: true });
        await p2.click("button:has-text('Yes, drain')");
        await p2.waitForSelector("text=Node is draining");
        assert.equal((await getNode(w.store, SYSTEM, node.id)).drain, true);
        await p2.goto(tenantUrl);
        await p2.click("button[data-action=suspend]");
        await p2.waitForSelector("h1:has-text('Suspend Forms')");
        assert.equal(
          (await getTenant(w.store, SYSTEM, tenant.id)).status,
          "active",
        );
        await p2.click("a:has-text('Cancel')");
        await p2.waitForURL(new RegExp(`/tenants/${tenant.id}#settings$`));
        await nojs.close();
      }
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
      await w.close();
    }
  },
});
