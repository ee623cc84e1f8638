/**
 * Exact admission and settlement for limits and quotas.
 *
 * Admission reserves a request's worst case against every applicable window
 * in ONE atomic KV operation (read → `check` every counter → `set` the new
 * values + the reservation record → commit, retried on conflict), so N
 * concurrent requests never overspend any window. Inside a process,
 * admissions of one tenant are queued and coalesced: one commit admits a
 * whole batch, so a hot key does not collapse under retries.
 *
 * Settlement replaces the reservation by the actual usage with blind `sum`
 * mutations (u64 sums wrap, so adding 2^64 − x subtracts x) guarded by the
 * reservation's versionstamp: a reservation is settled exactly once, either
 * by its request or, after its deadline, by `reclaimExpired`.
 */
import { newIdAt } from "./ids.ts";
import { k } from "./kv_keys.ts";
import type { Limits } from "./limits.ts";
import type { Store } from "./store.ts";

/** The kind of a limit rule and so of its window. */
export type RuleKind = "rpm" | "tpm" | "concurrency" | "day" | "month";

/** One limit to enforce: `subject` is `t:<tenantId>` or `k:<keyId>`. */
export interface Rule {
  subject: string;
  kind: RuleKind;
  limit: number;
}

/** The precomputed rules of one (tenant, key); at most 10 (one check each). */
export interface LimitPlan {
  tenantId: string;
  keyId: string;
  rules: Rule[];
}

/** What one request asks for. */
export interface AdmissionRequest {
  plan: LimitPlan;
  /** Worst-case tokens (prompt + completion cap). */
  tokens: number;
  /** Smallest grant acceptable (tokens are clamped down to what remains, never below this). */
  minTokens: number;
  /** Tokens to bill if the reservation is reclaimed after a crash. */
  reclaimTokens: number;
  /** Reservation lifetime in ms; after it a crashed gateway's hold is reclaimed. */
  ttlMs: number;
}

/** A granted reservation, settled exactly once. */
export interface Reservation {
  id: string;
  versionstamp: string;
  /** Tokens granted (≤ requested). */
  tokens: number;
  /** Counters holding tokens (`[subject, window]`) and the concurrency counters. */
  tokenCounters: [string, string][];
  concCounters: [string, string][];
}

/** Remaining capacity of the tightest request and token windows, for headers. */
export interface QuotaView {
  requests: { limit: number; remaining: number; resetMs: number } | null;
  tokens: { limit: number; remaining: number; resetMs: number } | null;
}

/** The outcome of an admission. */
export type Admission =
  | { ok: true; reservation: Reservation | null; view: QuotaView }
  | {
    ok: false;
    /** "rate": retry later (rpm, tpm, concurrency); "quota": day/month exhausted. */
    reason: "rate" | "quota";
    rule: Rule;
    retryAfterMs: number;
    view: QuotaView;
  };

/** Thrown when KV cannot be reached or conflicts never resolve: fail closed. */
export class QuotaUnavailableError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "QuotaUnavailableError";
  }
}

interface StoredReservation {
  tenantId: string;
  keyId: string;
  deadline: number;
  tokens: number;
  reclaimTokens: number;
  tokenCounters: [string, string][];
  concCounters: [string, string][];
}

const MINUTE = 60_000;
const DAY = 86_400_000;
const MAX_U64 = 1n << 64n;

/** Builds the rules of a (tenant, key) from their limits; nulls are skipped. */
export function limitPlan(
  tenantId: string,
  keyId: string,
  tenant: Limits,
  key: Limits | null,
): LimitPlan {
  const rules: Rule[] = [];
  const add = (subject: string, l: Limits) => {
    if (l.rpm !== null) rules.push({ subject, kind: "rpm", limit: l.rpm });
    if (l.tpm !== null) rules.push({ subject, kind: "tpm", limit: l.tpm });
    if (l.concurrency !== null) {
      rules.push({ subject, kind: "concurrency", limit: l.concurrency });
    }
    if (l.tokensPerDay !== null) {
      rules.push({ subject, kind: "day", limit: l.tokensPerDay });
    }
    if (l.tokensPerMonth !== null) {
      rules.push({ subject, kind: "month", limit: l.tokensPerMonth });
    }
  };
  add(`t:${tenantId}`, tenant);
  if (key) add(`k:${keyId}`, key);
  return { tenantId, keyId, rules };
}

/** The window name of a rule at `now` (part of the counter key) and when it ends. */
export function windowOf(kind: RuleKind, now: number): [string, number] {
  const d = new Date(now);
  const iso = d.toISOString();
  switch (kind) {
    case "rpm":
    case "tpm":
      return [`${kind}:${iso.slice(0, 16)}`, now - (now % MINUTE) + MINUTE];
    case "day":
      return [`day:${iso.slice(0, 10)}`, now - (now % DAY) + DAY];
    case "month":
      return [
        `month:${iso.slice(0, 7)}`,
        Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1),
      ];
    case "concurrency":
      return ["conc", now + 1000];
  }
}

