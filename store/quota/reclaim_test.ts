/** Reclaiming what crashed or stopped gateways held. */
import assert from "node:assert/strict";
import {
  Admitter,
  CHECKPOINT_MS,
  counterValue,
  countReservations,
  limitPlan,
  reclaimExpired,
  windowOf,
} from "./mod.ts";
import { createStore } from "../store.ts";
import { UNLIMITED } from "../limits.ts";
import { awayFromMinuteEdge } from "../../gateway/_testing.ts";
import {
  beforeMinuteBoundary,
  releaseFixture,
  req,
  ROOMY,
  rpmUsed,
  sleep,
} from "./_testing.ts";

Deno.test("reclaimExpired() releases a crashed gateway's reservation after its deadline", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", {
    ...UNLIMITED,
    tokensPerDay: 100,
    concurrency: 5,
  }, null);
  const a = new Admitter(store);
  const r = await a.admit({ ...req(plan, 50), ttlMs: 1000 });
  assert.ok(r.ok);
  assert.equal(
    await reclaimExpired(store, Date.now()),
    0,
    "not before the deadline",
  );
  assert.equal(await reclaimExpired(store, Date.now() + 2000), 1);
  assert.equal(
    await counterValue(store, "t:t1", windowOf("day", Date.now())[0]),
    3,
  );
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  kv.close();
});

Deno.test("Admitter.reclaimExpired() reclaims a crashed gateway's reservation and deletes the release counters it added to a minute after their window", async () => {
  await beforeMinuteBoundary(30_000, async (jump) => {
    const { kv, store, plan, tpm, day, released } = await releaseFixture();
    // A gateway admits and crashes: its reservation is never settled.
    const crashed = new Admitter(store, { leaseMs: 0 });
    assert.ok((await crashed.admit({ ...req(plan), ttlMs: 1000 })).ok);
    // Another reclaims it past its deadline: 7 of its 10 tokens go back
    // (3 are billed), to the minute and to the day.
    const a = new Admitter(store, { leaseMs: 0 });
    jump(2000);
    assert.equal(await a.reclaimExpired(), 1);
    assert.equal(await countReservations(store), 0);
    assert.equal(await released(tpm), 7n);
    assert.equal(await released(day), 7n);
    // A minute after the minute ended, its next settlement deletes the
    // minute's release counter and keeps the day's.
    jump(30_000 + 61_000);
    const next = await a.admit(req(plan));
    assert.ok(next.ok && next.reservation);
    await a.settle(next.reservation, 4);
    await a.flush();
    assert.equal(await released(tpm), undefined);
    assert.equal(await released(day), 13n);
    kv.close();
  });
});

Deno.test("Admitter.reclaimOwned() bills a crashed gateway's leases what they used by their last checkpoint, never their unused capacity", async () => {
  await awayFromMinuteEdge(8000);
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", { ...ROOMY, tokensPerDay: 1e9 }, null);
  const start = Date.now();
  // Gateway "a" serves a busy key from leases (10 tokens reserved, 4
  // used each), leaves two requests in flight and "crashes": nothing of
  // it is flushed, its leases hold hundreds of requests unused.
  const a = new Admitter(store, { owner: "a" });
  let settled = 0;
  let leased = 0;
  for (let wave = 0; wave < 10; wave++) {
    const rs = await Promise.all(
      Array.from({ length: 20 }, () => a.admit(req(plan, 10))),
    );
    for (const r of rs) {
      assert.ok(r.ok && r.reservation);
      if (r.reservation.lease) leased++;
      await a.settle(r.reservation, 4);
      settled++;
    }
  }
  const inFlight = await Promise.all([
    a.admit(req(plan, 10)),
    a.admit(req(plan, 10)),
  ]);
  assert.ok(inFlight.every((r) => r.ok && r.reservation?.lease));
  assert.ok(leased >= 100, `${leased} of ${settled} from leases`);
  await sleep(CHECKPOINT_MS + 300); // its last checkpoint lands
  const day = windowOf("day", Date.now())[0];
  assert.ok(
    await counterValue(store, "t:t1", day) >= settled * 4 + 20 * 10,
    "a lease's capacity counts as used while it is held",
  );
  // Gateway "b" reclaims what "a" held: each finished request billed its
  // 4 tokens, each in flight its reclaimTokens (3); every request "a"
  // admitted counts, no more; no slot stays held.
  const b = new Admitter(store, { owner: "b" });
  assert.ok(await b.reclaimOwned(new Set(["a"])) >= 1);
  assert.equal(await counterValue(store, "t:t1", day), settled * 4 + 2 * 3);
  assert.equal(await rpmUsed(store, "t:t1", start), settled + 2);
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  assert.equal(await countReservations(store), 0);
  assert.equal(await b.reclaimOwned(new Set(["a"])), 0, "exactly once");
  kv.close();
});

Deno.test("Admitter.reclaimOwned() leaves other instances' reservations alone", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", { ...ROOMY, concurrency: 5 }, null);
  const a = new Admitter(store, { owner: "a", leaseMs: 0 });
  const b = new Admitter(store, { owner: "b", leaseMs: 0 });
  assert.ok((await a.admit(req(plan))).ok);
  const held = await b.admit(req(plan));
  assert.ok(held.ok && held.reservation);
  assert.equal(await b.reclaimOwned(new Set(["a"])), 1);
  assert.equal(await counterValue(store, "t:t1", "conc"), 1);
  assert.equal(await b.settle(held.reservation, 4), true);
  await b.flush();
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  kv.close();
});
