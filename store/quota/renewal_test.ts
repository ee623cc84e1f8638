/** Lease renewal: successors granted before a lease ends, in the right windows. */
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
import {
  assertTwoMinutes,
  beforeMinuteBoundary,
  req,
  ROOMY,
  rpmUsed,
  sleep,
  steadyKey,
  twoMinutes,
} from "./_testing.ts";

Deno.test("Admitter renews a steady key's lease before it ends: no request waits for a commit", async () => {
  await awayFromMinuteEdge(8000);
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", ROOMY, null);
  const a = new Admitter(store, { leaseMs: 300, renewDelayMs: 5 });
  const start = Date.now();
  const leased = await steadyKey(a, plan, Date.now() + 3000, 20);
  // Once the rate is known (the first second), each lease's successor is
  // granted while it still serves: over a dozen leases, no request waits.
  const late = leased.slice(Math.floor(leased.length / 3));
  assert.ok(late.length > 40, `${late.length} requests`);
  assert.ok(
    late.filter((l) => !l).length <= 1,
    `${late.filter((l) => !l).length} of ${late.length} committed on the path`,
  );
  await a.flush();
  assert.equal(await rpmUsed(store, "t:t1", start), leased.length);
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  assert.equal(await countReservations(store), 0);
  kv.close();
});

Deno.test("Admitter renews a lease ending at a minute boundary in the next minute's windows", async () => {
  // The clock runs 2.5 s before a minute boundary.
  await beforeMinuteBoundary(2500, async () => {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    const plan = limitPlan("t1", "k1", ROOMY, null);
    const a = new Admitter(store, { renewDelayMs: 5 });
    const start = Date.now();
    const boundary = windowOf("rpm", start)[1];
    // A burst makes the key busy (its leases grow to the most one holds,
    // each ending at the boundary); then it sends one request every 20 ms.
    const at: [number, number][] = [];
    const burst = await steadyKey(a, plan, start + 500, 0, at);
    const leased = await steadyKey(a, plan, boundary + 1000, 20, at);
    // The last lease's successor, granted before the boundary, counts in
    // the next minute: no request waits for a commit across it.
    assert.ok(
      leased.every((l) => l),
      `committed on the path: ${leased.flatMap((l, i) => l ? [] : [i])}`,
    );
    await a.flush();
    const used = await twoMinutes(store, start);
    assert.ok(used[0]! > 0 && used[1]! > 0, `${used}`);
    assertTwoMinutes(used, burst.length + leased.length, at, boundary);
    assert.equal(await counterValue(store, "t:t1", "conc"), 0);
    assert.equal(await countReservations(store), 0);
    kv.close();
  });
});

Deno.test("Admitter runs a lease to its window's end instead of leaving a stub after it", async () => {
  // The clock runs 1.2 s before a minute boundary and leases last 0.75 to
  // 1 s: the first would end 0.2 to 0.45 s before the boundary, less than
  // half a lease, so it runs to the boundary, sized for its span.
  await beforeMinuteBoundary(1200, async () => {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    const plan = limitPlan("t1", "k1", ROOMY, null);
    const a = new Admitter(store, { leaseMs: 1000, renewDelayMs: 5 });
    const boundary = windowOf("rpm", Date.now())[1];
    const leased = await steadyKey(a, plan, Date.now() + 150, 10);
    assert.ok(leased.some((l) => l), `${leased}`);
    const deadlines: number[] = [];
    for await (
      const e of kv.list<{ deadline: number; units: number }>({
        prefix: ["reservation"],
      })
    ) {
      deadlines.push(e.value.deadline);
    }
    // The first lease ends at the boundary (then each request has ttlMs
    // to finish); a successor, if granted yet, starts there.
    assert.equal(Math.min(...deadlines), boundary + 60_000);
    await a.flush();
    assert.equal(await countReservations(store), 0);
    kv.close();
  });
});

Deno.test("Admitter gives a lease used up before its window ends a successor in that window: no request waits for a commit", async () => {
  // The clock runs 3 s before a minute boundary; every lease of the
  // minute ends there, and holds 40 requests: under a second's worth.
  await beforeMinuteBoundary(3000, async () => {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    const plan = limitPlan("t1", "k1", ROOMY, null);
    const a = new Admitter(store, { renewDelayMs: 5, maxLease: 40 });
    const start = Date.now();
    const boundary = windowOf("rpm", start)[1];
    const at: [number, number][] = [];
    const burst = await steadyKey(a, plan, start + 300, 0, at);
    const leased = await steadyKey(a, plan, boundary + 500, 10, at);
    // Several leases were used up before the boundary: each one's
    // successor counted in the same minute and took over at once. (Where
    // the pace of the last one misleads, one request may commit at the
    // boundary or just before it.)
    assert.ok(leased.length > 150, `${leased.length} requests`);
    const committed = leased.flatMap((l, i) => l ? [] : [i]);
    assert.ok(committed.length <= 1, `committed on the path: ${committed}`);
    await a.flush();
    const used = await twoMinutes(store, start);
    assert.ok(used[0]! > 80 && used[1]! > 0, `${used}`);
    assertTwoMinutes(used, burst.length + leased.length, at, boundary);
    assert.equal(await countReservations(store), 0);
    kv.close();
  });
});

