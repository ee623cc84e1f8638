import assert from "node:assert/strict";
import {
  type Admission,
  Admitter,
  CHECKPOINT_MS,
  counterValue,
  countReservations,
  limitPlan,
  reclaimExpired,
  settle,
  windowOf,
} from "./quota.ts";
import { createStore, type Store } from "./store.ts";
import { UNLIMITED } from "./limits.ts";
import { awayFromMinuteEdge } from "../gateway/_testing.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const req = (
  plan: ReturnType<typeof limitPlan>,
  tokens = 10,
  minTokens = tokens,
) => ({
  plan,
  tokens,
  minTokens,
  reclaimTokens: 3,
  ttlMs: 60_000,
});

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

Deno.test("Admitter.admit() throws QuotaUnavailableError when KV is closed", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  kv.close();
  const plan = limitPlan("t1", "k1", { ...UNLIMITED, rpm: 5 }, null);
  await assert.rejects(new Admitter(store).admit(req(plan)), {
    name: "QuotaUnavailableError",
  });
});

/** Counts the atomic commits made through a KV handle. */
function countCommits(kv: Deno.Kv): { commits: number } {
  const counter = { commits: 0 };
  const atomic = kv.atomic.bind(kv);
  kv.atomic = () => {
    const op = atomic();
    const commit = op.commit.bind(op);
    op.commit = () => {
      counter.commits++;
      return commit();
    };
    return op;
  };
  return counter;
}

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

/** Usage of a subject's rpm windows between two times (a test may straddle a minute). */
async function rpmUsed(
  store: Awaited<ReturnType<typeof createStore>>,
  subject: string,
  from: number,
): Promise<number> {
  const a = windowOf("rpm", from)[0];
  const b = windowOf("rpm", Date.now())[0];
  return await counterValue(store, subject, a) +
    (a === b ? 0 : await counterValue(store, subject, b));
}

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

/** Tenant t1's plan with a request rate and concurrency far from any lease's reach. */
const roomyRpmPlan = () =>
  limitPlan(
    "t1",
    "k1",
    { ...UNLIMITED, rpm: 100_000, concurrency: 10_000 },
    null,
  );

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

/** Tenant limits far from any lease's reach. */
const ROOMY = {
  ...UNLIMITED,
  rpm: 100_000,
  tpm: 100_000_000,
  concurrency: 10_000,
};

/**
 * Admits one request at a time, every `everyMs`, until `until`; whether
 * each came from a lease (and, into `at`, the time before and after each).
 */
async function steadyKey(
  a: Admitter,
  plan: ReturnType<typeof limitPlan>,
  until: number,
  everyMs: number,
  at: [number, number][] = [],
): Promise<boolean[]> {
  const leased: boolean[] = [];
  while (Date.now() < until) {
    const before = Date.now();
    const r = await a.admit(req(plan));
    at.push([before, Date.now()]);
    assert.ok(r.ok && r.reservation);
    leased.push(!!r.reservation.lease);
    await a.settle(r.reservation, 4);
    if (everyMs > 0) await new Promise((r) => setTimeout(r, everyMs));
  }
  return leased;
}

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

/**
 * Runs `f` with the clock (Date.now) `ms` before the next minute boundary;
 * `f` may move that clock on by calling `jump`.
 */
async function beforeMinuteBoundary(
  ms: number,
  f: (jump: (ms: number) => void) => Promise<void>,
): Promise<void> {
  const realNow = Date.now;
  let skew = 60_000 - (realNow() % 60_000) - ms;
  Date.now = () => realNow() + skew;
  try {
    await f((ms) => skew += ms);
  } finally {
    Date.now = realNow;
  }
}

/**
 * Checks tenant t1's two minutes around `boundary` (see twoMinutes) after
 * `total` requests timed in `at`: the next minute, still open, holds
 * exactly those admitted in it (one admitted across the boundary may count
 * in either); the first, over, holds at least the rest (what its leases
 * did not use is not given back once it has ended: nothing admits there).
 */
function assertTwoMinutes(
  used: number[],
  total: number,
  at: [number, number][],
  boundary: number,
): void {
  const surely = at.filter(([before]) => before >= boundary).length;
  const maybe = at.filter(([, after]) => after >= boundary).length;
  assert.ok(used[1]! >= surely && used[1]! <= maybe, `${used}: ${surely}`);
  assert.ok(used[0]! >= total - used[1]!, `${used} of ${total}`);
}

/** Tenant t1's requests counted in the minute of `at` and in the next. */
async function twoMinutes(store: Store, at: number): Promise<number[]> {
  const [minute, end] = windowOf("rpm", at);
  return [
    await counterValue(store, "t:t1", minute),
    await counterValue(store, "t:t1", windowOf("rpm", end)[0]),
  ];
}

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

/**
 * A store with tenant t1's plan (minute limits and a day quota), the
 * current minute's and day's token windows, and a reader of a window's
 * release counter (undefined once deleted).
 */
async function releaseFixture() {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", {
    ...ROOMY,
    tokensPerDay: 1_000_000,
  }, null);
  const [tpm] = windowOf("tpm", Date.now());
  const [day] = windowOf("day", Date.now());
  const released = async (window: string) =>
    (await kv.get<Deno.KvU64>(["quota", "t:t1", `${window}:r`])).value
      ?.value;
  return { kv, store, plan, tpm, day, released };
}

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
