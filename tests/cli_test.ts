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

Deno.test("orchard CLI: tenant, key, limits, invite and audit commands against a live server", async () => {
  const w = await createWorld();
  const server = Deno.serve({
    port: 0,
    hostname: "127.0.0.1",
    onListen: () => {},
  }, w.app.fetch);
  const url = `http://127.0.0.1:${server.addr.port}`;
  const t = w.tokens.platform;
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
    await server.shutdown();
    await w.close();
  }
});
