/** Helpers shared by the quota tests. */
import assert from "node:assert/strict";
import { serialize as v8Serialize } from "node:v8";
import { type Admitter, counterValue, limitPlan, windowOf } from "./mod.ts";
import { createStore, type Store } from "../store.ts";
import { UNLIMITED } from "../limits.ts";

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export const req = (
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

/** Counts the atomic commits made through a KV handle. */
export function countCommits(kv: Deno.Kv): { commits: number } {
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

/** Usage of a subject's rpm windows between two times (a test may straddle a minute). */
export async function rpmUsed(
  store: Awaited<ReturnType<typeof createStore>>,
  subject: string,
  from: number,
): Promise<number> {
  const a = windowOf("rpm", from)[0];
  const b = windowOf("rpm", Date.now())[0];
  return await counterValue(store, subject, a) +
    (a === b ? 0 : await counterValue(store, subject, b));
}

/** Tenant t1's plan with a request rate and concurrency far from any lease's reach. */
export const roomyRpmPlan = () =>
  limitPlan(
    "t1",
    "k1",
    { ...UNLIMITED, rpm: 100_000, concurrency: 10_000 },
    null,
  );

/** Tenant limits far from any lease's reach. */
export const ROOMY = {
  ...UNLIMITED,
  rpm: 100_000,
  tpm: 100_000_000,
  concurrency: 10_000,
};

/**
 * Admits one request at a time, every `everyMs`, until `until`; whether
 * each came from a lease (and, into `at`, the time before and after each).
 */
export async function steadyKey(
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

/**
 * Runs `f` with the clock (Date.now) `ms` before the next minute boundary;
 * `f` may move that clock on by calling `jump`.
 */
export async function beforeMinuteBoundary(
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
export function assertTwoMinutes(
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
export async function twoMinutes(store: Store, at: number): Promise<number[]> {
  const [minute, end] = windowOf("rpm", at);
  return [
    await counterValue(store, "t:t1", minute),
    await counterValue(store, "t:t1", windowOf("rpm", end)[0]),
  ];
}

/**
 * A store with tenant t1's plan (minute limits and a day quota), the
 * current minute's and day's token windows, and a reader of a window's
 * release counter (undefined once deleted).
 */
export async function releaseFixture() {
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

/** The most a commit did, as seen by `denokvLimits`. */
export interface CommitStats {
  commits: number;
  mostChecks: number;
  mostMutations: number;
  mostBytes: number;
}

/**
 * Makes `kv` refuse, as a self-hosted denokv does (its proto/limits.rs),
 * commits with more than 10 checks or 1,000 mutations or 800 KiB of keys
 * and values (sizes as V8 serializes values, keys as JSON: close enough to
 * tell), and records the most any commit did. `hold`, when it answers true
 * for a commit's checked keys, leaves that commit pending for ever (its
 * process is gone).
 */
export function denokvLimits(
  kv: Deno.Kv,
  hold: (checked: Deno.KvKey[]) => boolean = () => false,
): CommitStats {
  const stats: CommitStats = {
    commits: 0,
    mostChecks: 0,
    mostMutations: 0,
    mostBytes: 0,
  };
  const keyBytes = (key: Deno.KvKey) => JSON.stringify(key).length;
  const atomic = kv.atomic.bind(kv);
  kv.atomic = () => {
    const op = atomic();
    const checked: Deno.KvKey[] = [];
    let mutations = 0;
    let bytes = 0;
    const check = op.check.bind(op);
    op.check = (...cs) => {
      for (const c of cs) {
        checked.push(c.key);
        bytes += keyBytes(c.key);
      }
      return check(...cs);
    };
    const count = (key: Deno.KvKey, value?: unknown) => {
      mutations++;
      bytes += keyBytes(key) +
        (value === undefined ? 0 : v8Serialize(value).byteLength);
    };
    const set = op.set.bind(op);
    op.set = (key, value, o) => {
      count(key, value);
      return set(key, value, o);
    };
    const sum = op.sum.bind(op);
    op.sum = (key, n) => {
      count(key, new Deno.KvU64(n));
      return sum(key, n);
    };
    const del = op.delete.bind(op);
    op.delete = (key) => {
      count(key);
      return del(key);
    };
    const commit = op.commit.bind(op);
    op.commit = () => {
      stats.commits++;
      stats.mostChecks = Math.max(stats.mostChecks, checked.length);
      stats.mostMutations = Math.max(stats.mostMutations, mutations);
      stats.mostBytes = Math.max(stats.mostBytes, bytes);
      if (checked.length > 10) {
        return Promise.reject(new TypeError("Too many checks (max 10)"));
      }
      if (mutations > 1000) {
        return Promise.reject(new TypeError("Too many mutations (max 1000)"));
      }
      if (bytes > 819_200) {
        return Promise.reject(new TypeError("Total mutation size too large"));
      }
      if (hold(checked)) return new Promise(() => {});
      return commit();
    };
    return op;
  };
  return stats;
}
