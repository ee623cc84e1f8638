import assert from "node:assert/strict";
import {
  createApiKey,
  listApiKeys,
  parseApiKey,
  revokeApiKey,
  verifyApiKey,
} from "./api_keys.ts";
import { NotFoundError, ValidationError } from "./errors.ts";
import { type Principal, SYSTEM } from "./principal.ts";
import { createStore } from "./store.ts";
import { createTenant } from "./tenants.ts";

async function setup() {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const t = await createTenant(store, SYSTEM, { name: "Acme" });
  return { kv, store, t };
}

Deno.test("createApiKey() returns the key once and stores only a keyed hash", async () => {
  const { kv, store, t } = await setup();
  const { key, apiKey } = await createApiKey(store, SYSTEM, t.id, {
    name: "prod",
  });
  assert.match(key, /^orch_[0-9a-z]{26}_[0-9A-Za-z]{38}$/);
  assert.equal(apiKey.last4, key.slice(-4));
  assert.deepEqual(apiKey.scopes, ["chat", "embeddings", "models"]);
  assert.equal("hash" in apiKey, false);
  for await (const e of kv.list({ prefix: [] })) {
    assert.ok(
      !JSON.stringify(e.value, (_k, v) => typeof v === "bigint" ? String(v) : v)
        .includes(key.slice(32, 64)),
    );
  }
  const listed = await listApiKeys(store, SYSTEM, t.id);
  assert.equal(listed.items.length, 1);
  assert.equal(JSON.stringify(listed).includes(key), false);
  kv.close();
});

Deno.test("verifyApiKey() rejects typos by checksum, wrong secrets, revoked and expired keys", async () => {
  const { kv, store, t } = await setup();
  const { key, apiKey } = await createApiKey(store, SYSTEM, t.id, {
    name: "prod",
  });
  const ok = await verifyApiKey(store, key);
  assert.equal(ok.ok, true);
  const typo = key.slice(0, 40) + (key[40] === "a" ? "b" : "a") + key.slice(41);
  assert.equal(parseApiKey(typo), null);
  assert.deepEqual(await verifyApiKey(store, typo), {
    ok: false,
    reason: "malformed",
  });
  assert.deepEqual(await verifyApiKey(store, "sk-whatever"), {
    ok: false,
    reason: "malformed",
  });
  const other = await createApiKey(store, SYSTEM, t.id, { name: "other" });
  const forged = `orch_${apiKey.id}_${other.key.slice(32, 64)}`;
  const { checksum6 } = await import("../lib/crypto.ts");
  assert.deepEqual(await verifyApiKey(store, forged + checksum6(forged)), {
    ok: false,
    reason: "unknown",
  });
  const exp = await createApiKey(store, SYSTEM, t.id, {
    name: "soon",
    expiresAt: new Date(Date.now() + 60_000).toISOString(),
  });
  assert.deepEqual(await verifyApiKey(store, exp.key, Date.now() + 120_000), {
    ok: false,
    reason: "expired",
  });
  await revokeApiKey(store, SYSTEM, apiKey.id);
  assert.deepEqual(await verifyApiKey(store, key), {
    ok: false,
    reason: "revoked",
  });
  kv.close();
});

Deno.test("createApiKey() validates scopes, models, limits and expiry; other tenants get 404", async () => {
  const { kv, store, t } = await setup();
  await assert.rejects(
    createApiKey(store, SYSTEM, t.id, { name: "x", scopes: ["admin"] }),
    (e: ValidationError) => !!e.field?.startsWith("scopes"),
  );
  await assert.rejects(
    createApiKey(store, SYSTEM, t.id, {
      name: "x",
      expiresAt: "2000-01-01T00:00:00Z",
    }),
    (e: ValidationError) => e.field === "expiresAt",
  );
  await assert.rejects(
    createApiKey(store, SYSTEM, t.id, {
      name: "x",
      models: ["m".repeat(3000)],
    }),
    ValidationError,
  );
  await assert.rejects(
    createApiKey(store, SYSTEM, t.id, { name: "x", limits: { rpm: -1 } }),
    (e: ValidationError) => e.field === "limits.rpm",
  );
  const b = await createTenant(store, SYSTEM, { name: "Globex" });
  const adminA: Principal = {
    kind: "user",
    id: "u",
    label: "u",
    role: "tenant_admin",
    tenantId: t.id,
    ip: null,
  };
  await assert.rejects(
    createApiKey(store, adminA, b.id, { name: "x" }),
    NotFoundError,
  );
  const bKey = await createApiKey(store, SYSTEM, b.id, { name: "b" });
  await assert.rejects(
    revokeApiKey(store, adminA, bKey.apiKey.id),
    NotFoundError,
  );
  assert.equal((await verifyApiKey(store, bKey.key)).ok, true);
  kv.close();
});
