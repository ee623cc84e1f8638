import assert from "node:assert/strict";
import {
  ADMIN_TOKEN_LAST_USED_EVERY_MS,
  createAdminToken,
  listAdminTokens,
  registerEnvAdminToken,
  revokeAdminToken,
  verifyAdminToken,
} from "./admin_tokens.ts";
import { listAudit } from "./audit.ts";
import { ForbiddenError, NotFoundError, ValidationError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import { type Principal, SYSTEM } from "./principal.ts";
import { createStore } from "./store.ts";
import { createTenant } from "./tenants.ts";

async function setup() {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const a = await createTenant(store, SYSTEM, { name: "Acme" });
  const b = await createTenant(store, SYSTEM, { name: "Globex" });
  const who = (
    role: Principal["role"],
    tenantId: string | null,
  ): Principal => ({
    kind: "user",
    id: `u-${role}-${tenantId}`,
    label: "someone",
    role,
    tenantId,
    ip: null,
  });
  return {
    kv,
    store,
    a,
    b,
    adminA: who("tenant_admin", a.id),
    viewerA: who("tenant_viewer", a.id),
  };
}

Deno.test("createAdminToken() shows the token once, stores a keyed hash, and the token verifies with its role", async () => {
  const { kv, store, a } = await setup();
  const { token, record } = await createAdminToken(store, SYSTEM, {
    name: "deploy",
    role: "tenant_admin",
    tenantId: a.id,
  });
  assert.match(token, /^orchadm_[0-9a-z]{26}_[0-9A-Za-z]{38}$/);
  assert.equal("hash" in record, false);
  assert.equal(record.expiresAt, null);
  assert.equal(record.lastUsedAt, null);
  for await (const e of kv.list({ prefix: [] })) {
    const text = JSON.stringify(
      e.value,
      (_k, v) => typeof v === "bigint" ? String(v) : v,
    );
    assert.ok(!text.includes(token.slice(35, 67)), `secret in ${e.key}`);
  }
  const p = await verifyAdminToken(store, token, "10.0.0.1");
  assert.deepEqual(p, {
    kind: "token",
    id: record.id,
    label: "deploy",
    role: "tenant_admin",
    tenantId: a.id,
    ip: "10.0.0.1",
  });
  // a wrong checksum or secret is refused
  assert.equal(
    await verifyAdminToken(store, token.slice(0, -1) + "x", null),
    null,
  );
  const audit = await listAudit(kv, SYSTEM, { tenantId: a.id });
  assert.equal(audit.items[0]!.action, "admin_token.create");
  assert.ok(!JSON.stringify(audit).includes(token));
  kv.close();
});

Deno.test("createAdminToken() validates input: name, role, tenant, future expiry", async () => {
  const { kv, store, a } = await setup();
  const cases: [unknown, string][] = [
    [{ name: "", role: "tenant_admin", tenantId: a.id }, "name"],
    [{ name: "x", role: "root", tenantId: a.id }, "role"],
    [{ name: "x", role: "tenant_admin" }, "tenantId"],
    [{
      name: "x",
      role: "tenant_admin",
      tenantId: a.id,
      expiresAt: "2001-01-01T00:00:00Z",
    }, "expiresAt"],
    [{ name: "x", role: "platform_admin", extra: 1 }, "body"],
  ];
  for (const [input, field] of cases) {
    await assert.rejects(
      () => createAdminToken(store, SYSTEM, input),
      (e: unknown) => e instanceof ValidationError && e.field === field,
      JSON.stringify(input),
    );
  }
  await assert.rejects(
    () =>
      createAdminToken(store, SYSTEM, {
        name: "x",
        role: "tenant_admin",
        tenantId: "01nosuchtenant",
      }),
    NotFoundError,
  );
  kv.close();
});

Deno.test("admin tokens: a tenant admin manages its own tenant's tokens only; viewers none", async () => {
  const { kv, store, a, b, adminA, viewerA } = await setup();
  const mine = await createAdminToken(store, adminA, {
    name: "a-ci",
    role: "tenant_viewer",
    tenantId: a.id,
  });
  const theirs = await createAdminToken(store, SYSTEM, {
    name: "b-ci",
    role: "tenant_admin",
    tenantId: b.id,
  });
  const platform = await createAdminToken(store, SYSTEM, {
    name: "root-ci",
    role: "platform_admin",
    tenantId: null,
  });
  await assert.rejects(
    () =>
      createAdminToken(store, adminA, {
        name: "x",
        role: "tenant_admin",
        tenantId: b.id,
      }),
    NotFoundError,
  );
  await assert.rejects(
    () =>
      createAdminToken(store, adminA, { name: "x", role: "platform_admin" }),
    ForbiddenError,
  );
  await assert.rejects(
    () =>
      createAdminToken(store, viewerA, {
        name: "x",
        role: "tenant_viewer",
        tenantId: a.id,
      }),
    ForbiddenError,
  );
  const listed = await listAdminTokens(store, adminA);
  assert.deepEqual(listed.items.map((t) => t.name), ["a-ci"]);
  await assert.rejects(
    () => listAdminTokens(store, adminA, { tenantId: b.id }),
    NotFoundError,
  );
  await assert.rejects(() => listAdminTokens(store, viewerA), ForbiddenError);
  for (const id of [theirs.record.id, platform.record.id, "nope"]) {
    await assert.rejects(
      () => revokeAdminToken(store, adminA, id),
      NotFoundError,
    );
  }
  await assert.rejects(
    () => revokeAdminToken(store, viewerA, mine.record.id),
    ForbiddenError,
  );
  // platform admins see all, newest first, or one tenant's
  const all = await listAdminTokens(store, SYSTEM);
  assert.deepEqual(all.items.map((t) => t.name), ["root-ci", "b-ci", "a-ci"]);
  const onlyB = await listAdminTokens(store, SYSTEM, { tenantId: b.id });
  assert.deepEqual(onlyB.items.map((t) => t.name), ["b-ci"]);
  // revoking is immediate, idempotent and audited
  const revoked = await revokeAdminToken(store, adminA, mine.record.id);
  assert.ok(revoked.revokedAt);
  assert.equal(await verifyAdminToken(store, mine.token, null), null);
  const again = await revokeAdminToken(store, adminA, mine.record.id);
  assert.equal(again.revokedAt, revoked.revokedAt);
  const audit = await listAudit(kv, SYSTEM, { tenantId: a.id });
  assert.deepEqual(
    audit.items.map((e) => e.action),
    ["admin_token.revoke", "admin_token.create", "tenant.create"],
  );
  assert.ok(await verifyAdminToken(store, theirs.token, null));
  kv.close();
});

Deno.test("verifyAdminToken() refuses an expired token and writes last used at most once a minute", async () => {
  const { kv, store, a } = await setup();
  const soon = new Date(Date.now() + 3600_000).toISOString();
  const { token, record } = await createAdminToken(store, SYSTEM, {
    name: "short",
    role: "tenant_viewer",
    tenantId: a.id,
    expiresAt: soon,
  });
  assert.equal(record.expiresAt, soon);
  const lastUsed = async () =>
    (await kv.get<string>(k.adminTokenLastUsed(record.id))).value;
  const t0 = Date.now();
  assert.ok(await verifyAdminToken(store, token, null, t0));
  assert.equal(await lastUsed(), new Date(t0).toISOString());
  assert.ok(await verifyAdminToken(store, token, null, t0 + 30_000));
  assert.equal(await lastUsed(), new Date(t0).toISOString());
  const t1 = t0 + ADMIN_TOKEN_LAST_USED_EVERY_MS + 1;
  assert.ok(await verifyAdminToken(store, token, null, t1));
  assert.equal(await lastUsed(), new Date(t1).toISOString());
  const listed = await listAdminTokens(store, SYSTEM, { tenantId: a.id });
  assert.equal(listed.items[0]!.lastUsedAt, new Date(t1).toISOString());
  assert.equal(
    await verifyAdminToken(store, token, null, Date.parse(soon)),
    null,
  );
  kv.close();
});

Deno.test("registerEnvAdminToken(): the environment's token is a listed platform token", async () => {
  const { kv, store } = await setup();
  const raw = "a-very-long-environment-token-value";
  await registerEnvAdminToken(store, raw);
  const p = await verifyAdminToken(store, raw, null);
  assert.equal(p?.role, "platform_admin");
  const all = await listAdminTokens(store, SYSTEM);
  assert.deepEqual(
    all.items.map((t) => [t.id, t.name, t.expiresAt]),
    [["env", "ORCHARD_ADMIN_TOKEN", null]],
  );
  await revokeAdminToken(store, SYSTEM, "env");
  assert.equal(await verifyAdminToken(store, raw, null), null);
  kv.close();
});
