import * as assert from "node:assert/strict";
import { type ApiKey, createApiKey, revokeApiKey } from "../store/api_keys.ts";
import { k } from "../store/kv_keys.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { KeyCache } from "./auth.ts";

Deno.test("KeyCache reads each key again within maxAgeMs, spread out rather than all at once", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const tenant = await createTenant(store, SYSTEM, { name: "Acme" });
  const keys: string[] = [];
  for (let i = 0; i < 60; i++) {
    keys.push(
      (await createApiKey(store, SYSTEM, tenant.id, { name: `k${i}` })).key,
    );
  }
  let reads = 0;
  const get = kv.get.bind(kv);
  kv.get = ((...a: Parameters<typeof kv.get>) => {
    reads++;
    return get(...a);
  }) as typeof kv.get;
  const cache = new KeyCache(store, { ttlMs: 1000, maxAgeMs: 1000 });
  const all = async () => {
    for (const k of keys) {
      assert.equal((await cache.authenticate(k)).tenant.id, tenant.id);
    }
  };
  await all();
  const first = reads;
  assert.ok(first >= 60, "every key read once");
  await all();
  assert.equal(reads, first, "cached");
  // Each entry lives half to all of maxAgeMs: at 3/4 of it some keys are
  // read again, not all (60 keys all on one side: p = 2⁻⁵⁹).
  await new Promise((r) => setTimeout(r, 750));
  const before = reads;
  await all();
  const again = reads - before;
  assert.ok(again > 0 && again < first, `${again} reads for 60 keys`);
  await new Promise((r) => setTimeout(r, 1000));
  const before2 = reads;
  await all();
  assert.ok(reads - before2 >= 60, "every key read again after maxAgeMs");
  kv.close();
});

/** A store with one tenant and one key, and a cache of it. */
async function oneKey(ttlMs: number, maxAgeMs: number) {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const tenant = await createTenant(store, SYSTEM, { name: "Acme" });
  const created = await createApiKey(store, SYSTEM, tenant.id, { name: "k" });
  return {
    kv,
    store,
    created,
    cache: new KeyCache(store, { ttlMs, maxAgeMs }),
  };
}

/** Makes reads of keys starting with `prefix` take `ms`; returns the real `get`. */
function slowReads(
  kv: Deno.Kv,
  prefix: Deno.KvKeyPart,
  ms: number,
  onRead = () => {},
): Deno.Kv["get"] {
  const get = kv.get.bind(kv);
  kv.get = (async (...a: Parameters<typeof kv.get>) => {
    if (a[0][0] === prefix) {
      onRead();
      await new Promise((r) => setTimeout(r, ms));
    }
    return get(...a);
  }) as typeof kv.get;
  return get;
}

Deno.test("KeyCache serves a valid key's entry past maxAgeMs while reading it again, and takes what the read finds", async () => {
  const { kv, created, cache } = await oneKey(100, 100);
  assert.equal((await cache.authenticate(created.key)).key.name, "k");
  // Key reads now take 300 ms; the key changes without an auth epoch bump.
  const get = slowReads(kv, "api_key", 300);
  const stored = (await get<ApiKey>(k.apiKey(created.apiKey.id))).value!;
  await kv.set(k.apiKey(created.apiKey.id), { ...stored, name: "renamed" });
  await new Promise((r) => setTimeout(r, 150));
  const t0 = performance.now();
  assert.equal((await cache.authenticate(created.key)).key.name, "k");
  assert.ok(performance.now() - t0 < 100, "served without waiting for KV");
  await new Promise((r) => setTimeout(r, 700));
  assert.equal((await cache.authenticate(created.key)).key.name, "renamed");
  // A revocation the re-read finds takes effect.
  await kv.set(k.apiKey(created.apiKey.id), {
    ...stored,
    revokedAt: new Date().toISOString(),
  });
  await new Promise((r) => setTimeout(r, 150));
  await cache.authenticate(created.key); // past its age: read again
  await new Promise((r) => setTimeout(r, 700));
  await assert.rejects(cache.authenticate(created.key), /revoked/);
  kv.close();
});

Deno.test("KeyCache re-reads the auth epoch in the background once half ttlMs old, and waits for it only at ttlMs", async () => {
  const { kv, store, created, cache } = await oneKey(1000, 60_000);
  await cache.authenticate(created.key);
  // Epoch reads now take 150 ms.
  let epochReads = 0;
  slowReads(kv, k.authEpoch()[0], 150, () => epochReads++);
  await new Promise((r) => setTimeout(r, 600)); // over half ttlMs, well under it
  const t0 = performance.now();
  await cache.authenticate(created.key);
  assert.ok(performance.now() - t0 < 100, "did not wait for the epoch");
  assert.equal(epochReads, 1, "read in the background");
  // A revocation still takes effect within ttlMs (plus the read).
  await revokeApiKey(store, SYSTEM, created.apiKey.id);
  await new Promise((r) => setTimeout(r, 1000 + 300));
  await assert.rejects(cache.authenticate(created.key), /revoked/);
  kv.close();
});

Deno.test("KeyCache drops its entries before revokeApiKey() returns, and (watching) when another process changes the epoch", async () => {
  const { kv, store, created, cache } = await oneKey(1000, 60_000);
  cache.watch();
  try {
    const other = await createApiKey(store, SYSTEM, created.apiKey.tenantId, {
      name: "other",
    });
    await cache.authenticate(created.key);
    await cache.authenticate(other.key);
    // This process: refused as soon as the call returns.
    await revokeApiKey(store, SYSTEM, created.apiKey.id);
    await assert.rejects(cache.authenticate(created.key), /revoked/);
    // Another gateway instance (remote KV) revokes the other key: no hook
    // here, only the epoch it rewrites, seen through the watch long before
    // the epoch's re-read (ttlMs/2 = 500 ms).
    assert.equal((await cache.authenticate(other.key)).key.name, "other");
    const id = other.apiKey.id;
    const stored = (await kv.get<ApiKey>(k.apiKey(id))).value!;
    const t0 = performance.now();
    await kv.atomic()
      .set(k.apiKey(id), { ...stored, revokedAt: new Date().toISOString() })
      .set(k.authEpoch(), Date.now())
      .commit();
    for (;;) {
      const refused = await cache.authenticate(other.key).then(
        () => false,
        (e) => /revoked/.test(String(e)),
      );
      if (refused) break;
      assert.ok(performance.now() - t0 < 300, "the watch did not see it");
      await new Promise((r) => setTimeout(r, 5));
    }
  } finally {
    cache.close();
    kv.close();
  }
});
