import assert from "node:assert/strict";
import { NotFoundError, ValidationError } from "./errors.ts";
import { newIdAt } from "./ids.ts";
import { type Principal, SYSTEM } from "./principal.ts";
import {
  getRequestLogSettings,
  listRequestLog,
  MAX_VALUES_PER_PAGE,
  parseRequestLogQuery,
  type RequestLogFilter,
  requestLogRetentionMs,
  setRequestLogSettings,
} from "./request_log.ts";
import { createStore } from "./store.ts";
import type { Store } from "./store.ts";
import { RECORDS_PER_VALUE, type UsageRecord, usageTotals } from "./usage.ts";
import { UsageRollups, writeUsage } from "./usage_rollups.ts";

const KEYS = ["ka", "kb", "kc"];
const MODELS = ["m1", "m2"];
const NODES = ["n1", "n2", null];
const STATUSES = [200, 200, 200, 429, 400, 502];

/** Record `i` of tenant `t`, `i` seconds after `t0`: every key, model, node and status mixed. */
function rec(t: string, i: number, t0: number): UsageRecord {
  const status = STATUSES[i % STATUSES.length]!;
  return {
    id: newIdAt(t0 + i * 1000),
    at: new Date(t0 + i * 1000).toISOString(),
    requestId: `req-${t}-${i}`,
    tenantId: t,
    keyId: KEYS[i % 3]!,
    model: MODELS[i % 2]!,
    nodeId: NODES[i % 3]!,
    endpoint: "chat",
    promptTokens: i,
    completionTokens: 1,
    latencyMs: 10,
    ttftMs: 5,
    status,
    outcome: status === 200 ? "ok" : "error",
    ...(status === 200 ? {} : {
      errorCode: status === 429 ? "rate_limit_exceeded" : "x",
      errorType: "t",
    }),
  };
}

function classOf(s: number): string {
  return s >= 500 ? "5xx" : s >= 400 ? "4xx" : "2xx";
}

/** Every page of a filter, checking each record comes once. */
async function all(
  store: Store,
  p: Principal,
  t: string,
  f: RequestLogFilter,
): Promise<UsageRecord[]> {
  const out: UsageRecord[] = [];
  let cursor: string | null = null;
  for (let n = 0; n < 1000; n++) {
    const page = await listRequestLog(store, p, t, { ...f, cursor });
    out.push(...page.items);
    cursor = page.cursor;
    if (!cursor) break;
  }
  assert.equal(new Set(out.map((r) => r.id)).size, out.length, "each once");
  return out;
}

Deno.test("listRequestLog(): every filter (key, status class, model, node, time) pages through exactly the matching requests, newest first", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const t0 = Date.now() - 3_600_000;
  const records = Array.from({ length: 300 }, (_, i) => rec("ta", i, t0));
  // written in several batches, as a gateway does
  const acc = new UsageRollups();
  for (let i = 0; i < records.length; i += 70) {
    await acc.write(store, records.slice(i, i + 70));
  }
  await writeUsage(store, [rec("tb", 0, t0)]);
  const newestFirst = (rs: UsageRecord[]) =>
    rs.map((r) => r.id).sort().reverse();
  const cases: [RequestLogFilter, (r: UsageRecord) => boolean][] = [
    [{}, () => true],
    [{ keyId: "kb" }, (r) => r.keyId === "kb"],
    [{ status: "5xx" }, (r) => r.status >= 500],
    [{ status: "4xx" }, (r) => classOf(r.status) === "4xx"],
    [{ status: "2xx" }, (r) => r.status === 200],
    [{ model: "m2" }, (r) => r.model === "m2"],
    [{ nodeId: "n1" }, (r) => r.nodeId === "n1"],
    [
      { keyId: "ka", status: "4xx", model: "m1" },
      (r) =>
        r.keyId === "ka" && classOf(r.status) === "4xx" && r.model === "m1",
    ],
    [
      { from: t0 + 100_000, to: t0 + 199_999, nodeId: "n2" },
      (r) =>
        Date.parse(r.at) >= t0 + 100_000 && Date.parse(r.at) <= t0 + 199_999 &&
        r.nodeId === "n2",
    ],
  ];
  for (const [f, want] of cases) {
    for (const limit of [7, 50]) {
      const got = await all(store, SYSTEM, "ta", { ...f, limit });
      assert.deepEqual(
        got.map((r) => r.id),
        newestFirst(records.filter(want)),
        `${JSON.stringify(f)} limit ${limit}`,
      );
    }
  }
  // what the log shows: status, error code, tokens, latency; never another tenant's
  const [first] = (await listRequestLog(store, SYSTEM, "ta", {
    status: "4xx",
    limit: 1,
  })).items;
  assert.equal(
    first!.errorCode,
    classOf(first!.status) === "4xx" && first!.status === 429
      ? "rate_limit_exceeded"
      : "x",
  );
  assert.ok(
    (await all(store, SYSTEM, "ta", {})).every((r) => r.tenantId === "ta"),
  );
  kv.close();
});

