/**
 * Wide plans: a plan with more counters than one commit may check
 * (`maxChecks`: denokv allows 10, and a key and its tenant with every
 * limit and budget have 12) is admitted by one commit per group of its
 * counters, in a fixed order: the key's limits, the tenant's, then the
 * budgets. Each group commit is exact on its own (a check and a set per
 * counter, as any admission commit), and writes the request's reservation
 * record, which always says what the groups committed so far hold (a later
 * group checks it: a reclaim in between is seen). When a later group
 * refuses, its commit gives back what the earlier ones took (the record is
 * deleted and its holds summed into the release counters, as a settlement
 * does). A wide plan gets no lease. README.md tells what this costs.
 */
import { newIdAt } from "../ids.ts";
import { k } from "../kv_keys.ts";
import type { Store } from "../store.ts";
import {
  type Counter,
  type CounterCache,
  counterExpiry,
  getManyChunked,
  live,
  newCounter,
  type Release,
  releaseTo,
  u64,
  viewOf,
} from "./counters.ts";
import {
  type Decider,
  type Held,
  judge,
  type Refusal,
  storedReservation,
  take,
} from "./decide.ts";
import type { PendingAdmission } from "./admission.ts";
import { settleOne } from "./settlement.ts";
import {
  type AdmissionRequest,
  type LimitPlan,
  QuotaUnavailableError,
  type Rule,
  type StoredReservation,
} from "./types.ts";
import { DAY, windowOf } from "./windows.ts";

/** Whether a plan has more counters than one commit may check. */
export const isWide = (p: LimitPlan, maxChecks: number) =>
  p.rules.length > maxChecks;

/**
 * How many requests of one wide plan share its group commits: a group after
 * the first checks each one's record besides its counters, so its counters
 * and that many records fit in `maxChecks` (two groups, whenever they can).
 */
export function wideBatch(
  rules: number,
  maxChecks: number,
  maxBatch: number,
): number {
  return Math.max(1, Math.min(maxBatch, maxChecks - (rules - maxChecks)));
}

/** Where a rule's group comes: the key's limits, the tenant's, then budgets. */
const rank = (r: Rule) =>
  (r.budget ? 2 : 0) + (r.subject.startsWith("k:") ? 0 : 1);

/**
 * The groups of a wide plan's rules (their indexes), committed in this
 * order: the first of `maxChecks` counters, the others leaving room for
 * the records of `batch` requests.
 */
export function wideGroups(
  rules: Rule[],
  maxChecks: number,
  batch: number,
): number[][] {
  const order = rules.map((_, i) => i).sort((a, b) =>
    rank(rules[a]!) - rank(rules[b]!) || a - b
  );
  const groups = [order.slice(0, maxChecks)];
  const size = Math.max(1, maxChecks - batch);
  for (let i = maxChecks; i < order.length; i += size) {
    groups.push(order.slice(i, i + size));
  }
  return groups;
}

/** What wide admissions work with (from their AdmissionQueue). */
export interface WideDeps {
  store: Store;
  counters: CounterCache;
  decider: Decider;
  maxChecks: number;
  maxAttempts: number;
  /** Lands what might free room before a refusal (see AdmissionQueue). */
  beforeRefusing: (tenants: Set<string>, cs: Counter[]) => Promise<void>;
  /** Learns the releases a commit added (caches and tidying). */
  released: (rs: Release[]) => void;
}

/** A request of a wide plan on its way through the groups. */
interface Wide {
  p: PendingAdmission;
  id: string;
  deadline: number;
  /** Its record's versionstamp once a group committed it. */
  versionstamp: string | null;
  /** What it holds in the counters committed so far. */
  grant: number;
  money: number;
  held: Held;
  /** Each rule's counter as this request left it (its view). */
  seen: Counter[];
}

/** A request's outcome in one group commit attempt. */
type Step =
  | Refusal
  | {
    ok: true;
    grant: number;
    money: number;
    held: Held;
    seen: Map<number, Counter>;
  };

