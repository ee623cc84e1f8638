/** Settlement: exactly once, batched, deferred, and tidied after its window. */
import assert from "node:assert/strict";
import {
  Admitter,
  counterValue,
  countReservations,
  limitPlan,
  settle,
  windowOf,
} from "./mod.ts";
import { createStore } from "../store.ts";
import { UNLIMITED } from "../limits.ts";
import { awayFromMinuteEdge } from "../../gateway/_testing.ts";
import {
  beforeMinuteBoundary,
  countCommits,
  releaseFixture,
  req,
  ROOMY,
  rpmUsed,
  sleep,
  steadyKey,
} from "./_testing.ts";

Deno.test("settle() returns unused tokens and the concurrency slot exactly once", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", {
    ...UNLIMITED,
    tokensPerDay: 100,
    concurrency: 1,
  }, null);
  const a = new Admitter(store);
  const r = await a.admit(req(plan, 60));
  assert.ok(r.ok && r.reservation);
  assert.ok(!(await a.admit(req(plan, 10))).ok, "concurrency 1 is held");
  assert.equal(await settle(store, r.reservation, 15), true);
  assert.equal(
    await settle(store, r.reservation, 15),
    false,
    "second settlement is a no-op",
  );
  const day = windowOf("day", Date.now())[0];
  assert.equal(await counterValue(store, "t:t1", day), 15);
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  assert.equal(await countReservations(store), 0);
  assert.ok(
    (await a.admit(req(plan, 10))).ok,
    "the released slot is seen before refusing",
  );
  kv.close();
});

Deno.test("Admitter.settle() batches settlements into few commits, exactly once each", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", {
    ...UNLIMITED,
    tokensPerDay: 10_000,
    concurrency: 200,
  }, null);
  const a = new Admitter(store, { settleDelayMs: 50, leaseMs: 0 });
  const granted = await Promise.all(
    Array.from({ length: 100 }, () => a.admit(req(plan, 50))),
  );
  const seen = countCommits(kv);
  const reservations = granted.map((g) => g.ok ? g.reservation! : null);
  assert.ok(reservations.every((r) => r !== null));
  // One of them is reclaimed first (a crashed gateway's view): its batch
  // falls back to one-by-one and it is not released twice.
  assert.equal(await settle(store, reservations[7]!, 50), true);
  const outcomes = await Promise.all(
    reservations.map((r) => a.settle(r!, 20)),
  );
  assert.equal(outcomes.filter((ok) => !ok).length, 1);
  // 64 + 36: the first batch fails its check once, is read and retried.
  assert.ok(seen.commits <= 4, `${seen.commits} commits for 100 settlements`);
  const day = windowOf("day", Date.now())[0];
  assert.equal(await counterValue(store, "t:t1", day), 99 * 20 + 50);
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  assert.equal(await countReservations(store), 0);
  kv.close();
});

Deno.test("Admitter.settle() keeps each commit of many tenants' settlements within 128 mutations", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const a = new Admitter(store, { settleDelayMs: 50, leaseMs: 0 });
  const limits = {
    ...UNLIMITED,
    tpm: 1e9,
    tokensPerDay: 1e9,
    tokensPerMonth: 1e9,
    concurrency: 10,
  };
  const granted = await Promise.all(
    Array.from(
      { length: 60 },
      (_, t) => a.admit(req(limitPlan(`t${t}`, `k${t}`, limits, limits), 50)),
    ),
  );
  const commits: number[] = [];
  const atomic = kv.atomic.bind(kv);
  kv.atomic = () => {
    const op = atomic();
    let n = 0;
    for (const m of ["check", "set", "delete", "sum"] as const) {
      const f = op[m].bind(op) as (...a: unknown[]) => Deno.AtomicOperation;
      (op[m] as unknown) = (...a: unknown[]) => {
        n += m === "check" ? a.length : 1;
        return f(...a);
      };
    }
    const commit = op.commit.bind(op);
    op.commit = () => {
      commits.push(n);
      return commit();
    };
    return op;
  };
  // 60 tenants' settlements, each a check, a delete and sums on its own
  // tenant's and key's counters (~10 mutations), queued together.
  const outcomes = await Promise.all(
    granted.map((g) => a.settle(g.ok ? g.reservation! : assert.fail(), 20)),
  );
  assert.ok(outcomes.every((ok) => ok));
  assert.ok(commits.length > 1, `${commits.length} commits`);
  assert.ok(
    commits.every((n) => n <= 128),
    `mutations per commit: ${commits.join(", ")}`,
  );
  const day = windowOf("day", Date.now())[0];
  for (const t of [0, 59]) {
    assert.equal(await counterValue(store, `t:t${t}`, day), 20);
    assert.equal(await counterValue(store, `k:k${t}`, "conc"), 0);
  }
  assert.equal(await countReservations(store), 0);
  kv.close();
});

Deno.test("Admitter settles a lease that ran its course a little later, or at once on flush()", async () => {
  await awayFromMinuteEdge(8000);
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", ROOMY, null);
  // Spread long: a lease that ends stays held until flush().
  const a = new Admitter(store, { leaseMs: 300, settleSpreadMs: 60_000 });
  const start = Date.now();
  const leased = await steadyKey(a, plan, Date.now() + 600, 20);
  assert.ok(leased.includes(true), "no request came from a lease");
  await sleep(1300); // its leases end, and the sweep closes them
  assert.ok(await countReservations(store) >= 1, "a lease settled at once");
  await a.flush();
  assert.equal(await countReservations(store), 0);
  assert.equal(await rpmUsed(store, "t:t1", start), leased.length);
  assert.equal(await counterValue(store, "t:t1", "conc"), 0);
  // Spread short: it settles on its own.
  const b = new Admitter(store, { leaseMs: 300, settleSpreadMs: 200 });
  const again = await steadyKey(b, plan, Date.now() + 600, 20);
  assert.ok(again.includes(true), "no request came from a lease");
  await sleep(1300 + 300);
  assert.equal(await countReservations(store), 0);
  assert.equal(
    await rpmUsed(store, "t:t1", start),
    leased.length + again.length,
  );
  await b.flush();
  kv.close();
});

Deno.test("Admitter gives nothing back to a window that has ended, and deletes the release counters it added to a minute after their window", async () => {
  // The clock runs 2 s before a minute boundary, then jumps.
  await beforeMinuteBoundary(2000, async (jump) => {
    const { kv, store, plan, tpm, day, released } = await releaseFixture();
    const a = new Admitter(store, { leaseMs: 0 });
    // Settled in its minute: 6 of its 10 tokens go back to the minute.
    const first = await a.admit(req(plan));
    assert.ok(first.ok && first.reservation);
    await a.settle(first.reservation, 4);
    await a.flush();
    assert.equal(await released(tpm), 6n);
    // Settled after the minute ended: the minute is left as it was (no
    // one admits there any more); the day, still open, gets its tokens.
    const second = await a.admit(req(plan));
    assert.ok(second.ok && second.reservation);
    jump(3000);
    await a.settle(second.reservation, 4);
    await a.flush();
    assert.equal(await released(tpm), 6n);
    assert.equal(await released(day), 12n);
    // A minute later, the next settlement deletes the minute's release
    // counter (its `sum`s left it no expiry), and keeps the day's.
    jump(60_000);
    const third = await a.admit(req(plan));
    assert.ok(third.ok && third.reservation);
    await a.settle(third.reservation, 4);
    await a.flush();
    assert.equal(await released(tpm), undefined);
    assert.equal(await released(day), 18n);
    assert.equal(await countReservations(store), 0);
    kv.close();
  });
});