Deno.test("listRequestLog(): tenant principals read only their own tenant's log; bad filters and cursors are 400s", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  await writeUsage(store, [rec("tb", 0, Date.now())]);
  const adminA: Principal = {
    kind: "user",
    id: "u",
    label: "u",
    role: "tenant_admin",
    tenantId: "ta",
    ip: null,
  };
  await assert.rejects(listRequestLog(store, adminA, "tb"), NotFoundError);
  assert.equal((await listRequestLog(store, adminA, "ta")).items.length, 0);
  assert.throws(
    () => parseRequestLogQuery({ status: "3xx" }),
    ValidationError,
  );
  assert.throws(
    () => parseRequestLogQuery({ from: "yesterday" }),
    /from must be a date/,
  );
  await assert.rejects(
    listRequestLog(store, SYSTEM, "tb", { cursor: "not a cursor" }),
    ValidationError,
  );
  await assert.rejects(
    listRequestLog(store, SYSTEM, "tb", { from: 2, to: 1 }),
    ValidationError,
  );
  const q = parseRequestLogQuery({
    key: " k1 ",
    status: "5xx",
    from: "2026-01-02",
    to: "2026-01-02T10:30",
  });
  assert.deepEqual([q.keyId, q.status, q.from, q.to], [
    "k1",
    "5xx",
    Date.parse("2026-01-02T00:00:00Z"),
    Date.parse("2026-01-02T10:30:59.999Z"),
  ]);
  kv.close();
});

Deno.test("the request log keeps requests for the usage records' retention (the provider's default: 90 days; within its bounds): older ones are not listed", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  assert.equal((await getRequestLogSettings(store)).retentionDays, 90);
  assert.equal(await requestLogRetentionMs(store, "ta"), 90 * 86_400_000);
  await assert.rejects(
    setRequestLogSettings(store, SYSTEM, { retentionDays: 0 }),
    ValidationError,
  );
  await setRequestLogSettings(store, SYSTEM, { retentionDays: 2 });
  assert.equal(await requestLogRetentionMs(store, "ta"), 2 * 86_400_000);
  const now = Date.now();
  const old = rec("ta", 0, now - 3 * 86_400_000);
  const recent = rec("ta", 1, now - 86_400_000);
  await writeUsage(store, [old]);
  await writeUsage(store, [recent]);
  const listed = await listRequestLog(store, SYSTEM, "ta");
  assert.deepEqual(listed.items.map((r) => r.id), [recent.id]);
  kv.close();
});

Deno.test("a request refused before its model was known is logged, in no rollup", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const r: UsageRecord = {
    ...rec("ta", 4, Date.now()),
    model: "",
    nodeId: null,
    status: 400,
    errorCode: "invalid_json",
    errorType: "invalid_request_error",
  };
  await writeUsage(store, [r]);
  const [got] = (await listRequestLog(store, SYSTEM, "ta", { status: "4xx" }))
    .items;
  assert.equal(got?.errorCode, "invalid_json");
  const totals = await usageTotals(store, {
    tenantId: "ta",
    granularity: "hour",
    from: Date.now() - 3_600_000,
    to: Date.now(),
  });
  assert.equal(totals.requests, 0);
  kv.close();
});

Deno.test("a rare filter over many requests stops after MAX_VALUES_PER_PAGE values with a partial page and a cursor that searches on", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const t0 = Date.now() - 3_600_000;
  const n = (MAX_VALUES_PER_PAGE + 10) * RECORDS_PER_VALUE;
  const acc = new UsageRollups();
  const batch: UsageRecord[] = [];
  for (let i = 0; i < n; i++) {
    const r = rec("ta", i, t0);
    // one in the oldest value is key "rare", and key "ka" is everywhere
    batch.push({ ...r, keyId: i === 3 ? "rare" : "ka", status: 200 });
  }
  await acc.write(store, batch);
  // key "ka" and 4xx: no record matches, but every value holds "ka"
  const first = await listRequestLog(store, SYSTEM, "ta", {
    keyId: "ka",
    model: "none",
  });
  assert.equal(first.items.length, 0);
  assert.equal(first.partial, true);
  assert.ok(first.cursor && first.searchedTo);
  const second = await listRequestLog(store, SYSTEM, "ta", {
    keyId: "ka",
    model: "none",
    cursor: first.cursor,
  });
  assert.deepEqual([second.partial, second.cursor], [false, null]);
  const rare = await listRequestLog(store, SYSTEM, "ta", { keyId: "rare" });
  assert.equal(rare.items.length, 1, "an indexed filter finds it at once");
  kv.close();
});
