import assert from "node:assert/strict";
import { createStore, type Store } from "./store.ts";
import { usageRecord } from "./_usage_testing.ts";
import { keyModelUse } from "./spend.ts";
import { listUsageRecords, usageTotals } from "./usage.ts";
import { tenantMonthTotals } from "./usage_month.ts";
import { UsageRollups } from "./usage_rollups.ts";
import { journalDirs, readJournal, UsageJournal } from "./usage_journal.ts";

const HOURS = {
  granularity: "hour" as const,
  from: Date.parse("2026-11-22T00:00Z"),
  to: Date.parse("2026-11-22T23:00Z"),
};

/** 300 records over 6 tenants, 3 keys, 2 models and 2 nodes. */
function traffic() {
  return Array.from({ length: 300 }, (_, i) =>
    usageRecord({
      id: `r${String(i).padStart(4, "0")}`,
      tenantId: `t${i % 6}`,
      keyId: `k${i % 3}`,
      model: `m${i % 2}`,
      nodeId: `n${i % 4 < 2 ? 1 : 2}`,
      promptTokens: i,
    }));
}

/** Every view of the usage: per tenant, key, model, overall, records and the month statement. */
async function views(store: Store) {
  const out: Record<string, number> = {};
  const month = await tenantMonthTotals(store, "2026-11");
  for (let t = 0; t < 6; t++) {
    const tenantId = `t${t}`;
    const q = { ...HOURS, tenantId };
    out[`${tenantId}`] = (await usageTotals(store, q)).requests;
    out[`${tenantId}.prompt`] = (await usageTotals(store, q)).promptTokens;
    for (let k = 0; k < 3; k++) {
      out[`${tenantId}.k${k}`] =
        (await usageTotals(store, { ...q, keyId: `k${k}` })).requests;
    }
    for (let m = 0; m < 2; m++) {
      out[`${tenantId}.m${m}`] =
        (await usageTotals(store, { ...q, model: `m${m}` })).requests;
    }
    const ids = (await listUsageRecords(store, tenantId, { limit: 100 })).items
      .map((r) => r.id);
    out[`${tenantId}.records`] = ids.length;
    out[`${tenantId}.unique`] = new Set(ids).size;
    out[`${tenantId}.billed`] = month.find((m) =>
      m.tenantId === tenantId
    )?.requests ?? 0;
    // per key and model (what spend per key is priced from)
    let perKey = 0;
    const uses = await keyModelUse(
      store,
      tenantId,
      "hour",
      HOURS.from,
      HOURS.to,
    );
    for (const models of uses.values()) {
      for (const u of models.values()) perKey += u.requests;
    }
    out[`${tenantId}.keyModel`] = perKey;
  }
  for (let m = 0; m < 2; m++) {
    out[`m${m}`] =
      (await usageTotals(store, { ...HOURS, model: `m${m}` })).requests;
  }
  out.all = (await usageTotals(store, HOURS)).requests;
  return out;
}

/** Fails every commit after the first `n` (KV gone, then the process killed). */
function failAfter(kv: Deno.Kv, n: number): void {
  const atomic = kv.atomic.bind(kv);
  let commits = 0;
  kv.atomic = () => {
    const op = atomic();
    const commit = op.commit.bind(op);
    op.commit = () =>
      ++commits > n ? Promise.reject(new Error("killed")) : commit();
    return op;
  };
}

Deno.test("a journal replayed after a crash at any point of the writes leaves every view exact, and replaying again adds nothing", async () => {
  const dir = await Deno.makeTempDir();
  try {
    // The same traffic written by a writer that dies after 0, 1, 3, 8 or
    // all of its commits.
    let expected: Record<string, number> | null = null;
    for (const commits of [0, 1, 3, 8, Infinity]) {
      const kv = await Deno.openKv(":memory:");
      const store = await createStore(kv);
      const acc = new UsageRollups();
      const journal = await UsageJournal.open(`${dir}/${commits}`);
      acc.attachJournal(journal);
      const records = traffic();
      // Due 500 to 1000 ms after they came: none yet, however slow add() is.
      const added = Date.now();
      acc.add(records.slice(0, 150), 1000);
      await acc.writeDue(store, added + 499, 40).catch(() => {});
      acc.add(records.slice(150), 1000);
      failAfter(kv, commits);
      await acc.writeDue(store).catch(() => {});
      journal.flush(); // what a kill -9 leaves: the lines in the file
      const { entries, skipped } = await readJournal(journal.dir);
      assert.equal(skipped, 0);
      // The restarted gateway's KV works.
      delete (kv as { atomic?: unknown }).atomic;
      const missing = await UsageRollups.replay(store, acc.writer, entries);
      if (commits === 0) assert.equal(missing, 300);
      if (commits === Infinity) assert.equal(missing, 0);
      const after = await views(store);
      expected ??= after;
      assert.deepEqual(after, expected, `crash after ${commits} commits`);
      assert.equal(after.all, 300);
      assert.equal(after["t0.records"], 50);
      assert.equal(after["t0.unique"], 50);
      assert.equal(after["t0.billed"], 50);
      assert.equal(after["t0.k0"]! + after["t0.k1"]! + after["t0.k2"]!, 50);
      assert.equal(after["t0.keyModel"], 50);
      assert.equal(await UsageRollups.replay(store, acc.writer, entries), 0);
      assert.deepEqual(await views(store), expected, "replayed twice");
      kv.close();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the journal keeps files until their records are in KV, skips a line cut short, and leaves nothing after a clean close", async () => {
  const root = await Deno.makeTempDir();
  try {
    const kv = await Deno.openKv(":memory:");
    const store = await createStore(kv);
    const acc = new UsageRollups();
    const journal = await UsageJournal.open(`${root}/inst/${acc.writer}`, {
      segmentMs: 0,
    });
    acc.attachJournal(journal);
    acc.add(traffic().slice(0, 10), 60_000);
    journal.flush();
    acc.add(traffic().slice(10, 20), 60_000);
    journal.flush();
    assert.equal(journal.files, 2);
    assert.equal(acc.writtenUpTo(), 0);
    // A line cut short by a kill, after the last full one.
    const [last] = [...Deno.readDirSync(journal.dir)].map((e) => e.name)
      .sort((a, b) => parseInt(b) - parseInt(a));
    await Deno.writeTextFile(`${journal.dir}/${last}`, '21\t{"id":"cut', {
      append: true,
    });
    const read = await readJournal(journal.dir);
    assert.equal(read.entries.length, 20);
    assert.deepEqual(read.entries.map((e) => e.seq).slice(0, 3), [1, 2, 3]);
    assert.equal(read.skipped, 1);
    assert.deepEqual(await journalDirs(root), [{
      instance: "inst",
      writer: acc.writer,
      dir: journal.dir,
    }]);
    await acc.writeDue(store);
    assert.equal(acc.writtenUpTo(), 20);
    assert.equal(journal.files, 0, "all in KV: pruned");
    acc.add(traffic().slice(20, 21));
    await acc.writeDue(store);
    await journal.close(acc.writtenUpTo());
    assert.deepEqual(await journalDirs(root), []);
    kv.close();
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
