/** The Admitter: admission exactness, batching, refusals, its reclaim timer. */
import assert from "node:assert/strict";
import {
  Admitter,
  counterValue,
  countReservations,
  limitPlan,
  windowOf,
} from "./mod.ts";
import { createStore } from "../store.ts";
import { UNLIMITED } from "../limits.ts";
import { awayFromMinuteEdge } from "../../gateway/_testing.ts";
import { countCommits, req, sleep } from "./_testing.ts";

Deno.test("Admitter.admit() admits exactly 100 of 500 concurrent requests against rpm 100", async () => {
  await awayFromMinuteEdge();
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", { ...UNLIMITED, rpm: 100 }, null);
  const a = new Admitter(store);
  const results = await Promise.all(
    Array.from({ length: 500 }, () => a.admit(req(plan))),
  );
  assert.equal(results.filter((r) => r.ok).length, 100);
  const rejected = results.find((r) => !r.ok);
  assert.ok(
    rejected && !rejected.ok && rejected.reason === "rate" &&
      rejected.retryAfterMs > 0,
  );
  assert.equal(
    await counterValue(store, "t:t1", windowOf("rpm", Date.now())[0]),
    100,
  );
  kv.close();
});

Deno.test("Admitter.admit() is exact across two admitters sharing one KV (two gateways)", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", { ...UNLIMITED, tokensPerDay: 1000 }, {
    ...UNLIMITED,
    concurrency: 1000,
  });
  const a = new Admitter(store);
  const b = new Admitter(store);
  const results = await Promise.all(
    Array.from({ length: 200 }, (_, i) => (i % 2 ? a : b).admit(req(plan, 30))),
  );
  assert.equal(results.filter((r) => r.ok).length, 33);
  kv.close();
});

Deno.test("Admitter.admit() clamps the grant to what remains but never below minTokens", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", { ...UNLIMITED, tpm: 100 }, null);
  const a = new Admitter(store);
  const r1 = await a.admit(req(plan, 80, 10));
  assert.ok(r1.ok && r1.reservation?.tokens === 80);
  const r2 = await a.admit(req(plan, 80, 10));
  assert.ok(r2.ok && r2.reservation?.tokens === 20);
  const r3 = await a.admit(req(plan, 80, 10));
  assert.ok(!r3.ok);
  kv.close();
});

Deno.test("Admitter.admit() throws QuotaUnavailableError when KV is closed", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  kv.close();
  const plan = limitPlan("t1", "k1", { ...UNLIMITED, rpm: 5 }, null);
  await assert.rejects(new Admitter(store).admit(req(plan)), {
    name: "QuotaUnavailableError",
  });
});

Deno.test("Admitter.admit() admits many tenants in shared commits and stays exact per tenant", async () => {
  await awayFromMinuteEdge();
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const seen = countCommits(kv);
  const a = new Admitter(store);
  const plans = Array.from(
    { length: 40 },
    (_, t) =>
      limitPlan(`t${t}`, `k${t}`, { ...UNLIMITED, rpm: 5, tokensPerDay: 1e6 }, {
        ...UNLIMITED,
        concurrency: 100,
      }),
  );
  const results = await Promise.all(
    plans.flatMap((plan) =>
      Array.from({ length: 8 }, () => a.admit(req(plan)))
    ),
  );
  for (let t = 0; t < 40; t++) {
    const mine = results.slice(t * 8, t * 8 + 8);
    assert.equal(mine.filter((r) => r.ok).length, 5, `tenant t${t}`);
    assert.equal(
      await counterValue(store, `t:t${t}`, windowOf("rpm", Date.now())[0]),
      5,
    );
  }
  // 40 tenants × 3 counters = 120 checks: a few commits, not one per tenant
  // (refusals re-read, but every admission shares its commit).
  assert.ok(seen.commits <= 10, `${seen.commits} commits for 40 tenants`);
  kv.close();
});

Deno.test("Admitter.admit() lands its own pending settlements before refusing", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", { ...UNLIMITED, tokensPerDay: 100 }, null);
  const a = new Admitter(store, { settleDelayMs: 60_000 });
  const first = await a.admit(req(plan, 100));
  assert.ok(first.ok && first.reservation);
  const settled = a.settle(first.reservation, 10); // queued, not committed
  const second = await a.admit(req(plan, 90));
  assert.ok(second.ok, "the 90 released tokens are seen before refusing");
  assert.equal(await settled, true);
  assert.ok(!(await a.admit(req(plan, 1))).ok);
  await a.flush();
  kv.close();
});

Deno.test("Admitter refuses concurrency with retry-after until a stopped gateway's slots are reclaimed", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", { ...UNLIMITED, concurrency: 1 }, null);
  let due = 0;
  const a = new Admitter(store, { owner: "a", reclaimDueMs: () => due });
  assert.ok((await a.admit(req(plan))).ok);
  const live = await a.admit(req(plan));
  assert.ok(!live.ok && live.rule.kind === "concurrency");
  assert.equal(live.retryAfterMs, 1000, "a live request's slot: any moment");
  due = 4200;
  const crashed = await a.admit(req(plan));
  assert.ok(!crashed.ok && crashed.retryAfterMs === 4200);
  kv.close();
});

Deno.test("Admitter reclaims expired reservations every reclaimEveryMs until close()", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", { ...UNLIMITED, concurrency: 5 }, null);
  // A gateway admits and crashes: its reservation is never settled.
  const crashed = new Admitter(store, { leaseMs: 0, reclaimEveryMs: 0 });
  assert.ok((await crashed.admit({ ...req(plan), ttlMs: 50 })).ok);
  const counts: number[] = [];
  const a = new Admitter(store, {
    leaseMs: 0,
    reclaimEveryMs: 100,
    onReclaimed: (n) => counts.push(n),
  });
  await sleep(350);
  assert.deepEqual(counts, [1], "reclaimed once, past its deadline");
  assert.equal(await countReservations(store), 0);
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  // Closed, it reclaims no more.
  await a.close();
  assert.ok((await crashed.admit({ ...req(plan), ttlMs: 50 })).ok);
  await sleep(300);
  assert.deepEqual(counts, [1]);
  assert.equal(await countReservations(store), 1);
  await crashed.close();
  kv.close();
});
