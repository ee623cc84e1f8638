import assert from "node:assert/strict";
import { createStore } from "./store.ts";
import { usageRecord } from "./_usage_testing.ts";
import {
  bucketOf,
  listUsageRecords,
  percentile,
  usageSeries,
  usageTotals,
} from "./usage.ts";
import { UsageRollups, writeUsage } from "./usage_rollups.ts";
import { k } from "./kv_keys.ts";
import { nodeBusyMonth, tenantMonthTotals } from "./usage_month.ts";

const rec = usageRecord;

/** One record for each of `n` tenants (`t0`, `t1`, …). */
const oneEach = (n: number) =>
  Array.from({ length: n }, (_, i) => rec({ tenantId: `t${i}` }));

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

Deno.test("a tenant's records written together share values; listUsageRecords() pages through them newest first, each once", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const acc = new UsageRollups();
  // The longest model name, in two-byte characters: values still fit.
  const model = "模".repeat(256);
  const id = (i: number) => `r${String(i).padStart(3, "0")}`;
  await acc.write(
    store,
    Array.from({ length: 100 }, (_, i) => rec({ id: id(i), model })),
  );
  await acc.write(store, [rec({ id: id(100) }), rec({ id: id(101) })]);
  await acc.write(store, [rec({ id: "other", tenantId: "tb" })]);
  // An earlier version wrote one record per value.
  await kv.set(k.usageRecord("ta", "q000"), rec({ id: "q000" }));
  let values = 0;
  for await (const _ of kv.list({ prefix: k.usageRecordPrefix("ta") })) {
    values++;
  }
  assert.equal(values, 5, "48 + 48 + 4, 2, and the old one");
  const all = ["q000", ...Array.from({ length: 102 }, (_, i) => id(i))];
  for (const reverse of [true, false]) {
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const page = await listUsageRecords(store, "ta", {
        limit: 7,
        cursor,
        reverse,
      });
      assert.ok(page.items.length <= 7);
      seen.push(...page.items.map((r) => r.id));
      cursor = page.cursor;
    } while (cursor);
    assert.deepEqual(seen, reverse ? all.toReversed() : all);
  }
  await assert.rejects(
    listUsageRecords(store, "ta", { cursor: "x-" }),
    /cursor is invalid/,
  );
  await assert.rejects(
    listUsageRecords(store, "ta", { cursor: "3-a.b" }),
    /cursor is invalid/,
  );
  kv.close();
});

Deno.test("percentile() returns the bucket bound holding the quantile", () => {
  assert.equal(percentile([0, 0, 0], 0.5), null);
  assert.equal(percentile([1, 1, 0, 2], 0.5), 50);
  assert.equal(percentile([1, 1, 0, 2], 0.99), 250);
});

const HOURS = {
  granularity: "hour" as const,
  from: Date.parse("2026-11-22T10:00Z"),
  to: Date.parse("2026-11-22T10:00Z"),
};

Deno.test("rollups are one value per group and writer; two gateways' writers both count", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const now = Date.now();
  const at = new Date(now).toISOString();
  const month = at.slice(0, 7);
  const a = new UsageRollups();
  const b = new UsageRollups();
  await a.write(store, [rec({ at }), rec({ at })]);
  await b.write(store, [rec({ at })]);
  await a.write(store, [rec({ at, promptTokens: 1 })]);
  const q = { granularity: "hour" as const, from: now, to: now };
  const t = await usageTotals(store, { ...q, tenantId: "ta" });
  assert.equal(t.requests, 4);
  assert.equal(t.promptTokens, 31);
  let shards = 0;
  const prefix = k.usageRollupPrefix("hour", "tenant", "ta");
  for await (const _ of kv.list({ prefix })) shards++;
  assert.equal(shards, 2, "one shard per writer, rewritten in place");
  assert.deepEqual(await tenantMonthTotals(store, month), [{
    tenantId: "ta",
    requests: 4,
    tokens: 4 * 15 - 9,
    errors: 0,
  }]);
  const [busy] = await nodeBusyMonth(store, "ta", month);
  assert.deepEqual(busy, {
    nodeId: "n1",
    busyMs: 480,
    tokens: 51,
    tenantBusyMs: 480,
    tenantTokens: 51,
  });
  kv.close();
});