const isTokenRule = (kind: RuleKind) =>
  kind === "tpm" || kind === "day" || kind === "month";

function u64(v: unknown): number {
  return v instanceof Deno.KvU64 ? Number(v.value) : 0;
}

/** Adds `delta` (possibly negative) as a wrapping u64 sum. */
function sumOf(delta: number): bigint {
  const d = BigInt(Math.trunc(delta));
  return d >= 0n ? d : MAX_U64 + d;
}

interface Pending {
  req: AdmissionRequest;
  resolve: (a: Admission) => void;
  reject: (e: unknown) => void;
}

/** Serialises and coalesces admissions per tenant inside this process. */
export class Admitter {
  readonly #store: Store;
  readonly #queues = new Map<string, Pending[]>();
  readonly #maxBatch: number;
  readonly #maxAttempts: number;

  constructor(
    store: Store,
    opts: { maxBatch?: number; maxAttempts?: number } = {},
  ) {
    this.#store = store;
    this.#maxBatch = opts.maxBatch ?? 64;
    this.#maxAttempts = opts.maxAttempts ?? 100;
  }

  /** Admits or rejects one request; throws QuotaUnavailableError when KV fails. */
  admit(req: AdmissionRequest): Promise<Admission> {
    if (req.plan.rules.length === 0) {
      return Promise.resolve({
        ok: true,
        reservation: null,
        view: { requests: null, tokens: null },
      });
    }
    return new Promise((resolve, reject) => {
      const id = req.plan.tenantId;
      const q = this.#queues.get(id);
      if (q) {
        q.push({ req, resolve, reject });
        return;
      }
      this.#queues.set(id, [{ req, resolve, reject }]);
      this.#drain(id);
    });
  }

  async #drain(tenantId: string): Promise<void> {
    const q = this.#queues.get(tenantId)!;
    while (q.length > 0) {
      // One batch: the head's key and every queued request of the same key.
      const keyId = q[0]!.req.plan.keyId;
      const batch: Pending[] = [];
      for (let i = 0; i < q.length && batch.length < this.#maxBatch;) {
        if (q[i]!.req.plan.keyId === keyId) batch.push(q.splice(i, 1)[0]!);
        else i++;
      }
      try {
        const results = await this.#commit(batch.map((p) => p.req));
        batch.forEach((p, i) => p.resolve(results[i]!));
      } catch (e) {
        const err = e instanceof QuotaUnavailableError
          ? e
          : new QuotaUnavailableError(
            "Cannot reach the quota store",
            { cause: e },
          );
        for (const p of batch) p.reject(err);
      }
    }
    this.#queues.delete(tenantId);
  }

  async #commit(reqs: AdmissionRequest[]): Promise<Admission[]> {
    const plan = reqs[0]!.plan;
    for (let attempt = 0; attempt < this.#maxAttempts; attempt++) {
      const now = Date.now();
      const wins = plan.rules.map((r) => windowOf(r.kind, now));
      const keys = plan.rules.map((r, i) =>
        k.quotaCounter(r.subject, wins[i]![0])
      );
      const entries = await this.#store.kv.getMany(keys);
      const cur = entries.map((e) => u64(e.value));
      const start = [...cur];
      const out: Admission[] = [];
      const op = this.#store.kv.atomic();
      let admitted = 0;
      for (const req of reqs) {
        out.push(this.#decide(req, cur, wins, now, op));
        if (out[out.length - 1]!.ok) admitted++;
      }
      if (admitted === 0) return out;
      plan.rules.forEach((r, i) => {
        op.check(entries[i]!);
        if (cur[i] !== start[i]) {
          const expireIn = r.kind === "concurrency"
            ? undefined
            : wins[i]![1] - now + DAY;
          op.set(keys[i]!, new Deno.KvU64(BigInt(cur[i]!)), { expireIn });
        }
      });
      const res = await op.commit();
      if (res.ok) {
        for (const a of out) {
          if (a.ok && a.reservation) {
            a.reservation.versionstamp = res.versionstamp;
          }
        }
        return out;
      }
    }
    throw new QuotaUnavailableError(
      "Cannot admit: the quota counters stayed contended",
    );
  }

  /** Decides one request against the running counters, adding its reservation to `op`. */
  #decide(
    req: AdmissionRequest,
    cur: number[],
    wins: [string, number][],
    now: number,
    op: Deno.AtomicOperation,
  ): Admission {
    const rules = req.plan.rules;
    let grant = req.tokens;
    for (let i = 0; i < rules.length; i++) {
      const r = rules[i]!;
      if (isTokenRule(r.kind)) grant = Math.min(grant, r.limit - cur[i]!);
    }
    for (let i = 0; i < rules.length; i++) {
      const r = rules[i]!;
      const over = isTokenRule(r.kind)
        ? grant < req.minTokens || grant <= 0
        : cur[i]! + 1 > r.limit;
      if (over) {
        const quota = r.kind === "day" || r.kind === "month";
        return {
          ok: false,
          reason: quota ? "quota" : "rate",
          rule: r,
          retryAfterMs: r.kind === "concurrency" ? 1000 : wins[i]![1] - now,
          view: viewOf(rules, cur, wins, now),
        };
      }
    }
    const tokenCounters: [string, string][] = [];
    const concCounters: [string, string][] = [];
    for (let i = 0; i < rules.length; i++) {
      const r = rules[i]!;
      if (isTokenRule(r.kind)) {
        cur[i]! += grant;
        tokenCounters.push([r.subject, wins[i]![0]]);
      } else {
        cur[i]! += 1;
        if (r.kind === "concurrency") {
          concCounters.push([r.subject, wins[i]![0]]);
        }
      }
    }
    const view = viewOf(rules, cur, wins, now);
    if (tokenCounters.length === 0 && concCounters.length === 0) {
      return { ok: true, reservation: null, view };
    }
    const deadline = now + req.ttlMs;
    const id = newIdAt(deadline);
    const stored: StoredReservation = {
      tenantId: req.plan.tenantId,
      keyId: req.plan.keyId,
      deadline,
      tokens: grant,
      reclaimTokens: Math.min(grant, req.reclaimTokens),
      tokenCounters,
      concCounters,
    };
    op.set(k.reservation(id), stored, { expireIn: req.ttlMs + 7 * DAY });
    return {
      ok: true,
      reservation: {
        id,
        versionstamp: "",
        tokens: grant,
        tokenCounters,
        concCounters,
      },
      view,
    };
  }
}

