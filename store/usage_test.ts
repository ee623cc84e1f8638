import assert from "node:assert/strict";
import { createStore } from "./store.ts";
import {
  bucketOf,
  listUsageRecords,
  percentile,
  type UsageRecord,
  usageSeries,
  usageTotals,
  writeUsage,
} from "./usage.ts";

const rec = (over: Partial<UsageRecord>): UsageRecord => ({
  id: crypto.randomUUID(),
  at: "2026-11-22T10:15:00.000Z",
  requestId: "r",
  tenantId: "ta",
  keyId: "ka",
  model: "m1",
  nodeId: "n1",
  endpoint: "chat",
  promptTokens: 10,
  completionTokens: 5,
  latencyMs: 120,
  ttftMs: 40,
  status: 200,
  outcome: "ok",
  ...over,
});

Deno.test("writeUsage() rolls records up per tenant, key, model and hour; usageSeries() reads them", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  await writeUsage(store, [
    rec({}),
    rec({ latencyMs: 3000, outcome: "error" }),
    rec({ at: "2026-11-22T12:01:00.000Z", keyId: "kb", model: "m2" }),
    rec({ tenantId: "tb" }),
  ]);
  const q = {
    granularity: "hour" as const,
    from: Date.parse("2026-11-22T10:00Z"),
    to: Date.parse("2026-11-22T12:00Z"),
  };
  const s = await usageSeries(store, { ...q, tenantId: "ta" });
  assert.equal(s.length, 3);
  assert.deepEqual(s.map((p) => p.requests), [2, 0, 1]);
  assert.equal(s[0]!.errors, 1);
  assert.equal(s[0]!.promptTokens, 20);
  assert.equal(s[0]!.latencyHistogram[bucketOf(3000)], 1);
  const byKey = await usageTotals(store, { ...q, tenantId: "ta", keyId: "kb" });
  assert.equal(byKey.requests, 1);
  const byModel = await usageTotals(store, {
    ...q,
    tenantId: "ta",
    model: "m1",
  });
  assert.equal(byModel.requests, 2);
  const all = await usageTotals(store, { ...q, granularity: "day" });
  assert.equal(all.requests, 4);
  assert.equal(all.ttftP50Ms, 50);
  const other = await usageTotals(store, { ...q, tenantId: "tb" });
  assert.equal(other.requests, 1, "tenants are isolated");
  const page = await listUsageRecords(store, "ta");
  assert.equal(page.items.length, 3);
  kv.close();
});

Deno.test("percentile() returns the bucket bound holding the quantile", () => {
  assert.equal(percentile([0, 0, 0], 0.5), null);
  assert.equal(percentile([1, 1, 0, 2], 0.5), 50);
  assert.equal(percentile([1, 1, 0, 2], 0.99), 250);
});