Deno.test("a write that failed leaves its records and rollups waiting; the next writes each once", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const acc = new UsageRollups();
  await acc.write(store, [rec({})]);
  const atomic = kv.atomic.bind(kv);
  let fail = true;
  kv.atomic = () => {
    const op = atomic();
    const commit = op.commit.bind(op);
    op.commit = () => {
      if (fail) {
        fail = false;
        return Promise.reject(new Error("KV went away"));
      }
      return commit();
    };
    return op;
  };
  const batch = [rec({}), rec({ tenantId: "tb" })];
  await assert.rejects(acc.write(store, batch), /KV went away/);
  assert.equal(acc.waitingRecords, 2);
  await acc.writeDue(store);
  assert.equal(acc.pending, 0);
  assert.equal(
    (await usageTotals(store, { ...HOURS, tenantId: "ta" })).requests,
    2,
  );
  assert.equal((await usageTotals(store, HOURS)).requests, 3);
  assert.equal((await listUsageRecords(store, "ta")).items.length, 2);
  assert.equal((await listUsageRecords(store, "tb")).items.length, 1);
  kv.close();
});

Deno.test("late records of a group no longer in memory start a new shard; legacy counters still count", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const acc = new UsageRollups();
  const shards = async (g: "hour" | "day") => {
    let n = 0;
    const prefix = k.usageRollupPrefix(g, "tenant", "ta");
    for await (const _ of kv.list({ prefix })) n++;
    return n;
  };
  // 2026-11-22T10: an hour closed long ago leaves memory at once, its day
  // only two days after it ends.
  await acc.write(store, [rec({})]);
  await acc.write(store, [rec({})]);
  const dayOpen = Date.now() < Date.parse("2026-11-25T00:00Z");
  assert.equal(await shards("hour"), 2);
  assert.equal(await shards("day"), dayOpen ? 1 : 2);
  // An earlier version wrote one KvU64 per field.
  await kv.set(
    k.usageRollup("hour", "tenant", "ta", "2026-11-22T10", "requests"),
    new Deno.KvU64(5n),
  );
  const t = await usageTotals(store, { ...HOURS, tenantId: "ta" });
  assert.equal(t.requests, 7);
  assert.equal(t.promptTokens, 20);
  kv.close();
});

/** Fails the `nth` commit of `kv` (1-based), once. */
function failCommit(kv: Deno.Kv, nth: number): void {
  const atomic = kv.atomic.bind(kv);
  let commits = 0;
  kv.atomic = () => {
    const op = atomic();
    const commit = op.commit.bind(op);
    op.commit = () =>
      ++commits === nth ? Promise.reject(new Error("KV went away")) : commit();
    return op;
  };
}

/** How many shards a tenant's hour rollup has. */
async function tenantShards(kv: Deno.Kv, tenantId: string): Promise<number> {
  let n = 0;
  const prefix = k.usageRollupPrefix("hour", "tenant", tenantId);
  for await (const _ of kv.list({ prefix })) n++;
  return n;
}

