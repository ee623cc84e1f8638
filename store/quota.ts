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
 * Each window has two counters: `A` (admitted, only ever `set` by admission
 * under a `check`) and `R` (released, only ever increased by blind `sum`s
 * when a request settles). Usage = A − R. Settlement never conflicts with
 * admission, and admission needs no read on the hot path: A's value and
 * versionstamp are cached from this process's own commits (a stale entry
 * fails its `check` and is re-read), and R may be read stale because it only
 * grows (stale R over-counts usage: conservative), re-read before refusing.
 * A reservation is settled exactly once (guarded by its versionstamp),
 * either by its request or, after its deadline, by `reclaimExpired`.
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

const ABSENT = { value: 0, versionstamp: null } as const;

/** The release counter's window name for an admission window. */
const rel = (window: string) => `${window}:r`;

function u64(v: unknown): number {
  return v instanceof Deno.KvU64 ? Number(v.value) : 0;
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
  readonly #admitted = new Map<
    string,
    { value: number; versionstamp: string | null }
  >();
  readonly #releasedCache = new Map<string, { value: number; at: number }>();

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
    const kv = this.#store.kv;
    for (let attempt = 0; attempt < this.#maxAttempts; attempt++) {
      const now = Date.now();
      const wins = plan.rules.map((r) => windowOf(r.kind, now));
      const keys = plan.rules.map((r, i) =>
        k.quotaCounter(r.subject, wins[i]![0])
      );
      const ids = keys.map((key) => `${key[1]}\u0000${key[2]}`);
      // Admission counters: cached from our own commits, else read.
      // A counter not cached yet is first assumed absent (`check` with a null
      // versionstamp): if it exists the commit fails and it is read below.
      let entries = ids.map((id) =>
        this.#admitted.get(id) ?? (attempt === 0 ? ABSENT : undefined)
      );
      if (entries.some((e) => !e)) {
        const read = await kv.getMany<Deno.KvU64[]>(keys);
        entries = read.map((e, i) => {
          const c = { value: u64(e.value), versionstamp: e.versionstamp };
          this.#cacheAdmitted(ids[i]!, c);
          return c;
        });
      }
      let released = await this.#released(plan.rules, wins, now, false);
      let out = this.#decideAll(reqs, entries, released, wins, now);
      if (out.admissions.some((a) => !a.ok) && !released.fresh) {
        released = await this.#released(plan.rules, wins, now, true);
        out = this.#decideAll(reqs, entries, released, wins, now);
      }
      if (out.admitted === 0) return out.admissions;
      const op = out.op;
      plan.rules.forEach((r, i) => {
        op.check({ key: keys[i]!, versionstamp: entries[i]!.versionstamp });
        if (out.added[i]! > 0) {
          const expireIn = r.kind === "concurrency"
            ? undefined
            : wins[i]![1] - now + DAY;
          op.set(
            keys[i]!,
            new Deno.KvU64(BigInt(entries[i]!.value + out.added[i]!)),
            { expireIn },
          );
        }
      });
      const res = await op.commit();
      if (res.ok) {
        plan.rules.forEach((_, i) => {
          if (out.added[i]! > 0) {
            this.#cacheAdmitted(ids[i]!, {
              value: entries[i]!.value + out.added[i]!,
              versionstamp: res.versionstamp,
            });
          }
        });
        for (const a of out.admissions) {
          if (a.ok && a.reservation) {
            a.reservation.versionstamp = res.versionstamp;
          }
        }
        return out.admissions;
      }
      for (const id of ids) this.#admitted.delete(id); // another instance moved: re-read
    }
    throw new QuotaUnavailableError(
      "Cannot admit: the quota counters stayed contended",
    );
  }

  #cacheAdmitted(
    id: string,
    c: { value: number; versionstamp: string | null },
  ): void {
    if (this.#admitted.size >= 100_000) this.#admitted.clear();
    this.#admitted.set(id, c);
  }

  /** Release counters (0 for rpm): as last seen, or read when `fresh`. */
  async #released(
    rules: Rule[],
    wins: [string, number][],
    now: number,
    fresh: boolean,
  ): Promise<{ values: number[]; fresh: boolean }> {
    const values = rules.map(() => 0);
    const need: number[] = [];
    rules.forEach((r, i) => {
      if (r.kind === "rpm") return;
      // R only grows, so a stale or unknown (0) value over-counts usage:
      // safe for admitting; it is read before anything is refused.
      const c = this.#releasedCache.get(`${r.subject}\u0000${wins[i]![0]}`);
      if (!fresh) values[i] = c?.value ?? 0;
      else need.push(i);
    });
    if (need.length > 0) {
      const read = await this.#store.kv.getMany(
        need.map((i) => k.quotaCounter(rules[i]!.subject, rel(wins[i]![0]))),
      );
      if (this.#releasedCache.size >= 100_000) this.#releasedCache.clear();
      need.forEach((i, j) => {
        values[i] = u64(read[j]!.value);
        this.#releasedCache.set(`${rules[i]!.subject}\u0000${wins[i]![0]}`, {
          value: values[i]!,
          at: now,
        });
      });
    }
    return {
      values,
      fresh: need.length === rules.filter((r) => r.kind !== "rpm").length,
    };
  }

  #decideAll(
    reqs: AdmissionRequest[],
    entries: ({ value: number } | undefined)[],
    released: { values: number[] },
    wins: [string, number][],
    now: number,
  ) {
    const cur = entries.map((e, i) => e!.value - released.values[i]!);
    const start = [...cur];
    const op = this.#store.kv.atomic();
    const admissions: Admission[] = [];
    let admitted = 0;
    for (const req of reqs) {
      const a = this.#decide(req, cur, wins, now, op);
      admissions.push(a);
      if (a.ok) admitted++;
    }
    return {
      admissions,
      admitted,
      op,
      added: cur.map((v, i) => v - start[i]!),
    };
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
      op.sum(k.quotaCounter(s, rel(w)), BigInt(granted - used));
    }
  }
  for (const [s, w] of concCounters) op.sum(k.quotaCounter(s, rel(w)), 1n);
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

/** Reads a window's current usage, admitted minus released (tests and the portal). */
export async function counterValue(
  store: Store,
  subject: string,
  window: string,
): Promise<number> {
  const [a, r] = await store.kv.getMany([
    k.quotaCounter(subject, window),
    k.quotaCounter(subject, rel(window)),
  ]);
  return u64(a!.value) - u64(r!.value);
}

/** Counts reservations still held (tests and diagnostics). */
export async function countReservations(store: Store): Promise<number> {
  let n = 0;
  for await (const _ of store.kv.list({ prefix: k.reservationPrefix() })) n++;
  return n;
}
