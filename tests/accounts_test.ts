/**
 * User administration and admin tokens through the admin API and the portal
 * pages (`/users`, `/admin-tokens`, `/reset/:token`), without a browser.
 */
import assert from "node:assert/strict";
import { SYSTEM } from "../store/principal.ts";
import { createInvite, createUser } from "../store/users.ts";
import { api, createWorld, portalLogin, type TestWorld } from "./_helpers.ts";

const FORM = {
  "content-type": "application/x-www-form-urlencoded",
  origin: "http://localhost",
  host: "localhost",
};

/** A tiny cookie jar: the session cookie plus whatever the app sets. */
class Browser {
  cookies = new Map<string, string>();
  constructor(readonly w: TestWorld, cookie: string, readonly csrf: string) {
    const [name, value] = cookie.split("=") as [string, string];
    this.cookies.set(name, value);
  }
  get cookie() {
    return [...this.cookies].map(([k, v]) => `${k}=${v}`).join("; ");
  }
  #take(res: Response) {
    for (const c of res.headers.getSetCookie()) {
      const [pair, ...attrs] = c.split(";");
      const [name, value] = pair!.split("=") as [string, string];
      const gone = attrs.some((a) => /max-age=0/i.test(a.trim())) ||
        value === "";
      if (gone) this.cookies.delete(name);
      else this.cookies.set(name, value);
    }
    return res;
  }
  async get(path: string) {
    return this.#take(
      await this.w.app.request(path, { headers: { cookie: this.cookie } }),
    );
  }
  async post(path: string, fields: Record<string, string> = {}) {
    return this.#take(
      await this.w.app.request(path, {
        method: "POST",
        headers: { ...FORM, cookie: this.cookie },
        body: new URLSearchParams({ ...fields, _csrf: this.csrf }),
      }),
    );
  }
}

async function signIn(w: TestWorld, email: string) {
  const { cookie, csrf } = await portalLogin(w, email);
  return new Browser(w, cookie, csrf);
}

