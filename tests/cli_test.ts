import assert from "node:assert/strict";
import { createWorld } from "./_helpers.ts";

async function orchard(url: string, token: string, ...args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "cli/orchard.ts", ...args],
    env: { ORCHARD_URL: url, ORCHARD_ADMIN_TOKEN: token, NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  return {
    code: out.code,
    stdout: new TextDecoder().decode(out.stdout),
    stderr: new TextDecoder().decode(out.stderr),
  };
}

/** A world served on a loopback port, with its platform admin token. */
async function serveWorld() {
  const w = await createWorld();
  const server = Deno.serve({
    port: 0,
    hostname: "127.0.0.1",
    onListen: () => {},
  }, w.app.fetch);
  return {
    w,
    url: `http://127.0.0.1:${server.addr.port}`,
    t: w.tokens.platform,
    close: async () => {
      await server.shutdown();
      await w.close();
    },
  };
}

Deno.test("orchard CLI: tenant, key, limits, invite and audit commands against a live server", async () => {
  const { url, t, close } = await serveWorld();
  try {
    const created = await orchard(
      url,
      t,
      "tenant",
      "create",
      "Hooli",
      "--slug",
      "hooli",
      "--json",
    );
    assert.equal(created.code, 0, created.stderr);
    assert.equal(JSON.parse(created.stdout).slug, "hooli");
    const list = await orchard(url, t, "tenant", "list");
    assert.match(list.stdout, /hooli\s+Hooli\s+active/);
    const key = await orchard(
      url,
      t,
      "key",
      "create",
      "hooli",
      "--name",
      "ci",
      "--scopes",
      "chat",
    );
    assert.equal(key.code, 0, key.stderr);
    assert.match(key.stdout, /orch_[0-9a-z]{26}_/);
    const keys = await orchard(url, t, "key", "list", "hooli", "--json");
    const keyId = JSON.parse(keys.stdout).items[0].id;
    assert.equal((await orchard(url, t, "key", "revoke", keyId)).code, 0);
    const lim = await orchard(
      url,
      t,
      "limits",
      "set",
      "hooli",
      "--rpm",
      "60",
      "--tokens-per-day",
      "5000",
      "--json",
    );
    assert.deepEqual(JSON.parse(lim.stdout), {
      rpm: 60,
      tpm: null,
      concurrency: null,
      tokensPerDay: 5000,
      tokensPerMonth: null,
    });
    const lim2 = await orchard(
      url,
      t,
      "limits",
      "set",
      "hooli",
      "--rpm",
      "none",
      "--json",
    );
    assert.equal(JSON.parse(lim2.stdout).rpm, null);
    assert.equal(JSON.parse(lim2.stdout).tokensPerDay, 5000);
    const inv = await orchard(
      url,
      t,
      "user",
      "invite",
      "dev@hooli.test",
      "--role",
      "tenant_viewer",
      "--tenant",
      "hooli",
    );
    assert.match(inv.stdout, /\/invite\//);
    const audit = await orchard(url, t, "audit", "--tenant", "hooli", "--json");
    const actions = JSON.parse(audit.stdout).items.map((
      e: { action: string },
    ) => e.action);
    assert.ok(
      actions.includes("key.revoke") && actions.includes("limits.set") &&
        actions.includes("user.invite"),
    );
    const bad = await orchard(
      url,
      t,
      "limits",
      "set",
      "hooli",
      "--rpm",
      "lots",
    );
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /--rpm must be a whole number/);
    const denied = await orchard(url, "orchadm_wrong", "tenant", "list");
    assert.equal(denied.code, 1);
    assert.match(denied.stderr, /401/);
  } finally {
    await close();
  }
});

Deno.test("orchard CLI: without a token it says exactly how to get one", async () => {
  const res = await orchard("http://127.0.0.1:9", "", "tenant", "list");
  assert.equal(res.code, 1);
  assert.equal(res.stdout, "");
  const msg = res.stderr;
  assert.match(msg, /ORCHARD_ADMIN_TOKEN is not set/);
  // the portal page, the API call with an existing token, or the env var for the first one
  assert.ok(msg.includes("http://127.0.0.1:9/admin-tokens"), msg);
  assert.ok(
    msg.includes(
      "deno task orchard admin-token create --name NAME --role ROLE",
    ),
    msg,
  );
  assert.ok(msg.includes("POST http://127.0.0.1:9/api/admin/v1/admin-tokens"));
  assert.match(msg, /start the server with\s+ORCHARD_ADMIN_TOKEN set/);
  assert.match(msg, /at least 24 characters/);
  assert.match(msg, /export ORCHARD_ADMIN_TOKEN=<the token>/);
});

