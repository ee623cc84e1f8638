import assert from "node:assert/strict";
import { GatewayInstance, localInstanceId } from "./instances.ts";
import { k } from "./kv_keys.ts";
import { UNLIMITED } from "./limits.ts";
import { Admitter, counterValue, limitPlan } from "./quota/mod.ts";
import { createStore, type Store } from "./store.ts";

/** Polls `check` until it is true or `ms` pass; returns the time it took. */
async function within(
  ms: number,
  what: string,
  check: () => Promise<boolean> | boolean,
) {
  const t0 = Date.now();
  while (!(await check())) {
    if (Date.now() - t0 > ms) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  return Date.now() - t0;
}

const plan = limitPlan("t1", "k1", { ...UNLIMITED, concurrency: 5 }, null);
const req = {
  plan,
  tokens: 10,
  minTokens: 10,
  reclaimTokens: 3,
  ttlMs: 600_000,
};
const slots = (store: Store) => counterValue(store, "t:t1", "conc");

/** A gateway instance reclaiming through its own admitter, with short beats. */
function instance(store: Store, id: string, onLost?: () => void) {
  const admitter = new Admitter(store, { owner: id, leaseMs: 0 });
  const gw = new GatewayInstance(store, id, {
    reclaim: (owners) => admitter.reclaimOwned(owners),
    onLost,
    heartbeatMs: 50,
    lapseMs: 300,
  });
  return { admitter, gw };
}

/** Writes the record of an instance that crashed (it never beats again). */
async function crashedInstance(store: Store, id: string) {
  await store.kv.set(k.gatewayInstance(id), {
    startedAt: Date.now(),
    heartbeatAt: Date.now(),
  });
  const admitter = new Admitter(store, { owner: id, leaseMs: 0 });
  assert.ok((await admitter.admit(req)).ok);
  assert.ok((await admitter.admit(req)).ok);
}

Deno.test("GatewayInstance.start() reclaims at once what its previous incarnation held", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  await crashedInstance(store, "x");
  assert.equal(await slots(store), 2);
  const { gw } = instance(store, "x");
  assert.equal(await gw.start(), 2);
  assert.equal(await slots(store), 0);
  await gw.close();
  kv.close();
});

Deno.test("GatewayInstance reclaims what another held once its liveness lapses, and not before", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  await crashedInstance(store, "dead");
  const alive = instance(store, "alive");
  assert.ok((await alive.admitter.admit(req)).ok);
  assert.equal(await alive.gw.start(), 0);
  const t0 = Date.now();
  // Stopped beating: a slot it holds frees by its lapse, and says so.
  await within(300, "the lapse to be seen", () => alive.gw.reclaimDueMs() > 0);
  assert.ok(alive.gw.reclaimDueMs() <= 300 + 50);
  assert.equal(await slots(store), 3, "not before its lapse");
  await within(1000, "the reclaim", async () => await slots(store) === 1);
  assert.ok(Date.now() - t0 >= 300 - 50, "reclaimed before its lapse");
  // The slots are freed just before the reclaim call returns and clears it.
  await within(500, "nothing more due", () => alive.gw.reclaimDueMs() === 0);
  assert.equal((await kv.get(k.gatewayInstance("dead"))).value, null);
  // The live one's slot and record stay.
  await new Promise((r) => setTimeout(r, 400));
  assert.equal(await slots(store), 1);
  assert.ok((await kv.get(k.gatewayInstance("alive"))).value);
  await alive.gw.close();
  assert.equal(await slots(store), 0, "close() reclaims what it left");
  assert.equal((await kv.get(k.gatewayInstance("alive"))).value, null);
  kv.close();
});

Deno.test("GatewayInstance instances that beat never reclaim each other", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const a = instance(store, "a");
  const b = instance(store, "b");
  await a.gw.start();
  await b.gw.start();
  assert.ok((await a.admitter.admit(req)).ok);
  assert.ok((await b.admitter.admit(req)).ok);
  await new Promise((r) => setTimeout(r, 800));
  assert.equal(await slots(store), 2);
  assert.equal(a.gw.reclaimDueMs(), 0);
  await a.gw.close();
  await b.gw.close();
  kv.close();
});

Deno.test("GatewayInstance calls onLost when another deleted its record (it was presumed dead)", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  let lost = 0;
  const { gw } = instance(store, "paused", () => lost++);
  await gw.start();
  await kv.delete(k.gatewayInstance("paused"));
  await within(500, "onLost", () => lost === 1);
  assert.ok((await kv.get(k.gatewayInstance("paused"))).value, "re-created");
  await gw.close();
  kv.close();
});

Deno.test("localInstanceId() keeps one id per data directory", async () => {
  const dir = await Deno.makeTempDir();
  const other = await Deno.makeTempDir();
  try {
    const id = await localInstanceId(dir);
    assert.match(id, /^[0-9a-z]{26}$/);
    assert.equal(await localInstanceId(`${dir}/`), id);
    assert.notEqual(await localInstanceId(other), id);
    await Deno.writeTextFile(`${other}/instance_id`, "nonsense");
    await assert.rejects(localInstanceId(other), /instance_id must hold/);
  } finally {
    await Deno.remove(dir, { recursive: true });
    await Deno.remove(other, { recursive: true });
  }
});
