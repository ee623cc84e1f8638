/**
 * Portal forms without a browser: every post that changes something answers
 * 303 to its page with a one-time flash cookie (encrypted, HttpOnly,
 * SameSite=Strict, path-scoped; no secret in KV), a repeated post with the
 * same `_once` token does not act twice, destructive posts ask first, a
 * plain GET of every post address is not a 404, and messages carry no
 * field paths.
 */
import assert from "node:assert/strict";
import { createApiKey, listApiKeys } from "../store/api_keys.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import { enrollNode, getNode } from "../store/nodes.ts";
import { passwordSignInAllowed } from "../store/sign_in_policy.ts";
import { SYSTEM } from "../store/principal.ts";
import { bootstrapAdmin, completeSetup } from "../store/sessions.ts";
import { createStore } from "../store/store.ts";
import { getTenant } from "../store/tenants.ts";
import { findInvite, listUsers } from "../store/users.ts";
import { createOrchardApp } from "../server.tsx";
import { testConfig } from "../config.ts";
import {
  createWorld,
  portalLogin,
  TEST_ISLANDS,
  type TestWorld,
} from "./_helpers.ts";

/** A small cookie jar: name → value and path, sent by path prefix. */
class Jar {
  cookies = new Map<string, { value: string; path: string; raw: string }>();
  take(res: Response) {
    for (const raw of res.headers.getSetCookie()) {
      const [pair, ...attrs] = raw.split(";").map((s) => s.trim());
      const i = pair!.indexOf("=");
      const name = pair!.slice(0, i);
      const value = pair!.slice(i + 1);
      const path = attrs.find((a) => /^path=/i.test(a))?.slice(5) ?? "/";
      const gone = attrs.some((a) => /^max-age=0$/i.test(a)) || value === "";
      if (gone) this.cookies.delete(name);
      else this.cookies.set(name, { value, path, raw });
    }
  }
  header(path: string): string {
    return [...this.cookies].filter(([, c]) =>
      path === c.path || path.startsWith(c.path.replace(/\/?$/, "/")) ||
      c.path === "/"
    ).map(([n, c]) => `${n}=${c.value}`).join("; ");
  }
}

interface Browser {
  jar: Jar;
  csrf: string;
  get(path: string): Promise<Response>;
  post(path: string, form?: Record<string, string>): Promise<Response>;
  /** Follows a 303 like a browser (GET of its location, cookies kept). */
  follow(res: Response): Promise<Response>;
}

