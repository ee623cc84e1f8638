/**
 * Single sign-on through a real OpenID provider (oidc-provider, started
 * here) in Debian's Chromium: a platform admin adds the provider in
 * settings; people sign in with its button and are provisioned on first
 * sign-in into the tenant and role their groups map to; someone whose
 * groups map to nothing is refused with a clear page and gets no account;
 * a tampered `state` or `nonce` is refused; a sign-in answer works once;
 * and a tenant whose password sign-in is turned off cannot use passwords.
 */
import assert from "node:assert/strict";
import type { BrowserContext, Page } from "playwright-core";
import { testConfig } from "../config.ts";
import { buildIslands } from "../lib/islands_build.ts";
import { createOrchardApp } from "../server.tsx";
import { listAudit } from "../store/audit.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { createUser, getUserByEmail } from "../store/users.ts";
import { ARTIFACTS, launchBrowser } from "./_browser.ts";
import { startTestIdp } from "./fixtures/oidc_provider.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");

const PASSWORD = "a very long password";

/** Signs in with the test provider from Orchard's sign-in page; returns the page's status. */
async function signInWithIdp(
  page: Page,
  base: string,
  login: string,
): Promise<void> {
  await page.goto(`${base}/login`);
  await page.click("text=Sign in with Test IdP");
  // the provider's own pages: its sign-in form (unless it remembers us), then consent
  const loginBox = page.locator("input[name=login]");
  const consent = page.locator("button:has-text('Continue')");
  await Promise.race([
    loginBox.waitFor(),
    consent.waitFor(),
    page.waitForURL((u) => u.href.startsWith(base)),
  ]);
  if (await loginBox.isVisible()) {
    await loginBox.fill(login);
    await page.fill("input[name=password]", "anything");
    await page.click("button[type=submit]");
    await Promise.race([
      consent.waitFor(),
      page.waitForURL((u) => u.href.startsWith(base)),
    ]);
  }
  if (!page.url().startsWith(base) && await consent.isVisible()) {
    await consent.click();
  }
  await page.waitForURL((u) => u.href.startsWith(base));
  await page.waitForLoadState();
}

/**
 * Rewrites where the sign-in's redirects lead. Playwright does not route
 * requests that are redirects, so this routes the navigations that start a
 * chain (the sign-in button, the provider's form posts), follows the chain
 * itself with the context's cookies, and answers the browser with a 303 to
 * `rewrite`'s URL at the first step it changes (or to where the chain
 * stopped, for the browser to load).
 */
async function rewriteRedirects(
  ctx: BrowserContext,
  base: string,
  issuer: string,
  rewrite: (url: URL) => URL | null,
): Promise<void> {
  await ctx.route(
    (u) => u.href.startsWith(`${base}/sso/`) || u.origin === issuer,
    async (route) => {
      const req = route.request();
      if (!req.isNavigationRequest()) return await route.continue();
      const first = await route.fetch({ maxRedirects: 0 });
      const loc = first.headers()["location"];
      if (!loc || first.status() < 300 || first.status() >= 400) {
        return await route.fulfill({ response: first });
      }
      let url = new URL(loc, req.url());
      for (let i = 0; i < 10; i++) {
        const changed = rewrite(url);
        if (changed) {
          return await route.fulfill({
            status: 303,
            headers: { location: changed.href },
          });
        }
        if (url.origin !== issuer) break;
        const next = await ctx.request.get(url.href, { maxRedirects: 0 });
        const to = next.headers()["location"];
        if (!to || next.status() < 300 || next.status() >= 400) break;
        url = new URL(to, url);
      }
      return await route.fulfill({
        status: 303,
        headers: { location: url.href },
      });
    },
  );
}

async function newContext(ctxs: BrowserContext[], browser: {
  newContext(): Promise<BrowserContext>;
}) {
  const ctx = await browser.newContext();
  // the provider's development pages link a web font; nothing leaves this machine
  await ctx.route(/fonts\.googleapis\.com/, (r) => r.abort());
  ctxs.push(ctx);
  return ctx;
}

