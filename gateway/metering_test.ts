import * as assert from "node:assert/strict";
import { createStore, type Store } from "../store/store.ts";
import { listUsageRecords, rollupsOf, usageTotals } from "../store/usage.ts";
import { usageRecord } from "../store/_usage_testing.ts";
import { silentLogger } from "./logger.ts";
import { UsageWriter } from "./metering.ts";

const now = () => {
  const t = Date.now();
  return {
    at: new Date(t).toISOString(),
    q: { granularity: "hour" as const, from: t, to: t },
  };
};

/** A writer on a fresh in-memory store, flushing records every 10 ms. */
async function writer(rollupMs: number) {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const w = new UsageWriter(store, silentLogger, { flushMs: 10, rollupMs });
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

Deno.test("UsageWriter writes records within flushMs and their rollups within rollupMs", async () => {
  const { kv, store, w } = await writer(300);
  const { at, q } = now();
  const t0 = Date.now();
  for (let i = 0; i < 5; i++) w.add(usageRecord({ at, tenantId: "ta" }));
  await waitFor(async () => (await records(store, "ta")) === 5);
  // Records are in KV; the rollups wait in memory, once per group.
  assert.equal(
    (await usageTotals(store, { ...q, tenantId: "ta" })).requests,
    0,
  );
  assert.ok(rollupsOf(store).pending > 0);
  await waitFor(async () =>
    (await usageTotals(store, { ...q, tenantId: "ta" })).requests === 5
  );
  assert.ok(Date.now() - t0 >= 150, "rollups were held half of rollupMs");
  // Each group is written after half to all of rollupMs.
  await waitFor(() => Promise.resolve(rollupsOf(store).pending === 0));
  assert.ok(Date.now() - t0 < 1000);
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

Deno.test("UsageWriter keeps rollups whose write failed and writes them once KV is back", async () => {
  const { kv, store, w } = await writer(60_000);
  const { at, q } = now();
  w.add(usageRecord({ at, tenantId: "ta" }));
  w.add(usageRecord({ at, tenantId: "tb" }));
  await waitFor(async () => (await records(store, "tb")) === 1);
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
  kv.close();
});

Deno.test("UsageWriter writes new records within flushMs while rollups wait for rollupMs", async () => {
  const { kv, store, w } = await writer(60_000);
  const { at } = now();
  w.add(usageRecord({ at, tenantId: "ta" }));
  await waitFor(async () => (await records(store, "ta")) === 1);
  assert.ok(rollupsOf(store).pending > 0, "rollups wait");
  const t0 = Date.now();
  w.add(usageRecord({ at, tenantId: "ta" }));
  await waitFor(async () => (await records(store, "ta")) === 2);
  assert.ok(Date.now() - t0 < 1000, "not held back by the rollup timer");
  await w.flush();
  kv.close();
});
