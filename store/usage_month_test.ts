import assert from "node:assert/strict";
import { k } from "./kv_keys.ts";
import { createStore } from "./store.ts";
import { usageRecord } from "./_usage_testing.ts";
import type { UsageRecord } from "./usage.ts";
import { UsageRollups } from "./usage_rollups.ts";
import {
  monthOf,
  nodeBusyMonth,
  tenantModelMonth,
  tenantMonthTotals,
} from "./usage_month.ts";

const rec = (over: Partial<UsageRecord> = {}) =>
  usageRecord({ latencyMs: 100, ...over });

Deno.test("month readers sum every writer's shards and legacy KvU64 counters", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const month = "2026-11";
  assert.equal(monthOf(Date.parse("2026-11-22T10:15Z")), month);
  await new UsageRollups().write(store, [
    rec({}),
    rec({ model: "m2", nodeId: "n2", outcome: "error" }),
    rec({ tenantId: "tb" }),
  ]);
  await new UsageRollups().write(store, [rec({})]);
  // An earlier version wrote one KvU64 per field.
  const legacy =
    (dim: Parameters<typeof k.usageMonth>[1], s: string) =>
    (field: string, n: number) =>
      kv.set(k.usageMonth(month, dim, s, field), new Deno.KvU64(BigInt(n)));
  await legacy("tenant", "ta")("requests", 3);
  await legacy("tenant", "ta")("tokens", 300);
  await legacy("tenant_model", "ta/m1")("prompt", 200);
  await legacy("node", "n1")("busy_ms", 1000);
  await legacy("node_tenant", "n1/ta")("busy_ms", 700);

  const totals = await tenantMonthTotals(store, month);
  totals.sort((a, b) => a.tenantId.localeCompare(b.tenantId));
  assert.deepEqual(totals, [
    { tenantId: "ta", requests: 6, tokens: 345, errors: 1 },
    { tenantId: "tb", requests: 1, tokens: 15, errors: 0 },
  ]);
  assert.deepEqual(await tenantModelMonth(store, "ta", month), [
    { model: "m1", requests: 2, prompt: 220, completion: 10 },
    { model: "m2", requests: 1, prompt: 10, completion: 5 },
  ]);
  const busy = await nodeBusyMonth(store, "ta", month);
  busy.sort((a, b) => a.nodeId.localeCompare(b.nodeId));
  assert.deepEqual(busy, [
    {
      nodeId: "n1",
      busyMs: 1300,
      tokens: 45,
      tenantBusyMs: 900,
      tenantTokens: 30,
    },
    {
      nodeId: "n2",
      busyMs: 100,
      tokens: 15,
      tenantBusyMs: 100,
      tenantTokens: 15,
    },
  ]);
  assert.deepEqual(await tenantModelMonth(store, "tc", month), []);
  kv.close();
});
