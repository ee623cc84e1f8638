/** Spend rules: money budgets admitted, clamped, settled and reclaimed exactly. */
import assert from "node:assert/strict";
import { UNLIMITED } from "../limits.ts";
import { createStore } from "../store.ts";
import {
  Admitter,
  counterValue,
  countReservations,
  limitPlan,
  reclaimExpired,
  type RequestPrice,
  windowOf,
  worstCost,
} from "./mod.ts";
import { affordableTokens } from "./spend.ts";

Deno.test("affordableTokens() is the most tokens whose worst case fits the room", () => {
  for (
    const price of [
      {
        prompt: 20,
        promptPerMillion: 1_000_000,
        completionPerMillion: 3_000_000,
      },
      { prompt: 7, promptPerMillion: 333, completionPerMillion: 1_700_001 },
      { prompt: 1000, promptPerMillion: 0, completionPerMillion: 12_345 },
    ] as RequestPrice[]
  ) {
    for (const room of [0, 1, 19, 20, 21, 499, 500, 12_345, 1_000_000]) {
      const n = affordableTokens(price, room);
      if (n < 0) {
        assert.ok(room <= 0 || worstCost(price, price.prompt) > room);
        continue;
      }
      assert.ok(worstCost(price, n) <= room, `${n} fits ${room}`);
      assert.ok(worstCost(price, n + 1) > room, `${n + 1} does not`);
    }
  }
  const free = { prompt: 5, promptPerMillion: 1e6, completionPerMillion: 0 };
  assert.equal(affordableTokens(free, 10), Infinity);
  assert.equal(affordableTokens(undefined, 1), Infinity);
  assert.equal(affordableTokens(undefined, 0), -1);
});

Deno.test("a spend rule reserves the worst case in money, clamps an open-ended request to what is left, and settles to the bill", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", UNLIMITED, null, {
    tenant: { tokens: null, money: 100_000 },
  });
  assert.deepEqual(plan.rules, [
    { subject: "t:t1", kind: "spend", limit: 100_000, budget: true },
  ]);
  // 1 per 1M prompt (1 micro a token), 10 per 1M completion (10 a token)
  const price = {
    prompt: 1000,
    promptPerMillion: 1_000_000,
    completionPerMillion: 10_000_000,
  };
  const a = new Admitter(store, { settleDelayMs: 0, reclaimEveryMs: 0 });
  const window = windowOf("spend", Date.now())[0];
  const used = () => counterValue(store, "t:t1", window);
  const ask = (tokens: number, minTokens = tokens) =>
    a.admit({
      plan,
      tokens,
      minTokens,
      reclaimTokens: 900,
      ttlMs: 1000,
      price,
    });
  // 1,000 prompt + 5,000 completion: 1,000 + 50,000
  const first = await ask(6000);
  assert.ok(first.ok && first.reservation);
  assert.equal(first.reservation.money, 51_000);
  assert.equal(await used(), 51_000);
  // Open-ended: 49,000 left buys the prompt and 4,800 completion tokens.
  const second = await ask(1_000_000, 1001);
  assert.ok(second.ok && second.reservation);
  assert.equal(second.reservation.tokens, 5800);
  assert.equal(await used(), 100_000);
  // Nothing left: refused as a quota, naming the budget.
  const third = await ask(1001, 1001);
  assert.ok(!third.ok);
  assert.equal(third.reason, "quota");
  assert.equal(third.rule.kind, "spend");
  assert.equal(third.rule.budget, true);
  // Settled to what was billed: 1,000 prompt + 100 completion = 2,000.
  await a.settle(first.reservation, 1100, 2000);
  await a.flush();
  assert.equal(await used(), 2000 + 49_000);
  // A crash: reclaimed past its deadline, billed its prompt estimate (900).
  assert.equal(await reclaimExpired(store, Date.now() + 5000), 1);
  assert.equal(await used(), 2000 + 900);
  assert.equal(await countReservations(store), 0);
  await a.close();
  kv.close();
});

Deno.test("a plan with a spend rule gets no lease: every request is counted at its own price", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const plan = limitPlan("t1", "k1", { ...UNLIMITED, rpm: 100_000 }, null, {
    tenant: { tokens: null, money: 1e12 },
  });
  const a = new Admitter(store, { settleDelayMs: 0, reclaimEveryMs: 0 });
  const price = {
    prompt: 10,
    promptPerMillion: 1e6,
    completionPerMillion: 1e6,
  };
  for (let i = 0; i < 50; i++) {
    const r = await a.admit({
      plan,
      tokens: 20,
      minTokens: 20,
      reclaimTokens: 10,
      ttlMs: 60_000,
      price,
    });
    assert.ok(r.ok && r.reservation && !r.reservation.lease);
    await a.settle(r.reservation, 15, 15);
  }
  await a.flush();
  assert.equal(
    await counterValue(store, "t:t1", windowOf("spend", Date.now())[0]),
    50 * 15,
  );
  await a.close();
  kv.close();
});

Deno.test("a token budget is the month's quota when tighter than the limit, and names itself", () => {
  const p = limitPlan("t1", "k1", { ...UNLIMITED, tokensPerMonth: 500 }, null, {
    tenant: { tokens: 400, money: null },
    key: { tokens: 600, money: 7 },
  });
  assert.deepEqual(p.rules, [
    { subject: "t:t1", kind: "month", limit: 400, budget: true },
    { subject: "k:k1", kind: "month", limit: 600, budget: true },
    { subject: "k:k1", kind: "spend", limit: 7, budget: true },
  ]);
  const q = limitPlan("t1", "k1", { ...UNLIMITED, tokensPerMonth: 300 }, null, {
    tenant: { tokens: 400, money: null },
  });
  assert.deepEqual(q.rules, [{ subject: "t:t1", kind: "month", limit: 300 }]);
});
