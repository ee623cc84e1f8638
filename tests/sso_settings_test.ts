/**
 * The SSO settings page's errors: a provider whose issuer cannot be
 * discovered, or whose rules do not parse, is not saved, and the page says
 * why (400) with what was typed, never the secret; the sign-in routes of an
 * unknown provider answer a readable 404.
 */
import assert from "node:assert/strict";
import { k } from "../store/kv_keys.ts";
import { createWorld, portalLogin } from "./_helpers.ts";

Deno.test("SSO settings: an undiscoverable issuer or bad rules are said on the page and nothing is saved", async () => {
  const w = await createWorld();
  try {
    const { cookie, csrf } = await portalLogin(w, "root@example.com");
    const post = (form: Record<string, string>) =>
      w.app.request("/settings/sso/providers", {
        method: "POST",
        headers: {
          cookie,
          host: "localhost",
          origin: "http://localhost",
          "content-type": "application/x-www-form-urlencoded",
        },
        body: new URLSearchParams({ _csrf: csrf, ...form }),
      });
    const form = {
      id: "corp",
      displayName: "Corp",
      // nothing listens on port 1
      issuer: "http://127.0.0.1:1",
      clientId: "client-id-typed",
      clientSecret: "typed-secret-value",
      scopes: "openid email",
      rules: 'groups contains "ops" -> role platform_admin',
      enabled: "1",
    };
    const unreachable = await post(form);
    assert.equal(unreachable.status, 400);
    const html = await unreachable.text();
    assert.match(html, /Issuer: Cannot read the provider(&#39;|')s discovery/);
    assert.match(html, /client-id-typed/);
    assert.doesNotMatch(html, /typed-secret-value/);

    const badRules = await post({ ...form, rules: "groups has ops" });
    assert.equal(badRules.status, 400);
    assert.match(await badRules.text(), /Rule line 1: write it as/);

    const insecure = await post({ ...form, issuer: "http://idp.example" });
    assert.equal(insecure.status, 400);
    assert.match(await insecure.text(), /must use https/);
    assert.equal((await w.kv.get(k.ssoProvider("corp"))).value, null);

    // a tenant admin may not even see the page
    const a = await portalLogin(w, "a-admin@example.com");
    const page = await w.app.request("/settings/sso", {
      headers: { cookie: a.cookie },
    });
    assert.equal(page.status, 403);

    // signing in with a provider that does not exist: a readable 404
    const start = await w.app.request("/sso/nope/start");
    assert.equal(start.status, 404);
    assert.match(await start.text(), /does not exist or was turned off/);
    const back = await w.app.request("/sso/nope/callback?code=x&state=y");
    assert.equal(back.status, 400);
    assert.match(await back.text(), /expired or was started in another/);
  } finally {
    await w.close();
  }
});