Deno.test("a write failing part way leaves whole tenants waiting: each tenant's records and totals land together or not at all, and the retry writes each once", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const acc = new UsageRollups();
  // 200 tenants, ~4 a commit (records, mark and own groups each): the
  // 5th commit fails.
  failCommit(kv, 5);
  await assert.rejects(acc.write(store, oneEach(200)), /KV went away/);
  let landed = 0;
  for (let i = 0; i < 200; i++) {
    const records = (await listUsageRecords(store, `t${i}`)).items.length;
    const totals = await usageTotals(store, { ...HOURS, tenantId: `t${i}` });
    const month = await tenantMonthTotals(store, "2026-11");
    const billed = month.find((m) => m.tenantId === `t${i}`)?.requests ?? 0;
    assert.deepEqual([totals.requests, billed], [records, records], `t${i}`);
    landed += records;
  }
  assert.ok(landed > 0 && landed < 200, `${landed} landed before the failure`);
  assert.equal(acc.waitingRecords, 200 - landed);
  await acc.writeDue(store);
  assert.equal(acc.pending, 0);
  let requests = 0;
  for (let i = 0; i < 200; i++) {
    requests += (await usageTotals(store, { ...HOURS, tenantId: `t${i}` }))
      .requests;
    assert.equal(await tenantShards(kv, `t${i}`), 1, "the retry reuses shards");
    assert.equal((await listUsageRecords(store, `t${i}`)).items.length, 1);
  }
  assert.equal(requests, 200);
  assert.equal((await usageTotals(store, HOURS)).requests, 200);
  kv.close();
});

Deno.test("UsageRollups writes groups and records that came together over the second half of their delay, each once", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const acc = new UsageRollups();
  const batch = oneEach(200);
  const t0 = Date.now();
  acc.add(batch, 1000);
  const dirty = acc.pending;
  assert.ok(acc.nextDue >= t0 + 500 && acc.nextDue <= t0 + 1100);
  await acc.writeDue(store, t0 + 490);
  assert.equal(acc.pending, dirty, "none is due before half the delay");
  await acc.writeDue(store, t0 + 750);
  assert.ok(
    acc.pending > dirty * 0.2 && acc.pending < dirty * 0.8,
    `${acc.pending} of ${dirty} left: the writes spread`,
  );
  assert.ok(acc.nextDue > t0 + 750);
  await acc.writeDue(store, Date.now() + 1000);
  assert.equal(acc.pending, 0);
  assert.equal(acc.nextDue, Infinity);
  assert.equal((await usageTotals(store, HOURS)).requests, 200);
  assert.equal(await tenantShards(kv, "t7"), 1);
  kv.close();
});

Deno.test("writeDue() writes about `max` values, whole tenants waiting longest first, then shared groups", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const acc = new UsageRollups();
  acc.add([rec({ tenantId: "t0" })]);
  acc.add(oneEach(3).slice(1)); // t1, t2
  const tenant = async (t: string) =>
    (await usageTotals(store, { ...HOURS, tenantId: t })).requests;
  const records = async (t: string) =>
    (await listUsageRecords(store, t)).items.length;
  // t0's batch whole (its record, mark and own groups), though max is 1.
  const n = await acc.writeDue(store, Infinity, 1);
  assert.equal(
    n,
    18,
    "record value, its 4 request log index entries (key, model, node, status class), mark, key's last use, 8 hour and day groups (tenant, key, tenant × model, key × model), 3 month groups",
  );
  assert.equal(acc.waitingRecords, 2);
  assert.deepEqual([await records("t0"), await tenant("t0")], [1, 1]);
  assert.deepEqual([await records("t1"), await tenant("t1")], [0, 0]);
  await acc.writeDue(store, Infinity, 18 + 1);
  assert.equal(acc.waitingRecords, 0, "then t1's and t2's");
  assert.equal((await usageTotals(store, HOURS)).requests, 0, "shared: last");
  await acc.writeDue(store);
  assert.equal(acc.pending, 0);
  assert.equal((await usageTotals(store, HOURS)).requests, 3);
  kv.close();
});