Deno.test("Admitter renews a key slowing down after a burst in the next minute's windows, not in the burst's", async () => {
  // The clock runs 3 s before a minute boundary. A burst uses leases up
  // (each successor counted in the same minute); then the key slows to
  // one request every 250 ms, and its lease would last past the boundary:
  // the successor granted for the burst would end with it, unused.
  await beforeMinuteBoundary(3000, async () => {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    const plan = limitPlan("t1", "k1", ROOMY, null);
    const a = new Admitter(store, { renewDelayMs: 5, maxLease: 100 });
    const start = Date.now();
    const boundary = windowOf("rpm", start)[1];
    // The burst stops with its third lease 60% used, and past the point
    // its successor is asked for (a random one: see RENEW_AT), so that
    // successor was asked for, in the same minute (at the burst's pace).
    // A lease whose point is so late that under 15 requests remain would
    // be used up before the boundary at the slow pace (its successor then
    // opens with one request before the boundary and, as any key that
    // quiet, commits once after it): the burst goes on to the next one.
    let burst = 0;
    const seen = new Set<unknown>();
    for (;;) {
      const r = await a.admit(req(plan));
      assert.ok(r.ok && r.reservation);
      burst++;
      await a.settle(r.reservation, 4);
      const l = r.reservation.lease;
      if (l) seen.add(l);
      if (
        l && seen.size >= 3 &&
        l.admitted >= Math.max(0.6 * l.n, l.renewAfter) &&
        l.n - l.admitted >= 15
      ) break;
    }
    const at: [number, number][] = [];
    const slow = await steadyKey(a, plan, boundary, 250, at);
    // Past the boundary, the first requests are admitted from a lease
    // granted before it, in the next minute's windows.
    const after = await steadyKey(a, plan, boundary + 800, 250, at);
    assert.ok(after.length >= 3, `${after.length} requests`);
    assert.ok(
      after.every((l) => l),
      `committed on the path after the boundary: ${
        after.flatMap((l, i) => l ? [] : [i])
      }`,
    );
    await a.flush();
    const used = await twoMinutes(store, start);
    assertTwoMinutes(used, burst + slow.length + after.length, at, boundary);
    assert.equal(await countReservations(store), 0);
    kv.close();
  });
});

Deno.test("Admitter keeps every commit within maxChecks, successors in the next minute's windows included", async () => {
  // The clock runs 2 s before a minute boundary: a successor counts in the
  // next minute, so it shares no counter with the requests admitted now.
  await beforeMinuteBoundary(2000, async () => {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    let most = 0;
    const atomic = kv.atomic.bind(kv);
    kv.atomic = () => {
      const op = atomic();
      let checks = 0;
      const check = op.check.bind(op);
      op.check = (...c) => {
        checks += c.length;
        most = Math.max(most, checks);
        return check(...c);
      };
      // Slow commits: requests queue behind a tenant's commit in flight.
      const commit = op.commit.bind(op);
      op.commit = () => sleep(20).then(commit);
      return op;
    };
    const tenant = ROOMY;
    const key = { ...UNLIMITED, rpm: 100_000 };
    const a = new Admitter(store, { renewDelayMs: 0, maxChecks: 6 });
    const leased = limitPlan("t1", "k0", tenant, key);
    const newKeys = (wave: number, from: number) =>
      Array.from(
        { length: 3 },
        (_, i) =>
          a.admit(req(limitPlan("t1", `k${wave}.${from + i}`, tenant, key))),
      );
    const end = windowOf("rpm", Date.now())[1] + 500;
    let admitted = 0;
    for (let wave = 0; Date.now() < end; wave++) {
      // The leased key asks for its successor (in the next minute) while
      // new keys of the same tenant wait for their commits.
      const rs = await Promise.all([
        ...Array.from({ length: 3 }, () => a.admit(req(leased))),
        ...newKeys(wave, 0),
        sleep(5).then(() => Promise.all(newKeys(wave, 3))),
      ]);
      for (const r of rs.flat()) {
        assert.ok(r.ok && r.reservation);
        admitted++;
        await a.settle(r.reservation, 4);
      }
    }
    await a.flush();
    assert.ok(most <= 6, `a commit checked ${most} counters`);
    assert.equal(await countReservations(store), 0);
    assert.ok(admitted > 0);
    kv.close();
  });
});
