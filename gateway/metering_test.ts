import * as assert from "node:assert/strict";
import { createStore, type Store } from "../store/store.ts";
import { listUsageRecords, usageTotals } from "../store/usage.ts";
import { rollupsOf } from "../store/usage_rollups.ts";
import { usageRecord } from "../store/_usage_testing.ts";
import { silentLogger } from "../lib/log.ts";
import { UsageWriter } from "./metering.ts";

const now = () => {
  const t = Date.now();
  return {
    at: new Date(t).toISOString(),
    q: { granularity: "hour" as const, from: t, to: t },
  };
};

/** A writer on a fresh in-memory store. */
async function writer(
  rollupMs: number,
  opts: { maxQueue?: number; maxWritesPerSecond?: number } = {},
) {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const w = new UsageWriter(store, silentLogger, { rollupMs, ...opts });
  return { kv, store, w };
}

/** How many records a tenant has in KV. */
async function records(store: Store, tenantId: string): Promise<number> {
  return (await listUsageRecords(store, tenantId)).items.length;
}

async function waitFor(cond: () => Promise<boolean>, ms = 2000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 5));
  }
}

Deno.test("UsageWriter writes records and their rollups after half to all of rollupMs", async () => {
  const { kv, store, w } = await writer(300);
  const { at, q } = now();
  const t0 = Date.now();
  for (let i = 0; i < 5; i++) w.add(usageRecord({ at, tenantId: "ta" }));
  // Folded at once; written later, together.
  assert.equal(rollupsOf(store).waitingRecords, 5);
  assert.equal(await records(store, "ta"), 0);
  await waitFor(async () => (await records(store, "ta")) === 5);
  assert.ok(Date.now() - t0 >= 150, "records were held half of rollupMs");
  await waitFor(async () =>
    (await usageTotals(store, { ...q, tenantId: "ta" })).requests === 5
  );
  await waitFor(() => Promise.resolve(rollupsOf(store).pending === 0));
  assert.ok(Date.now() - t0 < 1000);
  let values = 0;
  for await (const _ of kv.list({ prefix: ["usage", "ta"] })) values++;
  assert.equal(values, 1, "the tenant's records share one value");
  // flush() writes both at once.
  w.add(usageRecord({ at, tenantId: "ta" }));
  await w.flush();
  assert.equal(
    (await usageTotals(store, { ...q, tenantId: "ta" })).requests,
    6,
  );
  assert.equal(await records(store, "ta"), 6);
  kv.close();
});

Deno.test("UsageWriter keeps records and rollups whose write failed and writes them once KV is back", async () => {
  const { kv, store, w } = await writer(60_000);
  const { at, q } = now();
  w.add(usageRecord({ at, tenantId: "ta" }));
  w.add(usageRecord({ at, tenantId: "tb" }));
  const atomic = kv.atomic.bind(kv);
  kv.atomic = () => {
    const op = atomic();
    op.commit = () => Promise.reject(new Error("KV went away"));
    return op;
  };
  await w.flush(); // fails: nothing lost, nothing dropped
  assert.equal(w.dropped, 0);
  assert.ok(rollupsOf(store).pending > 0);
  kv.atomic = atomic;
  await w.flush();
  assert.equal(rollupsOf(store).pending, 0);
  assert.equal((await usageTotals(store, q)).requests, 2);
  assert.equal(
    (await usageTotals(store, { ...q, tenantId: "ta" })).requests,
    1,
  );
  assert.equal(await records(store, "ta"), 1);
  assert.equal(await records(store, "tb"), 1);
  kv.close();
});

Deno.test("UsageWriter drops and counts records past maxQueue waiting", async () => {
  const { kv, store, w } = await writer(60_000, { maxQueue: 3 });
  const { at } = now();
  for (let i = 0; i < 5; i++) w.add(usageRecord({ at, tenantId: "ta" }));
  assert.equal(w.dropped, 2);
  assert.equal(rollupsOf(store).waitingRecords, 3);
  await w.flush();
  assert.equal(await records(store, "ta"), 3);
  w.add(usageRecord({ at, tenantId: "ta" }));
  assert.equal(w.dropped, 2, "room again once written");
  await w.flush();
  kv.close();
});

Deno.test("UsageWriter writes at most maxWritesPerSecond values a second when more are due, and all in the end", async () => {
  // A tick every 100 ms, 5 values each (50 a second).
  const { kv, store, w } = await writer(400, { maxWritesPerSecond: 50 });
  const { at, q } = now();
  for (let i = 0; i < 10; i++) {
    w.add(usageRecord({ at, tenantId: `t${i}`, keyId: `k${i}` }));
  }
  const acc = rollupsOf(store);
  const waiting = acc.pending; // 10 tenants' records and ~9 groups each
  let sets = 0;
  const atomic = kv.atomic.bind(kv);
  kv.atomic = () => {
    const op = atomic();
    const set = op.set.bind(op);
    op.set = (...a) => {
      sets++;
      return set(...a);
    };
    return op;
  };
  const t0 = Date.now();
  await waitFor(() => Promise.resolve(acc.pending === 0), 10_000);
  const seconds = (Date.now() - t0) / 1000;
  assert.ok(sets >= waiting, `${sets} sets for ${waiting} values`);
  assert.ok(
    sets <= 50 * seconds + 5,
    `${sets} sets in ${seconds.toFixed(1)} s: over budget`,
  );
  assert.ok(seconds >= waiting / 50 - 1, "spread over several ticks");
  assert.equal((await usageTotals(store, q)).requests, 10);
  kv.close();
});