/**
 * Admits a batch of requests of one wide plan (same plan, same limits),
 * resolving or rejecting each: refused up front when the counters as last
 * known already refuse them (no commit), else group by group.
 */
export async function admitWide(
  batch: PendingAdmission[],
  d: WideDeps,
): Promise<void> {
  const plan = batch[0]!.req.plan;
  const rules = plan.rules;
  const now = Date.now();
  let wides: Wide[] = [];
  try {
    // Its windows as of now, for all its groups.
    const cs = rules.map((r) => {
      const [window, end] = windowOf(r.kind, now);
      return newCounter(r.subject, r.kind, window, end, d.counters);
    });
    await load(d, cs);
    wides = await precheck(batch, cs, now, d);
    const groups = wideGroups(rules, d.maxChecks, Math.max(1, wides.length));
    for (let g = 0; g < groups.length && wides.length > 0; g++) {
      wides = await commitGroup(
        wides,
        groups[g]!,
        g === groups.length - 1,
        cs,
        now,
        d,
      );
    }
  } catch (e) {
    // What the groups committed goes back; if KV is down, a reclaim
    // gives it back (with its owner, or past its deadline).
    await Promise.all(wides.map((w) => giveBack(d, w).catch(() => {})));
    const err = e instanceof QuotaUnavailableError
      ? e
      : new QuotaUnavailableError("Cannot reach the quota store", { cause: e });
    for (const p of batch) p.reject(err); // a no-op for those resolved
    return;
  }
  for (const w of wides) {
    const { held, grant, money } = w;
    w.p.resolve({
      ok: true,
      reservation: {
        id: w.id,
        versionstamp: w.versionstamp!,
        tokens: grant,
        tokenCounters: held.tokenCounters,
        concCounters: held.concCounters,
        ...(held.moneyCounters.length > 0
          ? { money, moneyCounters: held.moneyCounters }
          : {}),
      },
      view: viewOf(rules, w.seen, now),
    });
  }
}

/** Reads each counter's A (this process's own commits' if cached). */
async function load(d: WideDeps, cs: Counter[]): Promise<void> {
  const unknown: Counter[] = [];
  for (const c of cs) {
    c.added = 0;
    c.released = Math.max(c.released, d.counters.released(c.id) ?? 0);
    const cached = d.counters.admitted(c.id);
    if (cached) {
      c.value = cached.value;
      c.versionstamp = cached.versionstamp;
    } else unknown.push(c);
  }
  if (unknown.length === 0) return;
  const read = await getManyChunked(d.store.kv, unknown.map((c) => c.key));
  unknown.forEach((c, i) => {
    c.value = u64(read[i]!.value);
    c.versionstamp = read[i]!.versionstamp;
    d.counters.setAdmitted(c.id, c);
  });
}

/**
 * Judges the batch against every counter as known: refuses, with no
 * commit, those they refuse (after what might free room has landed), and
 * returns the others, each with its grant.
 */
async function precheck(
  batch: PendingAdmission[],
  cs: Counter[],
  now: number,
  d: WideDeps,
): Promise<Wide[]> {
  const rules = batch[0]!.req.plan.rules;
  const judgeAll = () => {
    for (const c of cs) c.added = 0;
    return batch.map((p) => {
      const j = judge(p.req, p.req.tokens, rules, cs, now, d.decider);
      if (j.ok) take(rules, cs, j.grant, j.money);
      return j;
    });
  };
  let verdicts = judgeAll();
  if (verdicts.some((j) => !j.ok)) {
    await d.beforeRefusing(new Set([batch[0]!.req.plan.tenantId]), cs);
    verdicts = judgeAll();
  }
  const view = viewOf(rules, cs, now);
  for (const c of cs) c.added = 0;
  const wides: Wide[] = [];
  batch.forEach((p, i) => {
    const j = verdicts[i]!;
    if (!j.ok) {
      p.resolve({ ...j, view });
      return;
    }
    const deadline = now + p.req.ttlMs;
    wides.push({
      p,
      id: newIdAt(deadline),
      deadline,
      versionstamp: null,
      grant: j.grant,
      money: j.money,
      held: {
        tokenCounters: [],
        concCounters: [],
        moneyCounters: [],
        reqCounters: [],
      },
      seen: cs.map((c) => ({ ...c })),
    });
  });
  return wides;
}