function viewOf(
  rules: Rule[],
  cur: number[],
  wins: [string, number][],
  now: number,
): QuotaView {
  const view: QuotaView = { requests: null, tokens: null };
  const rank: Record<RuleKind, number> = {
    tpm: 0,
    day: 1,
    month: 2,
    rpm: 0,
    concurrency: 9,
  };
  let tokenRank = 9;
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    const v = {
      limit: r.limit,
      remaining: Math.max(0, r.limit - cur[i]!),
      resetMs: wins[i]![1] - now,
    };
    if (r.kind === "rpm") {
      if (!view.requests || v.remaining < view.requests.remaining) {
        view.requests = v;
      }
    } else if (isTokenRule(r.kind)) {
      const better = rank[r.kind] < tokenRank ||
        (rank[r.kind] === tokenRank && v.remaining < view.tokens!.remaining);
      if (better) {
        view.tokens = v;
        tokenRank = rank[r.kind];
      }
    }
  }
  return view;
}

/**
 * Replaces a reservation by the actual usage (clamped to the grant); a
 * no-op when it was already settled or reclaimed.
 */
export async function settle(
  store: Store,
  r: Reservation,
  actualTokens: number,
): Promise<boolean> {
  const op = store.kv.atomic()
    .check({ key: k.reservation(r.id), versionstamp: r.versionstamp })
    .delete(k.reservation(r.id));
  applyRelease(op, r.tokens, actualTokens, r.tokenCounters, r.concCounters);
  return (await op.commit()).ok;
}

function applyRelease(
  op: Deno.AtomicOperation,
  granted: number,
  actual: number,
  tokenCounters: [string, string][],
  concCounters: [string, string][],
): void {
  const used = Math.max(0, Math.min(granted, Math.ceil(actual)));
  if (used !== granted) {
    for (const [s, w] of tokenCounters) {
      op.sum(k.quotaCounter(s, w), sumOf(used - granted));
    }
  }
  for (const [s, w] of concCounters) op.sum(k.quotaCounter(s, w), sumOf(-1));
}

/**
 * Settles every reservation whose deadline has passed (a crashed gateway's
 * holds), billing its `reclaimTokens`; returns how many were reclaimed.
 */
export async function reclaimExpired(
  store: Store,
  now = Date.now(),
  limit = 500,
): Promise<number> {
  let n = 0;
  const iter = store.kv.list<StoredReservation>({
    start: k.reservationPrefix(),
    end: k.reservation(newIdAt(now)),
  }, { limit });
  for await (const e of iter) {
    if (e.value.deadline > now) continue;
    const op = store.kv.atomic().check(e).delete(e.key);
    applyRelease(
      op,
      e.value.tokens,
      e.value.reclaimTokens,
      e.value.tokenCounters,
      e.value.concCounters,
    );
    if ((await op.commit()).ok) n++;
  }
  return n;
}

/** Reads a counter's current value (tests and the portal). */
export async function counterValue(
  store: Store,
  subject: string,
  window: string,
): Promise<number> {
  return u64((await store.kv.get(k.quotaCounter(subject, window))).value);
}

/** Counts reservations still held (tests and diagnostics). */
export async function countReservations(store: Store): Promise<number> {
  let n = 0;
  for await (const _ of store.kv.list({ prefix: k.reservationPrefix() })) n++;
  return n;
}