Deno.test({
  name:
    "SSO in Chromium against a real OpenID provider: configure, provision, map tenants, refuse, tampering, passwords off",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    const acme = await createTenant(store, SYSTEM, {
      name: "Acme Robotics",
      slug: "acme",
    });
    const globex = await createTenant(store, SYSTEM, {
      name: "Globex",
      slug: "globex",
    });
    await createUser(store, SYSTEM, {
      email: "root@orchard.test",
      password: PASSWORD,
      role: "platform_admin",
      tenantId: null,
    });
    await createUser(store, SYSTEM, {
      email: "bob@acme.test",
      password: PASSWORD,
      role: "tenant_viewer",
      tenantId: acme.id,
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
    const idp = await startTestIdp({
      redirectUris: [`${base}/sso/test/callback`],
      accounts: {
        alice: {
          email: "alice@acme.test",
          email_verified: true,
          name: "Alice",
          groups: ["staff", "acme-admins"],
        },
        gus: {
          email: "gus@globex.test",
          email_verified: true,
          groups: ["globex-staff"],
        },
        mallory: {
          email: "mallory@elsewhere.test",
          email_verified: true,
          groups: ["contractors"],
        },
      },
    });
    const browser = await launchBrowser();
    const ctxs: BrowserContext[] = [];
    const shot = (page: Page, what: string) =>
      page.screenshot({ path: `${ARTIFACTS}sso-${what}.png`, fullPage: true });
    try {
      const admin = await (await newContext(ctxs, browser)).newPage();

      await t.step(
        "a platform admin adds the provider in settings",
        async () => {
          await admin.goto(`${base}/settings/sso`);
          await admin.waitForURL(/\/login/);
          await admin.fill("#f-email", "root@orchard.test");
          await admin.fill("#f-password", PASSWORD);
          await admin.click("button[type=submit]");
          await admin.waitForURL(`${base}/settings/sso`);
          await admin.fill("#sso-new-id", "test");
          await admin.fill("#sso-new-displayName", "Test IdP");
          await admin.fill("#sso-new-issuer", idp.issuer);
          await admin.fill("#sso-new-clientId", idp.clientId);
          await admin.fill("#sso-new-clientSecret", idp.clientSecret);
          await admin.fill("#sso-new-scopes", "openid email profile groups");
          await admin.fill(
            "#sso-new-rules",
            [
              'groups contains "acme-admins" -> tenant acme, role tenant_admin',
              'groups contains "globex-staff" -> tenant globex, role tenant_viewer',
            ].join("\n"),
          );
          await admin.click("button:has-text('Add provider')");
          await admin.waitForSelector('text=Provider "Test IdP" added.');
          assert.equal(
            (await admin.textContent("[data-testid=redirect-uri]"))?.trim(),
            `${base}/sso/test/callback`,
          );
          await shot(admin, "settings");
          // the client secret is nowhere in KV in clear
          for await (const e of kv.list({ prefix: [] })) {
            assert.ok(
              !JSON.stringify(e.value).includes(idp.clientSecret),
              `secret in clear under ${JSON.stringify(e.key)}`,
            );
          }
          const audit = await listAudit(kv, SYSTEM, {});
          assert.ok(
            audit.items.some((a) => a.action === "sso.provider.create"),
          );
        },
      );

      await t.step(
        "first sign-in provisions a tenant admin of acme",
        async () => {
          const page = await (await newContext(ctxs, browser)).newPage();
          await signInWithIdp(page, base, "alice");
          assert.equal(page.url(), `${base}/tenants/${acme.id}`);
          assert.ok(await page.isVisible("text=alice@acme.test"));
          await shot(page, "alice-signed-in");
          const alice = await getUserByEmail(store, "alice@acme.test");
          assert.equal(alice?.role, "tenant_admin");
          assert.equal(alice?.tenantId, acme.id);
          assert.equal(alice?.passwordHash, "");
          const actions = (await listAudit(kv, SYSTEM, { actorId: alice!.id }))
            .items.map((a) => a.action);
          assert.ok(actions.includes("user.provision"), actions.join());
          assert.ok(actions.includes("user.sso_sign_in"), actions.join());

          // signing out and in again signs in the same account
          await page.goto(`${base}/logout`);
          await page.click("button:has-text('Sign out')");
          await page.waitForURL(/\/login/);
          await signInWithIdp(page, base, "alice");
          assert.equal(page.url(), `${base}/tenants/${acme.id}`);
          let users = 0;
          for await (const _ of kv.list({ prefix: ["user_by_email"] })) users++;
          assert.equal(users, 3); // root, bob, alice
        },
      );

      await t.step(
        "groups map another person to another tenant and role",
        async () => {
          const page = await (await newContext(ctxs, browser)).newPage();
          await signInWithIdp(page, base, "gus");
          assert.equal(page.url(), `${base}/tenants/${globex.id}`);
          const gus = await getUserByEmail(store, "gus@globex.test");
          assert.equal(gus?.role, "tenant_viewer");
          assert.equal(gus?.tenantId, globex.id);
        },
      );

      await t.step(
        "claims that match no rule: a clear refusal, no account",
        async () => {
          const page = await (await newContext(ctxs, browser)).newPage();
          const answer = page.waitForResponse(/\/sso\/test\/callback/);
          await signInWithIdp(page, base, "mallory");
          assert.equal((await answer).status(), 403);
          assert.ok(
            await page.isVisible("h1:has-text('No access to Orchard')"),
          );
          const message = await page.textContent("[data-testid=sso-error]");
          assert.match(message!, /mallory@elsewhere\.test/);
          assert.match(message!, /No Orchard account was created/);
          await shot(page, "refused");
          assert.equal(
            await getUserByEmail(store, "mallory@elsewhere.test"),
            null,
          );
          const refused = (await listAudit(kv, SYSTEM, {})).items.find((a) =>
            a.action === "user.sso_refused"
          );
          assert.equal(refused?.target.label, "mallory@elsewhere.test");
          // and no session: the portal asks to sign in
          await page.goto(`${base}/tenants`);
          await page.waitForURL(/\/login/);
        },
      );

      await t.step("a tampered state is refused", async () => {
        const ctx = await newContext(ctxs, browser);
        const page = await ctx.newPage();
        await rewriteRedirects(ctx, base, idp.issuer, (url) => {
          if (!url.href.startsWith(`${base}/sso/test/callback`)) return null;
          url.searchParams.set("state", "forged-state-value");
          return url;
        });
        const answer = page.waitForResponse(/\/sso\/test\/callback/);
        await signInWithIdp(page, base, "alice");
        assert.equal((await answer).status(), 400);
        const message = await page.textContent("[data-testid=sso-error]");
        assert.match(message!, /state does not match/);
        await page.goto(`${base}/tenants`);
        await page.waitForURL(/\/login/);
      });

      await t.step("a tampered nonce is refused", async () => {
        const ctx = await newContext(ctxs, browser);
        const page = await ctx.newPage();
        // the authorization request reaches the provider with another nonce,
        // so the ID token carries one this attempt never made
        await rewriteRedirects(ctx, base, idp.issuer, (url) => {
          if (url.origin !== idp.issuer || !url.searchParams.has("nonce")) {
            return null;
          }
          url.searchParams.set("nonce", "forged-nonce-value");
          return url;
        });
        const answer = page.waitForResponse(/\/sso\/test\/callback/);
        await signInWithIdp(page, base, "alice");
        assert.equal((await answer).status(), 400);
        const message = await page.textContent("[data-testid=sso-error]");
        assert.match(message!, /nonce does not match/);
        await page.goto(`${base}/tenants`);
        await page.waitForURL(/\/login/);
      });

      await t.step("a sign-in answer works once", async () => {
        const ctx = await newContext(ctxs, browser);
        const page = await ctx.newPage();
        let callback = "";
        await rewriteRedirects(ctx, base, idp.issuer, (url) => {
          if (!url.href.startsWith(`${base}/sso/test/callback`)) return null;
          callback = url.href;
          return new URL(`${base}/healthz`);
        });
        await signInWithIdp(page, base, "alice");
        assert.ok(callback, "the provider redirected back");
        const cookie = (await ctx.cookies(callback)).find((c) =>
          c.name === "orchard_sso"
        );
        assert.ok(cookie, "the attempt cookie");
        const replay = () =>
          app.request(callback, {
            headers: { cookie: `orchard_sso=${cookie.value}` },
          });
        const first = await replay();
        assert.equal(first.status, 303);
        assert.match(first.headers.get("set-cookie") ?? "", /orchard_session=/);
        const second = await replay();
        assert.equal(second.status, 400);
        assert.match(await second.text(), /already used/);
      });

      await t.step("password sign-in turned off for acme", async () => {
        await admin.goto(`${base}/settings/sso#passwords`);
        const row = admin.locator("tr[data-tenant=acme]");
        await row.locator("button:has-text('Turn passwords off')").click();
        await row.locator("button:has-text('Yes, SSO only')").click();
        await admin.waitForSelector("text=Password sign-in turned off");
        assert.ok(
          await admin.locator("tr[data-tenant=acme] >> text=off: SSO only")
            .isVisible(),
        );
        await shot(admin, "passwords-off");

        const page = await (await newContext(ctxs, browser)).newPage();
        await page.goto(`${base}/login`);
        await page.fill("#f-email", "bob@acme.test");
        await page.fill("#f-password", PASSWORD);
        const answer = page.waitForResponse((r) =>
          r.url().startsWith(`${base}/login`) && r.request().method() === "POST"
        );
        await page.click("button[type=submit]");
        assert.equal((await answer).status(), 403);
        assert.ok(
          await page.isVisible("text=Your organisation signs in with single"),
        );
        assert.ok(await page.isVisible("text=Sign in with Test IdP"));
        // a platform admin keeps the password
        await page.fill("#f-email", "root@orchard.test");
        await page.fill("#f-password", PASSWORD);
        await page.click("button[type=submit]");
        await page.waitForURL(`${base}/tenants`);
        const actions = (await listAudit(kv, SYSTEM, { tenantId: acme.id }))
          .items.map((a) => a.action);
        assert.ok(actions.includes("tenant.password_sign_in.disable"));
      });
    } catch (err) {
      for (const ctx of ctxs) {
        for (const p of ctx.pages()) {
          await p.screenshot({
            path: `${ARTIFACTS}sso-failure-${Date.now()}.png`,
          }).catch(() => {});
        }
      }
      throw err;
    } finally {
      for (const ctx of ctxs) await ctx.close().catch(() => {});
      await browser.close();
      await idp.close();
      await server.shutdown();
      kv.close();
    }
  },
});
