import assert from "node:assert/strict";
import {
  createApiKey,
  listApiKeys,
  parseApiKey,
  revokeApiKey,
  rotateApiKey,
  updateApiKey,
  verifyApiKey,
} from "./api_keys.ts";
import { listAudit } from "./audit.ts";
import { ForbiddenError, NotFoundError, ValidationError } from "./errors.ts";
import { setTenantLimits } from "./limits.ts";
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

Deno.test("rotateApiKey(): the new secret works at once; the previous one during its grace period only, then is refused as rotated", async () => {
  const { kv, store, t } = await setup();
  const { key: old, apiKey } = await createApiKey(store, SYSTEM, t.id, {
    name: "prod",
  });
  const t0 = Date.now();
  const { key: fresh, apiKey: after } = await rotateApiKey(
    store,
    SYSTEM,
    apiKey.id,
    3_600_000,
  );
  assert.notEqual(fresh, old);
  assert.equal(after.id, apiKey.id, "same key: same limits, budgets, usage");
  assert.equal(after.last4, fresh.slice(-4));
  assert.ok(after.previousValidUntil);
  assert.equal("previous" in after, false, "no hash in the view");
  const now = await verifyApiKey(store, fresh);
  assert.ok(now.ok && now.graceUntil === null);
  const during = await verifyApiKey(store, old, t0 + 3_500_000);
  assert.ok(during.ok && during.graceUntil! >= t0 + 3_600_000);
  const past = await verifyApiKey(store, old, t0 + 3_700_000);
  assert.deepEqual(past, { ok: false, reason: "rotated" });
  // Without grace, the previous secret stops at once (and an older one too).
  await rotateApiKey(store, SYSTEM, apiKey.id, 0);
  assert.equal((await verifyApiKey(store, old)).ok, false);
  assert.equal((await verifyApiKey(store, fresh)).ok, false);
  const audit = (await listAudit(kv, SYSTEM, { action: "key.rotate" })).items;
  assert.equal(audit.length, 2);
  assert.ok(!JSON.stringify(audit).includes(fresh.slice(32, 64)));
  kv.close();
});

Deno.test("rotateApiKey() and updateApiKey(): another tenant's key is 404, viewers 403, revoked keys and bad grace refused", async () => {
  const { kv, store, t } = await setup();
  const other = await createTenant(store, SYSTEM, { name: "Other" });
  const { apiKey } = await createApiKey(store, SYSTEM, t.id, { name: "k" });
  const adminOther: Principal = {
    kind: "user",
    id: "u",
    label: "u",
    role: "tenant_admin",
    tenantId: other.id,
    ip: null,
  };
  const viewer: Principal = {
    ...adminOther,
    role: "tenant_viewer",
    tenantId: t.id,
  };
  await assert.rejects(
    rotateApiKey(store, adminOther, apiKey.id, 0),
    NotFoundError,
  );
  await assert.rejects(
    updateApiKey(store, adminOther, apiKey.id, { name: "x" }),
    NotFoundError,
  );
  await assert.rejects(
    rotateApiKey(store, viewer, apiKey.id, 0),
    ForbiddenError,
  );
  await assert.rejects(
    rotateApiKey(store, SYSTEM, apiKey.id, 0, other.id),
    NotFoundError,
    "a key reached through another tenant's address",
  );
  await assert.rejects(
    rotateApiKey(store, SYSTEM, apiKey.id, -1),
    ValidationError,
  );
  await revokeApiKey(store, SYSTEM, apiKey.id);
  await assert.rejects(
    rotateApiKey(store, SYSTEM, apiKey.id, 0),
    /revoked key cannot be rotated/,
  );
  kv.close();
});

Deno.test("updateApiKey() edits name, scopes, models and limits, keeps limits within the tenant's, and audits before and after", async () => {
  const { kv, store, t } = await setup();
  await setTenantLimits(store, SYSTEM, t.id, { rpm: 100, tokensPerDay: 5000 });
  const { key, apiKey } = await createApiKey(store, SYSTEM, t.id, {
    name: "prod",
  });
  const after = await updateApiKey(store, SYSTEM, apiKey.id, {
    name: "production",
    scopes: ["chat"],
    models: ["tiny-chat"],
    limits: { rpm: 50 },
  });
  assert.equal(after.name, "production");
  assert.deepEqual(after.scopes, ["chat"]);
  assert.deepEqual(after.models, ["tiny-chat"]);
  assert.equal(after.limits?.rpm, 50);
  assert.equal(after.limits?.tokensPerDay, null);
  const v = await verifyApiKey(store, key);
  assert.ok(v.ok && v.key.name === "production", "the secret is unchanged");
  await assert.rejects(
    updateApiKey(store, SYSTEM, apiKey.id, { limits: { rpm: 101 } }),
    /Requests per minute cannot exceed the tenant's limit of 100/,
  );
  await assert.rejects(
    createApiKey(store, SYSTEM, t.id, {
      name: "x",
      limits: { tokensPerDay: 6000 },
    }),
    /Tokens per day cannot exceed the tenant's limit of 5,000/,
  );
  await assert.rejects(
    updateApiKey(store, SYSTEM, apiKey.id, { scopes: [] }),
    ValidationError,
  );
  await assert.rejects(
    updateApiKey(store, SYSTEM, apiKey.id, { hash: "x" }),
    ValidationError,
  );
  const [entry] = (await listAudit(kv, SYSTEM, { action: "key.update" }))
    .items;
  assert.equal((entry!.before as { name: string }).name, "prod");
  assert.equal((entry!.after as { name: string }).name, "production");
  kv.close();
});