Deno.test("orchard CLI: admin-token create, list, revoke; user list, reset-password, disable; invite list, revoke", async () => {
  const { w, url, t, close } = await serveWorld();
  try {
    const created = await orchard(
      url,
      t,
      "admin-token",
      "create",
      "--name",
      "acme automation",
      "--role",
      "tenant_admin",
      "--tenant",
      "acme",
      "--days",
      "30",
      "--json",
    );
    assert.equal(created.code, 0, created.stderr);
    const tok = JSON.parse(created.stdout);
    assert.match(tok.token, /^orchadm_/);
    assert.equal(tok.tenantId, w.tenantA.id);
    assert.ok(Date.parse(tok.expiresAt) > Date.now() + 29 * 86_400_000);
    // the new token drives the CLI, within its tenant
    const mine = await orchard(url, tok.token, "tenant", "list");
    assert.equal(mine.code, 0, mine.stderr);
    assert.match(mine.stdout, /acme\s+Acme\s+active/);
    assert.equal(mine.stdout.includes("globex"), false);
    const list = await orchard(url, tok.token, "admin-token", "list");
    assert.equal(list.code, 0, list.stderr);
    assert.match(list.stdout, new RegExp(`${tok.id}\\s+acme automation`));
    assert.equal(list.stdout.includes(tok.token), false);
    const revoked = await orchard(url, t, "admin-token", "revoke", tok.id);
    assert.equal(revoked.code, 0, revoked.stderr);
    assert.match(revoked.stdout, /Revoked admin token acme automation/);
    const refused = await orchard(url, tok.token, "tenant", "list");
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /^401: /);
    assert.match(refused.stderr, /refused \(wrong, revoked or expired\)/);
    assert.ok(refused.stderr.includes(`${url}/admin-tokens`));

    const users = await orchard(url, t, "user", "list", "--tenant", "acme");
    assert.equal(users.code, 0, users.stderr);
    const viewer = /^(\S+)\s+a-viewer@example\.com/m.exec(users.stdout)?.[1];
    assert.ok(viewer, users.stdout);
    const reset = await orchard(url, t, "user", "reset-password", viewer!);
    assert.equal(reset.code, 0, reset.stderr);
    assert.match(reset.stdout, /\/reset\/[0-9a-z]+\.[0-9A-Za-z]+/);
    const off = await orchard(url, t, "user", "disable", viewer!);
    assert.match(off.stdout, /Disabled a-viewer@example\.com/);
    const after = await orchard(url, t, "user", "list", "--json");
    const row = JSON.parse(after.stdout).items.find((u: { id: string }) =>
      u.id === viewer
    );
    assert.equal(row.disabled, true);

    await orchard(
      url,
      t,
      "user",
      "invite",
      "new@acme.test",
      "--role",
      "tenant_viewer",
      "--tenant",
      "acme",
    );
    const invites = await orchard(url, t, "invite", "list", "--json");
    const inv = JSON.parse(invites.stdout).items[0];
    assert.equal(inv.email, "new@acme.test");
    const gone = await orchard(url, t, "invite", "revoke", inv.id);
    assert.match(gone.stdout, /Revoked the invite for new@acme\.test/);
  } finally {
    await close();
  }
});

Deno.test("orchard CLI: budgets and prices in major units with their currency", async () => {
  const { url, t, close } = await serveWorld();
  try {
    const set = await orchard(
      url,
      t,
      "budget",
      "set",
      "acme",
      "--unit",
      "money",
      "--amount",
      "500.00",
      "--hard",
      "--thresholds",
      "50,100",
    );
    assert.equal(set.code, 0, set.stderr);
    assert.match(
      set.stdout,
      /tenant\s+money\s+500\.00 EUR\s+0\.00 EUR\s+0\s+hard/,
    );
    const tokens = await orchard(
      url,
      t,
      "budget",
      "set",
      "acme",
      "--unit",
      "tokens",
      "--amount",
      "2000000",
    );
    assert.equal(tokens.code, 0, tokens.stderr);
    const shown = await orchard(url, t, "budget", "show", "acme", "--json");
    const budgets = JSON.parse(shown.stdout).budgets;
    assert.deepEqual(
      budgets.map((b: { unit: string; amount: unknown }) => [b.unit, b.amount])
        .sort(),
      [["money", "500.00"], ["tokens", 2_000_000]],
    );
    const bad = await orchard(
      url,
      t,
      "budget",
      "set",
      "acme",
      "--unit",
      "money",
      "--amount",
      "5,00",
    );
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /400: amount: must be an amount above 0/);
    const prices = await orchard(url, t, "pricing", "show");
    assert.equal(prices.code, 0, prices.stderr);
    assert.match(prices.stdout, /Prices per 1M tokens \(EUR\)/);
  } finally {
    await close();
  }
});
