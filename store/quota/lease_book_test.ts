/** Leases: sizing, few commits, exact usage, never over-admitting. */
import assert from "node:assert/strict";
import {
  type Admission,
  Admitter,
  counterValue,
  countReservations,
  limitPlan,
  windowOf,
} from "./mod.ts";
import { createStore } from "../store.ts";
import { UNLIMITED } from "../limits.ts";
import { awayFromMinuteEdge } from "../../gateway/_testing.ts";
import { countCommits, req, roomyRpmPlan, rpmUsed } from "./_testing.ts";

Deno.test("Admitter leases a busy key's capacity: few commits, exact usage once settled", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", {
    ...UNLIMITED,
    rpm: 100_000,
    tpm: 10_000_000,
    concurrency: 10_000,
    tokensPerDay: 1_000_000_000,
  }, { ...UNLIMITED, rpm: 50_000 });
  const a = new Admitter(store);
  const seen = countCommits(kv);
  const start = Date.now();
  let admitted = 0;
  for (let wave = 0; wave < 20; wave++) {
    const rs = await Promise.all(
      Array.from({ length: 100 }, () => a.admit(req(plan, 10))),
    );
    await Promise.all(rs.map((r) => {
      assert.ok(r.ok && r.reservation);
      admitted++;
      return a.settle(r.reservation, 4);
    }));
  }
  await a.flush();
  assert.equal(admitted, 2000);
  assert.ok(seen.commits <= 40, `${seen.commits} commits for 2000 requests`);
  assert.equal(await rpmUsed(store, "t:t1", start), 2000);
  assert.equal(await rpmUsed(store, "k:k1", start), 2000);
  const day = windowOf("day", Date.now())[0];
  assert.equal(await counterValue(store, "t:t1", day), 2000 * 4);
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  assert.equal(await countReservations(store), 0);
  kv.close();
});

Deno.test("Admitter leases a quiet key the requests it made over the horizon", async () => {
  await awayFromMinuteEdge();
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = roomyRpmPlan();
  const a = new Admitter(store, { leaseMs: 30_000 });
  const start = Date.now();
  const leased: boolean[] = [];
  for (let i = 0; i < 8; i++) {
    const r = await a.admit(req(plan));
    assert.ok(r.ok && r.reservation);
    await new Promise((r) => setTimeout(r, 5)); // one at a time, like a quiet key
    await a.settle(r.reservation, 4);
    leased.push(!!r.reservation.lease);
  }
  // Seen once: no lease. Seen twice: its commit also leases 2 (the count
  // over the horizon), which admit the next two with no commit; then a
  // larger one admits the rest: its successor, asked for once it was
  // partly used (in the same windows it opens when the first runs out), or, when
  // the first ends at the minute's end, a commit.
  assert.deepEqual(leased.slice(0, 4), [false, false, true, true]);
  assert.deepEqual(leased.slice(5), [true, true, true]);
  await a.flush();
  assert.equal(await rpmUsed(store, "t:t1", start), 8);
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  assert.equal(await countReservations(store), 0);
  kv.close();
});

Deno.test("Admitter sizes a young key's first lease for its pace, not for the few requests it made yet", async () => {
  await awayFromMinuteEdge(25_000);
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = roomyRpmPlan();
  const a = new Admitter(store); // leases of 60 s
  const first = await a.admit(req(plan));
  assert.ok(first.ok && first.reservation && !first.reservation.lease);
  await a.settle(first.reservation, 4);
  const second = await a.admit(req(plan));
  assert.ok(second.ok && second.reservation);
  await a.settle(second.reservation, 4);
  const third = await a.admit(req(plan));
  assert.ok(third.ok && third.reservation?.lease);
  // Two requests ms apart are a pace of at least 2 per 10 s: 12 a minute,
  // for the part of the minute the lease runs (over 25 s: 5 or more).
  // Counted over their few ms, it would be the whole cap; counted as made
  // so far, 2.
  const n = third.reservation.lease.n;
  assert.ok(n >= 5 && n <= 12, `lease of ${n}`);
  await a.settle(third.reservation, 4);
  await a.flush();
  assert.equal(await rpmUsed(store, "t:t1", Date.now() - 1000), 3);
  assert.equal(await countReservations(store), 0);
  kv.close();
});

Deno.test("Admitter leases never over-admit and give back idle capacity before refusing", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", {
    ...UNLIMITED,
    rpm: 100_000,
    concurrency: 1000,
    tokensPerDay: 1_000_000,
  }, null);
  const a = new Admitter(store);
  const first = await Promise.all(
    Array.from({ length: 1500 }, () => a.admit(req(plan, 10))),
  );
  const granted = (rs: Admission[]) =>
    rs.flatMap((r) => r.ok && r.reservation ? [r.reservation] : []);
  const held = granted(first);
  assert.equal(held.length, 1000, "exactly the concurrency limit");
  assert.equal(await counterValue(store, "t:t1", "conc"), 1000);
  for (const r of held.slice(0, 10)) await a.settle(r, 10);
  const more = granted(
    await Promise.all(
      Array.from({ length: 20 }, () => a.admit(req(plan, 10))),
    ),
  );
  assert.equal(more.length, 10, "the 10 freed slots");
  for (const r of [...held.slice(10), ...more]) await a.settle(r, 10);
  await a.flush();
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  const day = windowOf("day", Date.now())[0];
  assert.equal(await counterValue(store, "t:t1", day), 1010 * 10);
  assert.equal(await countReservations(store), 0);
  kv.close();
});

Deno.test("Admitter leases of two gateways never over-admit a shared window", async () => {
  await awayFromMinuteEdge();
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", {
    ...UNLIMITED,
    rpm: 5000,
    concurrency: 100_000,
    tokensPerDay: 1_000_000_000,
  }, null);
  const a = new Admitter(store);
  const b = new Admitter(store);
  const start = Date.now();
  let admitted = 0;
  for (let wave = 0; wave < 8; wave++) {
    const rs = await Promise.all(
      Array.from({ length: 1000 }, (_, i) => (i % 2 ? a : b).admit(req(plan))),
    );
    await Promise.all(rs.map((r, i) => {
      if (!r.ok) return;
      admitted++;
      return (i % 2 ? a : b).settle(r.reservation!, 5);
    }));
  }
  await Promise.all([a.flush(), b.flush()]);
  assert.ok(admitted <= 5000, `${admitted} admitted against rpm 5000`);
  assert.ok(admitted >= 4500, `${admitted}: leases left little idle`);
  assert.equal(await rpmUsed(store, "t:t1", start), admitted);
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  assert.equal(await countReservations(store), 0);
  kv.close();
});