async function signIn(w: TestWorld, email: string): Promise<Browser> {
  const { cookie, csrf } = await portalLogin(w, email);
  const jar = new Jar();
  const [name, value] = cookie.split("=") as [string, string];
  jar.cookies.set(name, { value, path: "/", raw: cookie });
  const b: Browser = {
    jar,
    csrf,
    async get(path) {
      const res = await w.app.request(path, {
        headers: { cookie: jar.header(path.split(/[?#]/)[0]!) },
      });
      jar.take(res);
      return res;
    },
    async post(path, form = {}) {
      const res = await w.app.request(path, {
        method: "POST",
        headers: {
          cookie: jar.header(path.split("?")[0]!),
          origin: "http://localhost",
          host: "localhost",
          "content-type": "application/x-www-form-urlencoded",
        },
        body: new URLSearchParams({ _csrf: csrf, ...form }),
      });
      jar.take(res);
      return res;
    },
    follow(res) {
      assert.equal(res.status, 303);
      return b.get(res.headers.get("location")!);
    },
  };
  return b;
}

function onceOf(html: string, action: string): string {
  const at = html.indexOf(`action="${action}"`);
  assert.ok(at >= 0, `no form posting to ${action}`);
  const m = /name="_once" value="([^"]+)"/.exec(html.slice(at));
  assert.ok(m, "form without _once");
  return m[1]!;
}

async function kvDump(w: TestWorld): Promise<string> {
  const parts: string[] = [];
  for await (const e of w.kv.list({ prefix: [] })) {
    parts.push(JSON.stringify([e.key, e.value]));
  }
  return parts.join("\n");
}

Deno.test("portal forms: a new key answers 303 with an encrypted one-time flash; the page shows the secret once; nothing secret is stored", async () => {
  const w = await createWorld();
  try {
    const b = await signIn(w, "a-admin@example.com");
    const page = `/tenants/${w.tenantA.id}`;
    const html = await (await b.get(page)).text();
    const res = await b.post(`${page}/keys`, {
      name: "dbl",
      scopes: "chat",
      _once: onceOf(html, `${page}/keys`),
    });
    assert.equal(res.status, 303);
    assert.equal(res.headers.get("location"), `${page}#keys`);
    assert.equal(res.headers.get("cache-control"), "no-store");
    const flash = b.jar.cookies.get("orchard_flash")!;
    assert.ok(flash, "flash cookie set");
    assert.match(flash.raw, /HttpOnly/i);
    assert.match(flash.raw, /SameSite=Strict/i);
    assert.match(flash.raw, new RegExp(`Path=${page}(;|$)`));
    assert.match(flash.raw, /Max-Age=300/);
    // a compact JWE (dir + A256GCM): five parts, the header says so
    const parts = flash.value.split(".");
    assert.equal(parts.length, 5);
    const header = JSON.parse(atob(
      parts[0]!.replace(/-/g, "+")
        .replace(/_/g, "/"),
    ));
    assert.equal(header.alg, "dir");
    assert.equal(header.enc, "A256GCM");
    assert.doesNotMatch(flash.value, /orch_/);

    const shown = await b.follow(res);
    const text = await shown.text();
    const key = /data-testid="new-key">([^<]+)</.exec(text)?.[1]?.trim();
    assert.match(key ?? "", /^orch_[0-9a-z]{26}_[0-9A-Za-z]{38}$/);
    assert.match(text, /shown only once/);
    assert.match(text, /Key (&quot;|")dbl(&quot;|") created\./);
    // the GET that showed it cleared it: a reload shows it no more
    assert.equal(b.jar.cookies.has("orchard_flash"), false);
    const reload = await (await b.get(page)).text();
    assert.equal(reload.includes(key!), false);
    assert.doesNotMatch(reload, /data-testid="new-key"/);
    // nothing in KV holds the secret, its secret part or the flash
    const dump = await kvDump(w);
    assert.equal(dump.includes(key!), false);
    assert.equal(dump.includes(key!.split("_")[2]!), false);
    assert.equal(dump.includes(flash.value), false);
    const keys = await listApiKeys(w.store, SYSTEM, w.tenantA.id, {});
    assert.equal(keys.items.filter((k) => k.name === "dbl").length, 1);

    // the flash only opens for its session and its page
    const other = await signIn(w, "a-viewer@example.com");
    const stolen = await w.app.request(page, {
      headers: {
        cookie: `${other.jar.header("/")}; orchard_flash=${flash.value}`,
      },
    });
    assert.equal((await stolen.text()).includes(key!), false);
    const elsewhere = await w.app.request(`/tenants/${w.tenantA.id}`, {
      headers: {
        cookie: `${b.jar.header("/")}; orchard_flash=x${flash.value}`,
      },
    });
    assert.equal((await elsewhere.text()).includes(key!), false);
  } finally {
    await w.close();
  }
});

Deno.test("portal forms: two posts with the same _once create one key; the second goes where the first went and says it was already done", async () => {
  const w = await createWorld();
  try {
    const b = await signIn(w, "a-admin@example.com");
    const page = `/tenants/${w.tenantA.id}`;
    const once = onceOf(await (await b.get(page)).text(), `${page}/keys`);
    const form = { name: "twice", scopes: "chat", _once: once };
    // at the same time (a double click) …
    const [r1, r2] = await Promise.all([
      b.post(`${page}/keys`, form),
      b.post(`${page}/keys`, form),
    ]);
    assert.deepEqual([r1.status, r2.status], [303, 303]);
    assert.equal(r1.headers.get("location"), r2.headers.get("location"));
    // … and again later (a resent form)
    const r3 = await b.post(`${page}/keys`, form);
    assert.equal(r3.status, 303);
    assert.equal(r3.headers.get("location"), `${page}#keys`);
    const keys = await listApiKeys(w.store, SYSTEM, w.tenantA.id, {});
    assert.equal(keys.items.filter((k) => k.name === "twice").length, 1);

    // the first answer was abandoned (its cookie never arrived): the page
    // says it was already done instead of acting twice
    b.jar.cookies.delete("orchard_flash");
    const again = await (await b.get(page)).text();
    assert.match(again, /Already done by your first click/);
    assert.match(again, /revoke it and make a new one/);
    assert.doesNotMatch(again, /data-testid="new-key"/);
    assert.doesNotMatch(await (await b.get(page)).text(), /Already done/);

    // KV keeps only where it went, under the session and token
    const claims = [];
    for await (const e of w.kv.list({ prefix: ["form_once"] })) {
      claims.push(e.value);
    }
    assert.equal(claims.length, 1);
    assert.deepEqual(Object.keys(claims[0] as object).sort(), [
      "at",
      "location",
      "state",
    ]);

    // a post that failed (changed nothing) can be sent again with its token
    const once2 = onceOf(await (await b.get(page)).text(), `${page}/keys`);
    const bad = await b.post(`${page}/keys`, {
      name: "",
      scopes: "chat",
      _once: once2,
    });
    assert.equal(bad.status, 400);
    const good = await b.post(`${page}/keys`, {
      name: "second try",
      scopes: "chat",
      _once: once2,
    });
    assert.equal(good.status, 303);
    const after = await listApiKeys(w.store, SYSTEM, w.tenantA.id, {});
    assert.equal(after.items.filter((k) => k.name === "second try").length, 1);
  } finally {
    await w.close();
  }
});

Deno.test("portal forms: every post succeeds with 303 to its page's section; a plain GET of every post address is never a 404", async () => {
  const w = await createWorld();
  try {
    const root = await signIn(w, "root@example.com");
    const a = w.tenantA.id;
    const { token } = await createJoinToken(w.store, SYSTEM, {});
    const node = await enrollNode(w.store, {
      token,
      publicJwk: { kty: "OKP", crv: "Ed25519", x: "n".padEnd(43, "A") },
      url: "http://10.0.0.1:8100",
      name: "mac-a",
      engine: "openai",
      models: [],
      probe: null,
      version: null,
    });
    const expect = async (
      path: string,
      form: Record<string, string>,
      location: string,
      message: RegExp,
    ) => {
      const res = await root.post(path, form);
      assert.equal(res.status, 303, `${path}: ${res.status}`);
      assert.equal(res.headers.get("location"), location, path);
      const html = await (await root.follow(res)).text();
      assert.match(html, message, path);
      // shown once
      const again = await (await root.get(location.split("#")[0]!)).text();
      assert.doesNotMatch(again, message, `${path} shown twice`);
    };
    await expect(
      `/tenants/${a}/limits`,
      { rpm: "100" },
      `/tenants/${a}#limits`,
      /Limits saved\./,
    );
    await expect(
      `/tenants/${a}`,
      { name: "Acme Two" },
      `/tenants/${a}#settings`,
      /Tenant renamed\./,
    );
    await expect(
      `/tenants/${a}`,
      { status: "suspended", confirm: "1" },
      `/tenants/${a}#settings`,
      /Tenant suspended\./,
    );
    await expect(
      `/tenants/${a}`,
      { status: "active" },
      `/tenants/${a}#settings`,
      /Tenant resumed\./,
    );
    await expect(
      `/tenants/${a}/invites`,
      { email: "new@acme.test", role: "tenant_viewer" },
      `/tenants/${a}#members`,
      /Invite for new@acme\.test created\./,
    );
    await expect(
      `/nodes/${node.id}/drain`,
      { confirm: "1" },
      "/nodes#nodes",
      /Node is draining/,
    );
    await expect(
      `/nodes/${node.id}/undrain`,
      {},
      "/nodes#nodes",
      /Node is back in service/,
    );
    await expect(
      "/nodes/join-tokens",
      { uses: "1", ttlMinutes: "30" },
      "/nodes#join",
      /--join [0-9a-z]+\.[0-9A-Za-z]+/,
    );
    await expect(
      "/settings",
      {
        currency: "EUR",
        hardwarePricePerNode: "4000",
        amortisationMonths: "36",
        idleWatts: "10",
        busyWatts: "80",
        tariffPerKwh: "0.3",
      },
      "/settings",
      /Settings saved\./,
    );
    await expect(
      "/settings/sso/password",
      { tenantId: a, allowed: "0", confirm: "1" },
      "/settings/sso#passwords",
      /Password sign-in turned off/,
    );
    await expect(
      "/settings/sso/password",
      { tenantId: a, allowed: "1" },
      "/settings/sso#passwords",
      /Password sign-in allowed again/,
    );
    await expect("/mesh/test-all", {}, "/mesh", /Testing all pairs/);
    await expect(
      `/nodes/${node.id}/remove`,
      { confirm: "1" },
      "/nodes#nodes",
      /Node removed\./,
    );
    const created = await root.post("/tenants", { name: "Hooli" });
    assert.equal(created.status, 303);
    assert.match(created.headers.get("location")!, /^\/tenants\/[0-9a-z]+$/);
    assert.match(
      await (await root.follow(created)).text(),
      /Tenant (&quot;|")Hooli(&quot;|") created/,
    );

    // a plain GET of every portal post address: its page, never a 404
    const posts = w.app.routes.filter((r) =>
      r.method === "POST" && !/^\/(api|v1)\b/.test(r.path) &&
      !r.path.includes("*")
    ).map((r) => r.path);
    assert.ok(posts.length >= 15, `${posts.length} post routes`);
    for (const path of new Set(posts)) {
      const url = path.replace(":action{disable|enable}", "disable")
        .replace(":keyId", "k").replace(":inviteId", "i")
        .replace(":userId", "u").replace(":tokenId", "t")
        .replace(":token", "x.y")
        .replace(":id", path.startsWith("/nodes") ? node.id : a);
      const res = await root.get(url);
      assert.notEqual(res.status, 404, `GET ${url}`);
      assert.ok(res.status < 500, `GET ${url}: ${res.status}`);
      let page = res;
      for (let hop = 0; hop < 3 && page.status === 303; hop++) {
        page = await root.get(page.headers.get("location")!);
      }
      // one-time links (setup, invites, password resets) say at GET that they are used: 410
      assert.ok(
        page.status === 200 ||
          (page.status === 410 && /setup|invite|reset/.test(url)),
        `GET ${url} ends at ${page.status}`,
      );
    }
    // signed out, they go to sign-in
    const anon = await w.app.request(`/tenants/${a}/keys`);
    assert.equal(anon.status, 303);
    assert.match(anon.headers.get("location")!, /^\/login/);
  } finally {
    await w.close();
  }
});

Deno.test("portal forms: drain, remove, suspend, revoke and disable ask first when the post is not confirmed", async () => {
  const w = await createWorld();
  try {
    const root = await signIn(w, "root@example.com");
    const a = w.tenantA.id;
    const { token } = await createJoinToken(w.store, SYSTEM, {});
    const node = await enrollNode(w.store, {
      token,
      publicJwk: { kty: "OKP", crv: "Ed25519", x: "m".padEnd(43, "A") },
      url: "http://10.0.0.1:8100",
      name: "mac-b",
      engine: "openai",
      models: [],
      probe: null,
      version: null,
    });
    const drain = await root.post(`/nodes/${node.id}/drain`);
    assert.equal(drain.status, 200);
    const html = await drain.text();
    assert.match(html, /Drain mac-b\?/);
    assert.match(html, /name="confirm" value="1"/);
    assert.match(html, /Yes, drain/);
    assert.equal((await getNode(w.store, SYSTEM, node.id)).drain, false);
    const remove = await root.post(`/nodes/${node.id}/remove`);
    assert.match(await remove.text(), /Remove mac-b\?/);
    const ssoOnly = await root.post("/settings/sso/password", {
      tenantId: a,
      allowed: "0",
    });
    assert.equal(ssoOnly.status, 200);
    assert.match(await ssoOnly.text(), /Turn password sign-in off\?/);
    assert.equal(await passwordSignInAllowed(w.store, a), true);
    const suspend = await root.post(`/tenants/${a}`, { status: "suspended" });
    assert.equal(suspend.status, 200);
    assert.match(await suspend.text(), /Suspend Acme\?/);
    assert.equal((await getTenant(w.store, SYSTEM, a)).status, "active");
    // confirmed, it acts
    const ok = await root.post(`/tenants/${a}`, {
      status: "suspended",
      confirm: "1",
    });
    assert.equal(ok.status, 303);
    assert.equal((await getTenant(w.store, SYSTEM, a)).status, "suspended");
    const { apiKey } = await createApiKey(w.store, SYSTEM, a, { name: "k" });
    const revoke = await root.post(`/tenants/${a}/keys/${apiKey.id}/revoke`);
    assert.equal(revoke.status, 200);
    assert.match(await revoke.text(), /Revoke key (&quot;|")k(&quot;|")\?/);
    const keys = await listApiKeys(w.store, SYSTEM, a, {});
    assert.equal(keys.items[0]!.revokedAt, null);
    const viewerUser = (await listUsers(w.store, SYSTEM, a, {})).items.find((
      u,
    ) => u.role === "tenant_viewer")!;
    const disable = await root.post(
      `/tenants/${a}/users/${viewerUser.id}/disable`,
    );
    assert.match(await disable.text(), /Disable a-viewer@example\.com\?/);
    // a viewer gets no question, only a refusal
    const viewer = await signIn(w, "a-viewer@example.com");
    const denied = await viewer.post(`/tenants/${a}/keys/x/revoke`);
    assert.equal(denied.status, 403);
  } finally {
    await w.close();
  }
});

Deno.test("portal forms: invites are listed, re-inviting replaces the link and says so, and they can be revoked", async () => {
  const w = await createWorld();
  try {
    const b = await signIn(w, "a-admin@example.com");
    const page = `/tenants/${w.tenantA.id}`;
    const first = await b.follow(
      await b.post(`${page}/invites`, {
        email: "ops@acme.test",
        role: "tenant_admin",
      }),
    );
    const html1 = await first.text();
    const link1 = /data-testid="invite-link">([^<]+)</.exec(html1)![1]!;
    assert.match(html1, /data-invite="ops@acme.test"/);
    const second = await b.follow(
      await b.post(`${page}/invites`, {
        email: "ops@acme.test",
        role: "tenant_viewer",
      }),
    );
    const html2 = await second.text();
    assert.match(html2, /replaces the previous link, which no longer works/);
    const link2 = /data-testid="invite-link">([^<]+)</.exec(html2)![1]!;
    assert.notEqual(link1, link2);
    assert.equal(await findInvite(w.store, link1.split("/invite/")[1]!), null);
    const inv = await findInvite(w.store, link2.split("/invite/")[1]!);
    assert.ok(inv);
    assert.equal(inv.role, "tenant_viewer");
    assert.equal(html2.split('data-invite="ops@acme.test"').length - 1, 1);
    const open = await w.app.request(new URL(link1).pathname);
    assert.equal(open.status, 410);

    const revoked = await b.post(`${page}/invites/${inv.id}/revoke`, {
      confirm: "1",
    });
    assert.equal(revoked.status, 303);
    const html3 = await (await b.follow(revoked)).text();
    assert.match(html3, /Invite for ops@acme\.test revoked\./);
    assert.doesNotMatch(html3, /data-invite="ops@acme.test"/);
    assert.equal(await findInvite(w.store, link2.split("/invite/")[1]!), null);
    // another tenant's invite is not found
    const nope = await b.post(
      `/tenants/${w.tenantB.id}/invites/${inv.id}/revoke`,
      { confirm: "1" },
    );
    assert.equal(nope.status, 404);
  } finally {
    await w.close();
  }
});

Deno.test("portal forms: readable messages (no field paths, once), 1e30 is too large, a used setup link says so at GET, statements before the tenant, favicon", async () => {
  const w = await createWorld();
  try {
    const root = await signIn(w, "root@example.com");
    const page = `/tenants/${w.tenantA.id}`;
    const big = await root.post(`${page}/limits`, { rpm: "1e30" });
    assert.equal(big.status, 400);
    const bigHtml = await big.text();
    assert.match(
      bigHtml,
      /Requests \/ minute is too large: the maximum is 1,000,000,000,000/,
    );
    assert.doesNotMatch(bigHtml, /whole number|rpm:/);
    assert.match(bigHtml, /value="1e30"/);
    const neg = await (await root.post(`${page}/limits`, { rpm: "-5" })).text();
    assert.match(neg, /Requests \/ minute must be 0 or more/);
    const scope = await (await root.post(`${page}/keys`, {
      name: "x",
      scopes: "write",
    })).text();
    assert.match(scope, /Scope must be chat, embeddings or models/);
    assert.doesNotMatch(scope, /scopes\.\d:/);
    assert.match(scope, /value="x"/);
    const empty = await root.post("/tenants", { name: " " });
    const emptyHtml = await empty.text();
    assert.equal(emptyHtml.split("Name is required").length - 1, 1);

    // setup: a link that is not the pending one says so before the form
    const kv = await Deno.openKv(":memory:");
    try {
      const store = await createStore(kv);
      const boot = await bootstrapAdmin(store, {});
      const app = createOrchardApp(
        { store, config: testConfig() },
        TEST_ISLANDS,
      );
      const stale = await app.request("/setup?token=not-the-token");
      assert.equal(stale.status, 410);
      const staleHtml = await stale.text();
      assert.match(staleHtml, /invalid or was already used/);
      assert.doesNotMatch(staleHtml, /name="password"/);
      const good = await app.request(`/setup?token=${boot!.setupToken}`);
      assert.equal(good.status, 200);
      assert.match(await good.text(), /name="password"/);
      const short = await app.request("/setup", {
        method: "POST",
        headers: {
          "content-type": "application/x-www-form-urlencoded",
          origin: "http://localhost",
          host: "localhost",
        },
        body: new URLSearchParams({
          token: boot!.setupToken!,
          email: "a@b.test",
          password: "short",
        }),
      });
      const shortHtml = await short.text();
      assert.match(shortHtml, /Password must be at least 12 characters/);
      assert.doesNotMatch(shortHtml, /body:/);
      await completeSetup(
        store,
        boot!.setupToken!,
        "a@b.test",
        "a long enough password",
        null,
      );
      const used = await app.request(`/setup?token=${boot!.setupToken}`);
      assert.equal(used.status, 410);
      assert.match(await used.text(), /already complete/);
    } finally {
      kv.close();
    }

    // statements: before the tenant existed, no page of zeros
    const old = await root.get(`${page}/statements/1999-01`);
    assert.equal(old.status, 200);
    const oldHtml = await old.text();
    assert.match(
      oldHtml,
      /No usage in 1999-01: Acme was created in \d{4}-\d\d/,
    );
    assert.doesNotMatch(oldHtml, /data-testid="statement-total"/);
    const month = new Date().toISOString().slice(0, 7);
    assert.match(oldHtml, new RegExp(`type="month"[^>]*min="${month}"`));
    const picked = await root.get(`${page}/statements?month=1999-01`);
    assert.equal(picked.status, 303);
    assert.equal(
      picked.headers.get("location"),
      `${page}/statements/${month}`,
    );
    const bad = await (await root.get(`${page}/statements/2026-13`)).text();
    assert.doesNotMatch(bad, /month: /);

    // a favicon, served by the portal and linked from every page
    const ico = await w.app.request("/favicon.ico");
    assert.equal(ico.status, 301);
    assert.equal(ico.headers.get("location"), "/static/favicon.svg");
    const svg = await w.app.request("/static/favicon.svg");
    assert.equal(svg.status, 200);
    assert.match(svg.headers.get("content-type")!, /image\/svg\+xml/);
    assert.match(await svg.text(), /^<svg/);
    assert.match(
      await (await root.get(page)).text(),
      /<link rel="icon" href="\/static\/favicon.svg"/,
    );
  } finally {
    await w.close();
  }
});

Deno.test("portal nodes page: a platform admin dedicates a node to a tenant and shares it again (POST/redirect/GET)", async () => {
  const w = await createWorld();
  try {
    const root = await signIn(w, "root@example.com");
    const { token } = await createJoinToken(w.store, SYSTEM, {});
    const node = await enrollNode(w.store, {
      token,
      publicJwk: { kty: "OKP", crv: "Ed25519", x: "d".padEnd(43, "A") },
      url: "http://10.0.0.2:8100",
      name: "mac-d",
      engine: "openai",
      models: [],
      probe: null,
      version: null,
    });
    const res = await root.post(`/nodes/${node.id}/dedication`, {
      tenantId: w.tenantA.id,
    });
    assert.equal(res.status, 303);
    assert.equal(res.headers.get("location"), "/nodes#nodes");
    assert.match(
      await (await root.follow(res)).text(),
      /serves that tenant alone/,
    );
    assert.equal(
      (await getNode(w.store, SYSTEM, node.id)).dedicatedTo,
      w.tenantA.id,
    );
    const page = await (await root.get("/nodes")).text();
    assert.match(page, new RegExp(`value="${w.tenantA.id}" selected`));
    // The gateway's own queue (requests waiting for a node slot) is shown.
    assert.match(
      page,
      /Waiting for a slot at this gateway: <strong>0<\/strong>/,
    );
    const back = await root.post(`/nodes/${node.id}/dedication`, {
      tenantId: "",
    });
    assert.equal(back.status, 303);
    assert.equal((await getNode(w.store, SYSTEM, node.id)).dedicatedTo, null);
  } finally {
    await w.close();
  }
});