Deno.test("concurrent writeUsage() calls: rollups equal the sum of the records", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const records = Array.from({ length: 300 }, (_, i) =>
    rec({
      at: `2026-11-22T${10 + (i % 3)}:${String(i % 60).padStart(2, "0")}:00Z`,
      tenantId: `t${i % 7}`,
      keyId: `k${i % 2}`,
      model: `m${i % 3}`,
      promptTokens: i,
      completionTokens: i % 11,
      latencyMs: (i * 37) % 4000,
      ttftMs: i % 5 === 0 ? null : i,
      status: i % 13 === 0 ? 429 : 200,
      outcome: i % 13 === 0 ? "error" : "ok",
    }));
  const writes = [];
  for (let i = 0; i < records.length; i += 37) {
    writes.push(writeUsage(store, records.slice(i, i + 37)));
  }
  await Promise.all(writes);
  const q = { ...HOURS, to: Date.parse("2026-11-22T12:00Z") };
  for (const tenantId of ["t0", "t3", "t6"]) {
    const mine = records.filter((r) => r.tenantId === tenantId);
    const t = await usageTotals(store, { ...q, tenantId });
    assert.equal(t.requests, mine.length);
    assert.equal(t.promptTokens, mine.reduce((a, r) => a + r.promptTokens, 0));
    assert.equal(
      t.completionTokens,
      mine.reduce((a, r) => a + r.completionTokens, 0),
    );
    assert.equal(t.latencyMsSum, mine.reduce((a, r) => a + r.latencyMs, 0));
    assert.equal(t.ttftCount, mine.filter((r) => r.ttftMs !== null).length);
    assert.equal(t.errors, mine.filter((r) => r.outcome !== "ok").length);
    assert.equal(t.limited, mine.filter((r) => r.status === 429).length);
    assert.equal(t.latencyHistogram.reduce((a, b) => a + b), mine.length);
  }
  const day = await usageTotals(store, { ...q, granularity: "day" });
  assert.equal(day.requests, 300);
  const byKey = await usageTotals(store, { ...q, tenantId: "t1", keyId: "k1" });
  assert.equal(
    byKey.requests,
    records.filter((r) => r.tenantId === "t1" && r.keyId === "k1").length,
  );
  const months = await tenantMonthTotals(store, "2026-11");
  assert.equal(months.reduce((a, t) => a + t.requests, 0), 300);
  kv.close();
});

Deno.test("UsageRollups keeps at most maxGroups in memory; a group recreated later gets a new shard", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const acc = new UsageRollups({ maxGroups: 20 });
  const at = new Date().toISOString();
  for (let i = 0; i < 10; i++) {
    await acc.write(store, [rec({ at, tenantId: `t${i}` })]);
    assert.ok(acc.size <= 20);
  }
  await acc.write(store, [rec({ at, tenantId: "t0" })]);
  assert.equal(await tenantShards(kv, "t0"), 2, "t0's first shard is kept");
  const now = Date.now();
  const q = { granularity: "hour" as const, from: now, to: now };
  assert.equal(
    (await usageTotals(store, { ...q, tenantId: "t0" })).requests,
    2,
  );
  assert.equal((await usageTotals(store, q)).requests, 11);
  assert.throws(() => new UsageRollups({ maxGroups: 0 }), /maxGroups/);
  kv.close();
});

Deno.test("a key's last use is written with its records, at most once a minute", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const acc = new UsageRollups();
  await acc.write(store, [
    rec({ at: "2026-11-22T10:15:00.000Z" }),
    rec({ at: "2026-11-22T10:16:00.000Z" }),
    rec({ keyId: "kb", at: "2026-11-22T10:14:00.000Z" }),
  ]);
  const lastUsed = async (id: string) =>
    (await kv.get<string>(k.apiKeyLastUsed(id))).value;
  assert.equal(await lastUsed("ka"), "2026-11-22T10:16:00.000Z");
  assert.equal(await lastUsed("kb"), "2026-11-22T10:14:00.000Z");
  await acc.write(store, [rec({ at: "2026-11-22T10:17:00.000Z" })]);
  assert.equal(
    await lastUsed("ka"),
    "2026-11-22T10:16:00.000Z",
    "not again within the minute",
  );
  kv.close();
});