Deno.test("portal /admin-tokens: create shows the token once after a redirect; a reload does not; revoke works", async () => {
  const w = await createWorld();
  try {
    const b = await signIn(w, "root@example.com");
    const list = await b.get("/admin-tokens");
    assert.equal(list.status, 200);
    const html = await list.text();
    assert.match(html, /href="\/admin-tokens"/); // in the nav
    assert.ok(html.includes("a-admin") && html.includes("ci"));
    const created = await b.post("/admin-tokens", {
      name: "nightly export",
      role: "tenant_viewer",
      tenantId: w.tenantA.id,
      expires: "30",
    });
    assert.equal(created.status, 303);
    assert.equal(created.headers.get("location"), "/admin-tokens");
    const shown = await b.get("/admin-tokens");
    const page = await shown.text();
    const token = /data-testid="new-admin-token">([^<]+)</.exec(page)?.[1];
    assert.match(token ?? "", /^orchadm_/);
    assert.equal(shown.headers.get("cache-control"), "no-store");
    assert.match(page, /Token (&quot;|&#34;|")nightly export\1 created\./);
    // reload: gone
    const again = await (await b.get("/admin-tokens")).text();
    assert.equal(again.includes(token!), false);
    assert.equal(again.includes("new-admin-token"), false);
    assert.ok(again.includes("nightly export"));
    // it works against the API with its role
    const res = await api(w, "GET", `/tenants/${w.tenantA.id}/limits`, token!);
    assert.equal(res.status, 200);
    await res.body?.cancel();
    const id = /data-token-id="([0-9a-z]+)"[^]*?nightly export/.exec(again)
      ?.[1];
    const tokens = await (await api(
      w,
      "GET",
      "/admin-tokens",
      w.tokens.platform,
    )).json();
    const mine = tokens.items.find((t: { name: string }) =>
      t.name === "nightly export"
    );
    assert.equal(id, mine.id);
    assert.ok(mine.expiresAt);
    const revoked = await b.post(`/admin-tokens/${mine.id}/revoke`);
    assert.equal(revoked.status, 303);
    assert.match(
      await (await b.get("/admin-tokens")).text(),
      /Token (&quot;|&#34;|")nightly export\1 revoked\./,
    );
    const denied = await api(w, "GET", "/tenants", token!);
    assert.equal(denied.status, 401);
    await denied.body?.cancel();
    // a bad form re-renders with the message and what was typed
    const bad = await b.post("/admin-tokens", {
      name: "needs a tenant",
      role: "tenant_admin",
      tenantId: "",
      expires: "7",
    });
    assert.equal(bad.status, 400);
    const badHtml = await bad.text();
    assert.ok(badHtml.includes("Choose a tenant"));
    assert.ok(badHtml.includes('value="needs a tenant"'));
  } finally {
    await w.close();
  }
});

Deno.test("portal /admin-tokens: a tenant admin sees and makes only their tenant's tokens; a viewer is refused", async () => {
  const w = await createWorld();
  try {
    await api(w, "POST", "/admin-tokens", w.tokens.platform, {
      name: "globex-secret-token",
      role: "tenant_admin",
      tenantId: w.tenantB.id,
    });
    const a = await signIn(w, "a-admin@example.com");
    const html = await (await a.get("/admin-tokens")).text();
    assert.ok(html.includes("a-viewer"));
    assert.equal(html.includes("globex-secret-token"), false);
    assert.equal(html.includes(">ci<"), false); // the platform token
    assert.equal(html.includes("platform_admin"), false);
    const forged = await a.post("/admin-tokens", {
      name: "x",
      role: "tenant_admin",
      tenantId: w.tenantB.id,
      expires: "7",
    });
    assert.equal(forged.status, 404);
    const ok = await a.post("/admin-tokens", {
      name: "acme deploy",
      role: "tenant_admin",
      tenantId: w.tenantA.id,
      expires: "never",
    });
    assert.equal(ok.status, 303);
    const v = await signIn(w, "a-viewer@example.com");
    const vPage = await v.get("/admin-tokens");
    assert.equal(vPage.status, 403);
    const home = await (await v.get("/audit")).text();
    assert.equal(home.includes('href="/admin-tokens"'), false);
  } finally {
    await w.close();
  }
});

Deno.test("portal /users: disable ends sessions, a reset link is shown once and sets a new password at /reset/:token", async () => {
  const w = await createWorld();
  try {
    const admin = await signIn(w, "a-admin@example.com");
    const viewer = await signIn(w, "a-viewer@example.com");
    await createUser(w.store, SYSTEM, {
      email: "boss@globex.test",
      password: w.password,
      role: "tenant_admin",
      tenantId: w.tenantB.id,
    });
    const html = await (await admin.get("/users")).text();
    assert.ok(html.includes("a-viewer@example.com"));
    assert.equal(html.includes("boss@globex.test"), false);
    assert.equal(html.includes("root@example.com"), false);
    const users = await (await api(w, "GET", "/users", w.tokens.adminA)).json();
    const viewerId = users.items.find((u: { email: string }) =>
      u.email === "a-viewer@example.com"
    ).id;
    assert.ok(
      users.items.every((u: { lastSignInAt: string | null }) =>
        u.lastSignInAt
      ),
    );

    // disable: the viewer's session ends; enabling does not bring it back
    assert.equal((await viewer.get("/audit")).status, 200);
    assert.equal((await admin.post(`/users/${viewerId}/disable`)).status, 303);
    const msg = await (await admin.get("/users")).text();
    assert.ok(msg.includes("a-viewer@example.com disabled"));
    assert.equal((await viewer.get("/audit")).status, 303);
    assert.equal((await admin.post(`/users/${viewerId}/enable`)).status, 303);
    assert.equal((await viewer.get("/audit")).status, 303);

    // reset: shown once after the redirect
    const again = await signIn(w, "a-viewer@example.com");
    assert.equal(
      (await admin.post(`/users/${viewerId}/reset-password`)).status,
      303,
    );
    const shown = await (await admin.get("/users")).text();
    const link = /data-testid="reset-link">([^<]+)</.exec(shown)?.[1];
    assert.match(link ?? "", /\/reset\/[0-9a-z]+\.[0-9A-Za-z]+$/);
    assert.equal(
      (await (await admin.get("/users")).text()).includes(link!),
      false,
    );
    const path = new URL(link!).pathname;
    const form = await w.app.request(path);
    assert.equal(form.status, 200);
    assert.ok((await form.text()).includes("a-viewer@example.com"));
    const short = await w.app.request(path, {
      method: "POST",
      headers: FORM,
      body: new URLSearchParams({ password: "short" }),
    });
    assert.equal(short.status, 400);
    await short.body?.cancel();
    const set = await w.app.request(path, {
      method: "POST",
      headers: FORM,
      body: new URLSearchParams({ password: "my new long password" }),
    });
    assert.equal(set.status, 303);
    const fresh = set.headers.get("set-cookie")!.split(";")[0]!;
    assert.equal(
      (await w.app.request("/audit", { headers: { cookie: fresh } })).status,
      200,
    );
    // the session from before the reset is over; the link is spent
    assert.equal((await again.get("/audit")).status, 303);
    const used = await w.app.request(path);
    assert.equal(used.status, 410, "a used link says so: gone");
    await used.body?.cancel();
    const audit = await (await api(
      w,
      "GET",
      `/audit?tenant=${w.tenantA.id}`,
      w.tokens.platform,
    )).json();
    assert.deepEqual(
      audit.items.slice(0, 4).map((e: { action: string }) => e.action),
      [
        "user.password_reset",
        "user.password_reset_link",
        "user.enable",
        "user.disable",
      ],
    );
  } finally {
    await w.close();
  }
});

Deno.test("admin API /users and /invites: tenant tokens see and change only their tenant's", async () => {
  const w = await createWorld();
  try {
    const boss = await createUser(w.store, SYSTEM, {
      email: "boss@globex.test",
      password: w.password,
      role: "tenant_admin",
      tenantId: w.tenantB.id,
    });
    const invB = await createInvite(w.store, SYSTEM, {
      email: "new@globex.test",
      role: "tenant_viewer",
      tenantId: w.tenantB.id,
    });
    const { adminA, viewerA, platform } = w.tokens;
    const cases: [string, string, string, number][] = [
      ["GET", "/users?tenant=globex", adminA, 404],
      ["POST", `/users/${boss.id}/disable`, adminA, 404],
      ["POST", `/users/${boss.id}/password-reset`, adminA, 404],
      ["GET", "/invites?tenant=globex", adminA, 404],
      ["DELETE", `/invites/${invB.invite.id}`, adminA, 404],
      ["POST", `/users/${boss.id}/disable`, viewerA, 404],
    ];
    for (const [method, path, token, status] of cases) {
      const res = await api(w, method, path, token);
      const text = await res.text();
      assert.equal(res.status, status, `${method} ${path}: ${text}`);
      assert.equal(text.includes("globex.test"), false);
    }
    const mine = await (await api(w, "GET", "/users", adminA)).json();
    assert.equal(
      JSON.stringify(mine).includes("boss@globex.test"),
      false,
    );
    assert.equal(mine.items.length, 2);
    const all = await (await api(w, "GET", "/users", platform)).json();
    assert.equal(all.items.length, 4);
    const reset = await api(
      w,
      "POST",
      `/users/${boss.id}/password-reset`,
      platform,
    );
    assert.equal(reset.status, 201);
    assert.match((await reset.json()).link, /\/reset\/[0-9a-z]+\./);
    const invites = await (await api(w, "GET", "/invites", platform)).json();
    assert.deepEqual(
      invites.items.map((i: { email: string }) => i.email),
      ["new@globex.test"],
    );
    assert.equal(
      (await api(w, "DELETE", `/invites/${invB.invite.id}`, platform)).status,
      200,
    );
    const disabled = await (await api(
      w,
      "POST",
      `/users/${boss.id}/disable`,
      platform,
    )).json();
    assert.equal(disabled.disabled, true);
  } finally {
    await w.close();
  }
});