/**
 * Commits one group of counters (rule indexes `group`) for the requests
 * still admitted: each is judged for what the groups before granted it
 * (a smaller grant gives the difference back to them in the same commit),
 * its record rewritten (the last group's is complete); one refused here
 * is resolved, and what the groups before took goes back in the same
 * commit. Returns those still admitted.
 */
async function commitGroup(
  wides: Wide[],
  group: number[],
  last: boolean,
  cs: Counter[],
  now: number,
  d: WideDeps,
): Promise<Wide[]> {
  const kv = d.store.kv;
  const rules = wides[0]!.p.req.plan.rules;
  const gr = group.map((i) => rules[i]!);
  const gc = group.map((i) => cs[i]!);
  let refreshed = false;
  for (let attempt = 0; attempt < d.maxAttempts; attempt++) {
    if (attempt > 0) await load(d, gc);
    let steps = decideGroup(wides, group, gr, gc, cs, now, d);
    if (!refreshed && steps.some((s) => !s.ok)) {
      refreshed = true;
      await d.beforeRefusing(new Set([wides[0]!.p.req.plan.tenantId]), gc);
      steps = decideGroup(wides, group, gr, gc, cs, now, d);
    }
    const op = kv.atomic();
    const rs: Release[] = [];
    let admitted = 0;
    wides.forEach((w, i) => {
      const s = steps[i]!;
      const key = k.reservation(w.id);
      if (w.versionstamp !== null) {
        op.check({ key, versionstamp: w.versionstamp });
      }
      if (!s.ok) {
        if (w.versionstamp !== null) {
          op.delete(key);
          rs.push(...holds(w));
        }
        return;
      }
      admitted++;
      // The groups before hold its earlier grant: the difference goes back.
      releaseTo(rs, w.held.tokenCounters, w.grant - s.grant);
      releaseTo(rs, w.held.moneyCounters, w.money - s.money);
      op.set(key, record(w.p.req, w.deadline, s, last, d.decider), {
        expireIn: w.p.req.ttlMs + 7 * DAY,
      });
    });
    if (admitted > 0) {
      for (const c of gc) {
        op.check({ key: c.key, versionstamp: c.versionstamp });
        if (c.added > 0) {
          op.set(c.key, new Deno.KvU64(BigInt(c.value + c.added)), {
            expireIn: counterExpiry(c, now),
          });
        }
      }
    }
    const sums = live(rs, now);
    for (const [key, n] of merge(sums)) op.sum(key, BigInt(n));
    if (admitted === 0 && wides.every((w) => w.versionstamp === null)) {
      // Refused in the first group: nothing was taken.
      resolveRefused(wides, steps, cs, now);
      return [];
    }
    const res = await op.commit();
    if (res.ok) {
      for (const c of gc) {
        if (c.added > 0) {
          c.value += c.added;
          c.versionstamp = res.versionstamp;
          d.counters.setAdmitted(c.id, c);
        }
        c.added = 0;
      }
      d.released(sums);
      resolveRefused(wides, steps, cs, now);
      const out: Wide[] = [];
      wides.forEach((w, i) => {
        const s = steps[i]!;
        if (!s.ok) return;
        w.versionstamp = res.versionstamp;
        w.grant = s.grant;
        w.money = s.money;
        w.held = s.held;
        for (const [j, c] of s.seen) w.seen[j] = c;
        out.push(w);
      });
      return out;
    }
    // Another instance moved a counter, or a record was reclaimed (its
    // owner presumed dead): what it held went back, it fails closed.
    for (const c of gc) d.counters.forgetAdmitted(c.id);
    if (wides.some((w) => w.versionstamp !== null)) {
      const recs = await getManyChunked(
        kv,
        wides.map((w) => k.reservation(w.id)),
      );
      wides = wides.filter((w, i) => {
        if (recs[i]!.versionstamp === w.versionstamp) return true;
        w.p.reject(
          new QuotaUnavailableError(
            "Cannot admit: the request's hold was reclaimed while it was admitted",
          ),
        );
        return false;
      });
      if (wides.length === 0) return [];
    }
  }
  throw new QuotaUnavailableError(
    "Cannot admit: the quota counters stayed contended",
  );
}

