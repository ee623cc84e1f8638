/**
 * Wide plans on a KV that allows 10 checks a commit (denokv): a key and its
 * tenant with every limit and both budgets (12 counters) are admitted by
 * group commits, exactly, giving back on a later group's refusal, and
 * reclaimed whole after a crash between groups.
 */
import assert from "node:assert/strict";
import {
  Admitter,
  counterValue,
  countReservations,
  type HardBudgets,
  limitPlan,
  reclaimExpired,
  type RequestPrice,
  windowOf,
  worstCost,
} from "./mod.ts";
import { k } from "../kv_keys.ts";
import { createStore, type Store } from "../store.ts";
import { type Limits, UNLIMITED } from "../limits.ts";
import { awayFromMinuteEdge } from "../../gateway/_testing.ts";
import { countCommits, denokvLimits, sleep } from "./_testing.ts";
import type { StoredReservation } from "./types.ts";

/** Every limit, far from reach unless a test tightens one. */
const ALL: Limits = {
  ...UNLIMITED,
  rpm: 100_000,
  tpm: 100_000_000,
  concurrency: 10_000,
  tokensPerDay: 1_000_000_000,
  tokensPerMonth: 10_000_000_000,
};
const BUDGETS: HardBudgets = { tokens: 1_000_000_000, money: 1e12 };

/** 1 micro-unit a prompt token, 2 a completion token: 10 tokens cost 15. */
const PRICE: RequestPrice = {
  prompt: 5,
  promptPerMillion: 1_000_000,
  completionPerMillion: 2_000_000,
};

/** Tenant t1's key k1 with every limit and both budgets: 12 counters. */
function widePlan(o: {
  key?: Partial<Limits>;
  tenant?: Partial<Limits>;
  keyBudgets?: Partial<HardBudgets>;
  tenantBudgets?: Partial<HardBudgets>;
} = {}) {
  const plan = limitPlan("t1", "k1", { ...ALL, ...o.tenant }, {
    ...ALL,
    ...o.key,
  }, {
    tenant: { ...BUDGETS, ...o.tenantBudgets },
    key: { ...BUDGETS, ...o.keyBudgets },
  });
  assert.equal(plan.rules.length, 12);
  return plan;
}

const ask = (
  plan: ReturnType<typeof limitPlan>,
  tokens = 10,
  minTokens = tokens,
  ttlMs = 60_000,
) => ({ plan, tokens, minTokens, reclaimTokens: 3, ttlMs, price: PRICE });

/** Every window of t1 and k1 a 12-counter plan counts in, by name. */
async function usage(store: Store): Promise<Record<string, number>> {
  const now = Date.now();
  const out: Record<string, number> = {};
  for (const s of ["k:k1", "t:t1"]) {
    for (const kind of ["rpm", "tpm", "day", "month", "spend"] as const) {
      out[`${s} ${kind}`] = await counterValue(
        store,
        s,
        windowOf(kind, now)[0],
      );
    }
    out[`${s} conc`] = await counterValue(store, s, "conc");
  }
  return out;
}

/** Usage of `n` requests holding `tokens` and `money` each (in flight). */
function expected(n: number, tokens: number, money: number, conc = n) {
  const out: Record<string, number> = {};
  for (const s of ["k:k1", "t:t1"]) {
    out[`${s} rpm`] = n;
    out[`${s} tpm`] = n * tokens;
    out[`${s} day`] = n * tokens;
    out[`${s} month`] = n * tokens;
    out[`${s} spend`] = n * money;
    out[`${s} conc`] = conc;
  }
  return out;
}