/** Judges each request of a group commit against the group's counters, in order. */
function decideGroup(
  wides: Wide[],
  group: number[],
  gr: Rule[],
  gc: Counter[],
  cs: Counter[],
  now: number,
  d: WideDeps,
): Step[] {
  for (const c of gc) c.added = 0;
  return wides.map((w): Step => {
    const j = judge(w.p.req, w.grant, gr, gc, now, d.decider);
    if (!j.ok) return j;
    const held: Held = {
      tokenCounters: [...w.held.tokenCounters],
      concCounters: [...w.held.concCounters],
      moneyCounters: [...w.held.moneyCounters],
      reqCounters: [...w.held.reqCounters],
    };
    take(gr, gc, j.grant, j.money, held);
    return {
      ok: true,
      grant: j.grant,
      money: j.money,
      held,
      seen: new Map(group.map((i) => [i, { ...cs[i]! }])),
    };
  });
}

/** Resolves the requests a group refused, with the plan's view. */
function resolveRefused(
  wides: Wide[],
  steps: Step[],
  cs: Counter[],
  now: number,
): void {
  wides.forEach((w, i) => {
    const s = steps[i]!;
    if (!s.ok) {
      w.p.resolve({ ...s, view: viewOf(w.p.req.plan.rules, cs, now) });
    }
  });
}

/**
 * A request's record after a group commit: complete after the last
 * group, else what it holds so far, all given back if it is reclaimed.
 */
function record(
  req: AdmissionRequest,
  deadline: number,
  s: Extract<Step, { ok: true }>,
  last: boolean,
  by: Decider,
): StoredReservation {
  const stored = storedReservation(req, deadline, s.grant, s.money, s.held, by);
  if (last) return stored;
  return {
    ...stored,
    reclaimTokens: 0,
    ...(stored.money !== undefined ? { reclaimMoney: 0 } : {}),
    requests: 1,
    reclaimRequests: 0,
    reqCounters: s.held.reqCounters,
    admitting: true,
  };
}

/** What a request's record holds so far: all of it goes back. */
function holds(w: Wide): Release[] {
  const rs: Release[] = [];
  releaseTo(rs, w.held.tokenCounters, w.grant);
  releaseTo(rs, w.held.moneyCounters, w.money);
  releaseTo(rs, w.held.concCounters, 1);
  releaseTo(rs, w.held.reqCounters, 1);
  return rs;
}

/** Gives back what a request's groups took (it failed), as a settlement would. */
async function giveBack(d: WideDeps, w: Wide): Promise<void> {
  if (w.versionstamp === null) return;
  const rs = live(holds(w), Date.now());
  if (await settleOne(d.store, w.id, w.versionstamp, rs)) d.released(rs);
}

/** Sums per release counter (several requests give back to the same one). */
function merge(rs: Release[]): [Deno.KvKey, number][] {
  const sums = new Map<string, [Deno.KvKey, number]>();
  for (const [id, key, n] of rs) {
    const e = sums.get(id);
    if (e) e[1] += n;
    else sums.set(id, [key, n]);
  }
  return [...sums.values()];
}