for (
  const [what, plan, n] of [
    [
      "the key's rpm (the first group)",
      () => widePlan({ key: { rpm: 37 } }),
      37,
    ],
    [
      "the tenant's money budget (the last group)",
      () => widePlan({ tenantBudgets: { money: 15 * 41 } }),
      41,
    ],
  ] as const
) {
  Deno.test(`a 12-counter plan admits exactly ${n} of 200 concurrent requests of two gateways against ${what}, within 10 checks a commit`, async () => {
    await awayFromMinuteEdge();
    const kv = await Deno.openKv(":memory:");
    const stats = denokvLimits(kv);
    const store = await createStore(kv);
    const opts = { maxChecks: 10, settleDelayMs: 0, reclaimEveryMs: 0 };
    const a = new Admitter(store, { ...opts, owner: "a" });
    const b = new Admitter(store, { ...opts, owner: "b" });
    const p = plan();
    const results = await Promise.all(
      Array.from({ length: 200 }, (_, i) => (i % 2 ? a : b).admit(ask(p))),
    );
    const ok = results.filter((r) => r.ok);
    assert.equal(ok.length, n);
    const refused = results.find((r) => !r.ok);
    assert.ok(refused && !refused.ok);
    assert.deepEqual(refused.rule, p.rules.find((r) => r.limit < 1000));
    assert.deepEqual(await usage(store), expected(n, 10, 15));
    assert.equal(await countReservations(store), n);
    // Settled to 4 tokens costing 6: every counter holds exactly that.
    await Promise.all(results.flatMap((r, i) => {
      if (!r.ok) return [];
      assert.ok(r.reservation && !r.reservation.lease);
      assert.equal(r.reservation.tokenCounters.length, 6);
      assert.equal(r.reservation.moneyCounters?.length, 2);
      return [(i % 2 ? a : b).settle(r.reservation, 4, 6)];
    }));
    await a.close();
    await b.close();
    assert.deepEqual(await usage(store), expected(n, 4, 6, 0));
    assert.equal(await countReservations(store), 0);
    assert.ok(stats.mostChecks <= 10, `${stats.mostChecks} checks`);
    assert.ok(stats.mostMutations <= 1000);
    kv.close();
  });
}

Deno.test("a later group's refusal gives back what the first group took, in its own commit", async () => {
  await awayFromMinuteEdge();
  const kv = await Deno.openKv(":memory:");
  denokvLimits(kv);
  const seen = countCommits(kv);
  const store = await createStore(kv);
  const opts = { maxChecks: 10, settleDelayMs: 0, reclaimEveryMs: 0 };
  const a = new Admitter(store, opts);
  const b = new Admitter(store, opts);
  const plan = widePlan({ tenantBudgets: { money: 30 } });
  assert.ok((await a.admit(ask(plan))).ok);
  // The other gateway spends the rest: this one's counters are stale.
  assert.ok((await b.admit(ask(plan))).ok);
  const before = await usage(store);
  assert.deepEqual(before, expected(2, 10, 15));
  const commits = seen.commits;
  const r = await a.admit(ask(plan));
  assert.ok(!r.ok);
  assert.equal(r.reason, "quota");
  assert.deepEqual(r.rule, {
    subject: "t:t1",
    kind: "spend",
    limit: 30,
    budget: true,
  });
  // Its counters as last known had room: the first group committed (on
  // its second try: the other gateway moved the tenant's counters), the
  // second failed its checks, then refused and gave the first one back.
  assert.equal(seen.commits - commits, 4);
  assert.deepEqual(await usage(store), before);
  assert.equal(await countReservations(store), 2);
  await a.close();
  await b.close();
  kv.close();
});

Deno.test("a later group granting fewer tokens gives the difference back to the first group in its commit", async () => {
  const kv = await Deno.openKv(":memory:");
  denokvLimits(kv);
  const store = await createStore(kv);
  const opts = { maxChecks: 10, settleDelayMs: 0, reclaimEveryMs: 0 };
  const a = new Admitter(store, opts);
  const b = new Admitter(store, opts);
  const plan = widePlan({ tenantBudgets: { tokens: 1000 } });
  assert.ok((await a.admit(ask(plan, 100))).ok);
  assert.ok((await b.admit(ask(plan, 800))).ok);
  // As this gateway last knew, 900 tokens were left; 100 are.
  const r = await a.admit(ask(plan, 5000, 10));
  assert.ok(r.ok && r.reservation);
  assert.equal(r.reservation.tokens, 100);
  assert.equal(r.reservation.money, worstCost(PRICE, 100));
  const u = await usage(store);
  const money = worstCost(PRICE, 100) * 2 + worstCost(PRICE, 800);
  for (const s of ["k:k1", "t:t1"]) {
    assert.equal(u[`${s} tpm`], 1000);
    assert.equal(u[`${s} month`], 1000);
    assert.equal(u[`${s} spend`], money);
  }
  await a.close();
  await b.close();
  kv.close();
});

/**
 * Admits a 12-counter plan on `kv` through a gateway whose process is gone
 * once its first group committed (its second group's commit never lands);
 * resolves with that request's record.
 */
async function crashBetweenGroups(
  kv: Deno.Kv,
  owner: string,
  ttlMs: number,
): Promise<{ store: Store; held: StoredReservation }> {
  let armed = true;
  // The second group's commit is the first to check a reservation.
  denokvLimits(kv, (checked) => {
    if (!armed || !checked.some((key) => key[0] === "reservation")) {
      return false;
    }
    armed = false;
    return true;
  });
  const store = await createStore(kv);
  const crashed = new Admitter(store, {
    maxChecks: 10,
    owner,
    reclaimEveryMs: 0,
  });
  void crashed.admit(ask(widePlan(), 10, 10, ttlMs));
  for (let i = 0; i < 500; i++) {
    if (!armed) break;
    await sleep(10);
  }
  assert.equal(armed, false, "the second group's commit was sent");
  const held: StoredReservation[] = [];
  for await (
    const e of kv.list<StoredReservation>({ prefix: k.reservationPrefix() })
  ) held.push(e.value);
  assert.equal(held.length, 1);
  return { store, held: held[0]! };
}

Deno.test("a gateway gone between a wide request's groups: its restart reclaims all the first group took, billing nothing", async () => {
  await awayFromMinuteEdge();
  const kv = await Deno.openKv(":memory:");
  const { store, held } = await crashBetweenGroups(kv, "gw-a", 60_000);
  // The record says what the first group holds: the key's limits and
  // budgets, the tenant's limits; not the tenant's budgets.
  assert.equal(held.admitting, true);
  assert.equal(held.reclaimTokens, 0);
  assert.equal(held.reclaimMoney, 0);
  assert.equal(held.tokenCounters.length, 5);
  assert.deepEqual(held.moneyCounters?.map(([s]) => s), ["k:k1"]);
  assert.equal(held.reqCounters?.length, 2);
  const u = await usage(store);
  assert.deepEqual(u, {
    ...expected(1, 10, 15),
    "t:t1 month": 0,
    "t:t1 spend": 0,
  });
  const a = new Admitter(store, { maxChecks: 10, reclaimEveryMs: 0 });
  assert.equal(await a.reclaimOwned(new Set(["gw-a"])), 1);
  assert.deepEqual(await usage(store), expected(0, 0, 0));
  assert.equal(await countReservations(store), 0);
  // The request was never admitted: the key can use its whole limits.
  assert.ok((await a.admit(ask(widePlan()))).ok);
  await a.close();
  kv.close();
});

Deno.test("a wide request's record left between groups is reclaimed past its deadline, billing nothing", async () => {
  await awayFromMinuteEdge();
  const kv = await Deno.openKv(":memory:");
  const { store } = await crashBetweenGroups(kv, "gw-b", 1000);
  assert.equal(await reclaimExpired(store, Date.now()), 0);
  assert.equal(await reclaimExpired(store, Date.now() + 5000), 1);
  assert.deepEqual(await usage(store), expected(0, 0, 0));
  assert.equal(await countReservations(store), 0);
  kv.close();
});

Deno.test("KV failing between a wide request's groups: the first group's holds go back and it fails closed", async () => {
  await awayFromMinuteEdge();
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  let fail = true;
  const atomic = kv.atomic.bind(kv);
  kv.atomic = () => {
    const op = atomic();
    let record = false;
    const check = op.check.bind(op);
    op.check = (...cs) => {
      record ||= cs.some((c) => c.key[0] === "reservation");
      return check(...cs);
    };
    const commit = op.commit.bind(op);
    op.commit = () => {
      if (record && fail) {
        fail = false;
        return Promise.reject(new TypeError("connection reset"));
      }
      return commit();
    };
    return op;
  };
  const a = new Admitter(store, { maxChecks: 10, reclaimEveryMs: 0 });
  await assert.rejects(a.admit(ask(widePlan())), {
    name: "QuotaUnavailableError",
  });
  assert.deepEqual(await usage(store), expected(0, 0, 0));
  assert.equal(await countReservations(store), 0);
  await a.close();
  kv.close();
});

Deno.test("a plan that fits 10 checks is admitted by one commit, one with a counter more by two", async () => {
  await awayFromMinuteEdge();
  const kv = await Deno.openKv(":memory:");
  const stats = denokvLimits(kv);
  const store = await createStore(kv);
  const a = new Admitter(store, {
    maxChecks: 10,
    leaseMs: 0,
    reclaimEveryMs: 0,
  });
  const narrow = limitPlan("t1", "k1", ALL, ALL);
  assert.equal(narrow.rules.length, 10);
  const wide = limitPlan("t1", "k1", ALL, ALL, {
    tenant: { tokens: null, money: 1e12 },
  });
  assert.equal(wide.rules.length, 11);
  for (const [plan, commits] of [[narrow, 1], [wide, 2]] as const) {
    for (let i = 0; i < 5; i++) {
      const before = stats.commits;
      const r = await a.admit(ask(plan));
      assert.ok(r.ok && r.reservation && !r.reservation.lease);
      assert.equal(stats.commits - before, commits);
      await a.settle(r.reservation, 4, 6);
      await a.flush();
    }
  }
  assert.equal(stats.mostChecks, 10);
  await a.close();
  kv.close();
});
