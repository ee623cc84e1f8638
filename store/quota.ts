/**
 * Exact admission and settlement for limits and quotas.
 *
 * Admission reserves a request's worst case against every applicable window
 * in ONE atomic KV operation (read → `check` every counter → `set` the new
 * values + the reservation record → commit, retried on conflict), so N
 * concurrent requests never overspend any window. Inside a process,
 * admissions are queued and coalesced: one commit admits every waiting
 * request of a tenant and those of other tenants with it (each KV commit
 * costs ~100 µs of CPU whatever it holds), and a tenant never has two
 * commits racing, so a hot key does not collapse under retries.
 * Settlements are batched likewise, after the response.
 *
 * A (tenant, key) in steady use gets a lease: one commit prepays the n
 * requests it made over the last 60 s, for the next 60 s (or up to its
 * window's end, when that is less than 30 s later; every counter of its
 * plan raised by n requests' worth, under one reservation record), and
 * requests admitted from it touch no KV at all; the lease settles once,
 * giving back what it did not use (a lease that ran its course, ended or
 * used up, settles within 15 s, at random, so 1,000 ending at a minute
 * boundary, or used up at the same pace, do not settle in one burst). Its
 * successor is granted off the request path once a random 10% to 90% of
 * its requests or of leaseMs is gone (leases that start together renew
 * over most of their span, not in one burst), counted in the windows
 * it starts in (the next minute's, or the same minute's when the key would
 * use its lease up before the minute ends; one granted in the same minute
 * for a burst that has since slowed down goes back, and one in the next
 * minute's is asked for), so a steady key never waits for a commit, even
 * at a minute boundary. Leases take at most a tenth of any
 * window's remaining capacity and none is granted near a limit, so
 * admission stays exact there, one commit per request; a refusal first
 * closes the tenant's leases and gives back their idle capacity.
 *
 * Each window has two counters: `A` (admitted, only ever `set` by admission
 * under a `check`) and `R` (released, only ever increased by blind `sum`s
 * when a request settles, and only while its window runs). Usage = A − R.
 * A `sum` leaves its key without an expiry, so a process deletes the R
 * counters it added to a minute after their window ends (see
 * TIDY_AFTER_MS); a minute's A counters expire then too, a day's or a
 * month's a day after it. Settlement never conflicts with
 * admission, and admission needs no read on the hot path: A's value and
 * versionstamp are cached from this process's own commits (a stale entry
 * fails its `check` and is re-read), and R may be read stale because it only
 * grows (stale R over-counts usage: conservative), re-read before refusing.
 * A reservation is settled exactly once (guarded by its versionstamp),
 * either by its request or by a reclaim: of its owner's holds when that
 * gateway instance restarts or its liveness lapses (store/instances.ts,
 * `reclaimOwned`), or of any past its deadline (`reclaimExpired`). A
 * reclaim bills a request its prompt estimate, and a lease what it
 * admitted and used by its last checkpoint (at most CHECKPOINT_MS old, see
 * Admitter.#checkpoint), never its unused capacity.
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
  /** Tokens to bill if the reservation is reclaimed after a crash (≤ tokens). */
  reclaimTokens: number;
  /**
   * Reservation lifetime in ms: after it the hold is reclaimed even while
   * its owner lives (a settlement that failed).
   */
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
  /** Set when admitted from this process's lease: it settles in memory. */
  lease?: Lease;
  /** Admitted from a lease: what its checkpoint bills for it while in flight. */
  reclaimTokens?: number;
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
  /** The gateway instance holding it (store/instances.ts); absent in tests without one. */
  owner?: string;
  deadline: number;
  /** Tokens it holds in each of `tokenCounters`, and those billed if reclaimed. */
  tokens: number;
  reclaimTokens: number;
  tokenCounters: [string, string][];
  concCounters: [string, string][];
  /** Concurrency slots it holds (a lease holds several; default 1). */
  units?: number;
  /**
   * A lease's requests held in each of `reqCounters` (rpm), and those
   * counted if reclaimed; its ReservationUse, once written, overrides
   * both `reclaim` fields.
   */
  requests?: number;
  reclaimRequests?: number;
  reqCounters?: [string, string][];
}

/** A lease's checkpoint (k.reservationUse): what a reclaim bills it. */
interface ReservationUse {
  /** Tokens used by its finished requests, plus its in-flight requests' reclaimTokens. */
  tokens: number;
  /** Requests it admitted. */
  requests: number;
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

/** The last window computed per kind, with its start (windows change rarely). */
const lastWindows = new Map<
  RuleKind,
  { name: string; start: number; end: number }
>();

/** When the window named `w` (see windowOf) ends; Infinity for concurrency. */
function windowEnd(w: string): number {
  let end = windowEnds.get(w);
  if (end === undefined) {
    const i = w.indexOf(":");
    const kind = w.slice(0, i);
    const at = w.slice(i + 1);
    if (kind === "rpm" || kind === "tpm") {
      end = Date.parse(`${at}:00Z`) + MINUTE;
    } else if (kind === "day") end = Date.parse(`${at}T00:00:00Z`) + DAY;
    else if (kind === "month") {
      const d = new Date(`${at}-01T00:00:00Z`);
      end = Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
    }
    if (end === undefined || Number.isNaN(end)) end = Infinity;
    if (windowEnds.size >= 1000) windowEnds.clear();
    windowEnds.set(w, end);
  }
  return end;
}
const windowEnds = new Map<string, number>();

/** The window name of a rule at `now` (part of the counter key) and when it ends. */
export function windowOf(kind: RuleKind, now: number): [string, number] {
  if (kind === "concurrency") return ["conc", now + 1000];
  const w = lastWindows.get(kind);
  if (w && now >= w.start && now < w.end) return [w.name, w.end];
  const d = new Date(now);
  const iso = d.toISOString();
  let name: string, start: number, end: number;
  if (kind === "rpm" || kind === "tpm") {
    [name, start] = [`${kind}:${iso.slice(0, 16)}`, now - (now % MINUTE)];
    end = start + MINUTE;
  } else if (kind === "day") {
    [name, start] = [`day:${iso.slice(0, 10)}`, now - (now % DAY)];
    end = start + DAY;
  } else {
    name = `month:${iso.slice(0, 7)}`;
    start = Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
    end = Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
  }
  lastWindows.set(kind, { name, start, end });
  return [name, end];
}

const isTokenRule = (kind: RuleKind) =>
  kind === "tpm" || kind === "day" || kind === "month";

/** The release counter's window name for an admission window. */
const rel = (window: string) => `${window}:r`;

function u64(v: unknown): number {
  return v instanceof Deno.KvU64 ? Number(v.value) : 0;
}

interface Pending {
  req: AdmissionRequest;
  resolve: (a: Admission) => void;
  reject: (e: unknown) => void;
  /** Set when this only grants the successor of this lease (no request admitted). */
  renews?: Lease;
}

/**
 * A release to add to one release counter: `[cacheId, key, n, end]`, `end`
 * when its window ends (Infinity for concurrency). Releases into a window
 * that has ended are dropped: nothing admits there any more, so a lease
 * that ran to its minute's end settles only its day, month and concurrency
 * counters (3 sums of 6 fewer, 1,000 times a minute with 1,000 busy keys).
 */
type Release = [string, Deno.KvKey, number, number];

/** The releases whose window has not ended by `now`. */
function live(rs: Release[], now: number): Release[] {
  return rs.every((r) => r[3] > now) ? rs : rs.filter((r) => r[3] > now);
}

/**
 * How long after its window ends a release counter this process added to
 * is deleted (see Admitter.#tidy): a `sum` clears a key's expiry, so
 * without this each busy key would leave ~3 rows behind a minute, forever.
 */
const TIDY_AFTER_MS = 60_000;

/** A release counter deleted by a settlement commit (see Admitter.#tidyInto). */
interface Tidy {
  at: number;
  id: string;
  key: Deno.KvKey;
}

interface PendingSettle {
  /** The reservation record to check and delete. */
  id: string;
  versionstamp: string;
  /** Set for a lease: its checkpoint (k.reservationUse) is deleted too. */
  lease?: Lease;
  releases: Release[];
  resolve: (settled: boolean) => void;
  reject: (e: unknown) => void;
}

/**
 * Capacity this process prepaid for one (tenant, key) while it is busy:
 * `n` requests (every rpm and concurrency counter got +n) and `n` times
 * the first request's worst case in tokens (every token counter), held by
 * one reservation record. Requests admitted from it need no KV write;
 * they settle in memory, and the lease settles once (unused requests,
 * tokens and all its slots released) when it has closed and its last
 * request has finished. What it has used is checkpointed in KV at most
 * CHECKPOINT_MS late; a crashed gateway's lease is reclaimed billing that.
 */
export class Lease {
  admitted = 0;
  inFlight = 0;
  tokensHeld = 0;
  tokensUsed = 0;
  /** The reclaimTokens of its requests in flight (billed if it is reclaimed). */
  reclaimHeld = 0;
  closing = false;
  /** What its record still holds in KV (lowered when it shrinks). */
  tokensReserved: number;
  unitsHeld: number;
  /** Unused requests already released. */
  reqReleased = 0;
  shrinking: Promise<void> | null = null;

  readonly planKey!: string;
  readonly signature!: string;
  readonly res!: Reservation;
  readonly stored!: StoredReservation;
  readonly n!: number;
  readonly hasTokens!: boolean;
  readonly reqCounters!: [string, string][];
  /** When it was granted. */
  readonly openedAt!: number;
  /**
   * When it may admit: its grant; a successor, when the lease before ends
   * (or is used up, when both count in the same windows).
   */
  readonly opensAt!: number;
  /** When it began admitting (a successor opens when its predecessor is done). */
  since: number;
  /** Its first window end. */
  readonly windowEnd!: number;
  /**
   * When it closes: its first window end, or 3/4 to all of `leaseMs` after
   * it starts, whichever comes first.
   */
  readonly validUntil!: number;
  /** The quota view right after it was granted. */
  readonly view!: QuotaView;
  /**
   * When its successor is asked for: once `renewAfter` of its requests are
   * used, or with `renewWithinMs` or less to go, whichever comes first.
   * Both come from one fraction drawn at random from RENEW_AT (of its
   * requests, and of `leaseMs`): 1,000 keys whose leases start together
   * at a minute boundary, at the same pace, are renewed over most of the
   * minute, a share in each second, not all in the second they reach the
   * same point.
   */
  readonly renewAfter!: number;
  readonly renewWithinMs!: number;
  /**
   * Set when it closed because its time ran out or its successor took
   * over: its settlement may wait a few seconds (see #deferSettle).
   */
  ended = false;

  constructor(init: {
    planKey: string;
    signature: string;
    res: Reservation;
    stored: StoredReservation;
    n: number;
    hasTokens: boolean;
    reqCounters: [string, string][];
    openedAt: number;
    opensAt: number;
    windowEnd: number;
    validUntil: number;
    view: QuotaView;
    renewAfter: number;
    renewWithinMs: number;
  }) {
    Object.assign(this, init);
    this.since = init.opensAt;
    this.tokensReserved = init.res.tokens;
    this.unitsHeld = init.n;
  }
}

/** What admission derives from a plan, memoized per plan object. */
interface PlanInfo {
  /** `tenant\0key`: its lease's key. */
  key: string;
  /** Its limits as one string (leases end when they change). */
  signature: string;
  /** `subject\0kind` of each rule: the counters a commit checks. */
  counters: string[];
}
const planInfos = new WeakMap<LimitPlan, PlanInfo>();
function planInfo(p: LimitPlan): PlanInfo {
  let info = planInfos.get(p);
  if (info === undefined) {
    info = {
      key: `${p.tenantId}\u0000${p.keyId}`,
      signature: p.rules.map((r) => `${r.subject}:${r.kind}:${r.limit}`)
        .join(","),
      counters: p.rules.map((r) => `${r.subject}\u0000${r.kind}`),
    };
    planInfos.set(p, info);
  }
  return info;
}
const planKey = (p: LimitPlan) => planInfo(p).key;
const signature = (p: LimitPlan) => planInfo(p).signature;

/** One quota counter (a window of a subject) as seen by one commit attempt. */
interface Counter {
  /** `subject\0window`: the cache key. */
  id: string;
  kind: RuleKind;
  key: Deno.KvKey;
  relKey: Deno.KvKey;
  /** When the window ends (epoch ms). */
  end: number;
  /** Admitted (A) and its versionstamp (null: absent). */
  value: number;
  versionstamp: string | null;
  /** Released (R), as last seen: only ever too low, which over-counts usage. */
  released: number;
  /** Added by the requests decided so far in this attempt. */
  added: number;
}

/** Tunables of an `Admitter`. */
export interface AdmitterOptions {
  /** Most requests admitted by one commit (default 128). */
  maxBatch?: number;
  /** Commit attempts before failing closed (default 100). */
  maxAttempts?: number;
  /**
   * Most distinct counters (KV checks) in one commit: Deno KV allows 100;
   * the self-hosted denokv protocol documents 10 (default 100).
   */
  maxChecks?: number;
  /** Admission commits in flight at once, for different tenants (default 2). */
  maxInFlight?: number;
  /** How long a settlement may wait to share its commit with others (default 20 ms). */
  settleDelayMs?: number;
  /**
   * The longest the settlement of a lease that ran its course (ended, or
   * used up) waits (default 15 s; each waits a random share of it, see
   * #deferSettle).
   */
  settleSpreadMs?: number;
  /**
   * How long a lease admits requests, and the span its size is predicted
   * over (default 60 s, so a key with minute limits needs one lease a
   * minute; 0 turns leases off). Longer amortizes the commits of quieter
   * keys; a lease's unused capacity shows as used meanwhile.
   */
  leaseMs?: number;
  /** Most requests one lease prepays (default 256). */
  maxLease?: number;
  /**
   * How long the grant of a lease's successor waits to share its commit
   * with others (default 100 ms); it is asked for once a lease has half of
   * `leaseMs` or less to go, or has used half its requests.
   */
  renewDelayMs?: number;
  /** The gateway instance this admitter admits for, recorded as each reservation's owner. */
  owner?: string;
  /**
   * How long until the holds of gateway instances that stopped beating are
   * reclaimed (GatewayInstance.reclaimDueMs): a concurrency refusal's
   * retry-after is that, when longer than a second.
   */
  reclaimDueMs?: () => number;
}

/**
 * How stale a lease's checkpoint may get (see Admitter.#checkpoint), and
 * so how much of a key's traffic a crash can leave unbilled: half a
 * second, so that with the commit's latency and a busy event loop it stays
 * within the one second README promises.
 */
export const CHECKPOINT_MS = 500;

/**
 * A lease takes at most this share of any window's remaining capacity, and
 * none is granted once a window has room for fewer than LEASE_MIN_ROOM
 * more requests like the one asking: near a limit every request is
 * admitted by its own commit, so gateways sharing the KV never refuse for
 * capacity another one holds idle (leases close within `leaseMs`).
 */
const LEASE_SHARE = 0.1;
const LEASE_MIN_ROOM = 100;
/**
 * Where in its span a lease's successor is asked for, as a fraction drawn
 * at random per lease (of its requests used, or of its time gone). Leases
 * of a minute's windows all start at the minute boundary: drawn from a
 * quarter to a half, the renewals of 1,000 steady keys came in one or two
 * bursts of ~1,500 counter writes a second; over most of the minute, each
 * second takes a share.
 */
const RENEW_AT = [0.1, 0.9] as const;
/**
 * The shortest time a young key's pace is measured over (see #expected):
 * two requests in a burst make a lease of 2 × leaseMs / 10 s (12 a
 * minute), not 2 × leaseMs / their few ms apart.
 */
const YOUNG_RATE_MS = 10_000;

/**
 * Most mutations in one settlement commit. A commit builds and serializes
 * its mutations on the main thread (~2-10 µs each), and 64 leases of 64
 * tenants settled together (a check, a delete and ~8 sums each: ~600)
 * held requests up for ~5 ms.
 */
const MAX_SETTLE_MUTATIONS = 128;

const getManyChunked = async (
  kv: Deno.Kv,
  keys: Deno.KvKey[],
): Promise<Deno.KvEntryMaybe<unknown>[]> => {
  const parts: Promise<Deno.KvEntryMaybe<unknown>[]>[] = [];
  for (let i = 0; i < keys.length; i += 10) {
    parts.push(kv.getMany(keys.slice(i, i + 10)));
  }
  return (await Promise.all(parts)).flat();
};

/**
 * Admits and settles for one gateway process. Admissions queue and are
 * coalesced: one commit admits every queued request of a tenant, and the
 * requests of several tenants together (up to `maxChecks` distinct
 * counters); a tenant has at most one commit in flight, so a hot key does
 * not collapse under retries. Settlements are off the client's path and
 * batched the same way (one check per reservation, sums merged per counter).
 */
export class Admitter {
  readonly #store: Store;
  readonly #maxBatch: number;
  readonly #maxAttempts: number;
  readonly #maxChecks: number;
  readonly #maxInFlight: number;
  readonly #settleDelayMs: number;
  readonly #settleSpreadMs: number;
  readonly #leaseMs: number;
  readonly #maxLease: number;
  readonly #renewDelayMs: number;
  #pending: Pending[] = [];
  readonly #busy = new Set<string>();
  #inFlight = 0;
  readonly #admitted = new Map<
    string,
    { value: number; versionstamp: string | null }
  >();
  readonly #releasedCache = new Map<string, number>();
  /**
   * Release counters this process added to, by when to delete them (see
   * TIDY_AFTER_MS), then by cache id.
   */
  readonly #tidy = new Map<number, Map<string, Deno.KvKey>>();
  #settles: PendingSettle[] = [];
  /** Settlements of leases that ran their course, each queued at `due`. */
  #deferred: { due: number; s: PendingSettle }[] = [];
  #deferTimer: ReturnType<typeof setInterval> | undefined;
  #settleTimer: ReturnType<typeof setTimeout> | undefined;
  #settling: Promise<void> | null = null;
  readonly #leases = new Map<string, Lease>();
  /** Granted successors of open leases, waiting to open. */
  readonly #next = new Map<string, Lease>();
  /** Renewals asked for (until their commit lands), and the ones not queued yet. */
  readonly #renewing = new Set<string>();
  #renewals: Pending[] = [];
  #renewTimer: ReturnType<typeof setTimeout> | undefined;
  /** Commits in flight that grant successors (flush waits for them). */
  readonly #renewCommits = new Set<Promise<void>>();
  readonly #rates = new Map<
    string,
    { count: number; since: number; last: number }
  >();
  #sweep: ReturnType<typeof setInterval> | undefined;
  readonly #owner: string | undefined;
  readonly #reclaimDueMs: () => number;
  /** Leases whose use changed since their last checkpoint (see #checkpoint). */
  readonly #dirty = new Set<Lease>();
  #checkpointTimer: ReturnType<typeof setTimeout> | undefined;
  #checkpointing: Promise<void> | null = null;

  constructor(store: Store, opts: AdmitterOptions = {}) {
    this.#store = store;
    this.#maxBatch = opts.maxBatch ?? 128;
    this.#maxAttempts = opts.maxAttempts ?? 100;
    this.#maxChecks = Math.min(opts.maxChecks ?? 100, 100);
    this.#maxInFlight = opts.maxInFlight ?? 2;
    this.#settleDelayMs = opts.settleDelayMs ?? 20;
    this.#settleSpreadMs = opts.settleSpreadMs ?? 15_000;
    this.#leaseMs = opts.leaseMs ?? 60_000;
    this.#maxLease = opts.maxLease ?? 256;
    this.#renewDelayMs = opts.renewDelayMs ?? 100;
    this.#owner = opts.owner;
    this.#reclaimDueMs = opts.reclaimDueMs ?? (() => 0);
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
    const now = Date.now();
    const pk = planKey(req.plan);
    this.#countRate(pk, now);
    const leased = this.#fromLease(pk, req, now);
    if (leased) return Promise.resolve(leased);
    return new Promise((resolve, reject) => {
      this.#pending.push({ req, resolve, reject });
      this.#pump();
    });
  }

  /** Counts an admission attempt of a plan (for lease sizing). */
  #countRate(pk: string, now: number): void {
    const span = this.#leaseMs;
    if (span <= 0) return; // leases off
    let r = this.#rates.get(pk);
    if (!r) {
      if (this.#rates.size >= 100_000) this.#rates.clear();
      r = { count: 0, since: now, last: 0 };
      this.#rates.set(pk, r);
    } else if (now - r.since >= span) {
      // A new period; the one before counts only if it just ended.
      r.last = now - r.since < 2 * span ? r.count : 0;
      r.count = 0;
      r.since = now - ((now - r.since) % span);
    }
    r.count++;
  }

  /**
   * Requests a plan is expected to make in the next `leaseMs`: its count
   * over the last `leaseMs` (the current period plus the part of the one
   * before that it still covers), so a key making one request a second
   * gets a lease of sixty, and a key seen once none. A key seen for less
   * than `leaseMs` (new, or back after an idle period) has its count so
   * far scaled up to `leaseMs`, over at least YOUNG_RATE_MS: its first
   * lease is then sized for its pace, not for the few requests it has made
   * yet (after a restart, 1,000 keys at one request every two seconds took
   * ~30 s of small leases, each a grant and a settlement, to get there).
   */
  #expected(pk: string, now: number): number {
    const r = this.#rates.get(pk);
    if (!r) return 0;
    const seen = now - r.since;
    if (r.last === 0 && r.count >= 2) {
      return r.count * this.#leaseMs /
        Math.min(this.#leaseMs, Math.max(YOUNG_RATE_MS, seen));
    }
    const into = Math.min(1, seen / this.#leaseMs);
    return r.count + r.last * (1 - into);
  }

  /**
   * When a lease's successor starts, and so which windows it counts in:
   * when the lease ends; but at once, in the lease's own windows, when a
   * lease cut short by its window's end would be used up before then (else
   * each request until that window ends would wait for a commit). Its pace
   * (from its second request on) and the plan's average rate must both say
   * so: a bursty key's lease that would run out only if its burst went on
   * gets its successor past the window's end.
   */
  #successorStart(prev: Lease, now: number): number {
    if (prev.validUntil >= prev.windowEnd && prev.admitted >= 2) {
      // Its pace, counted from its first request (a successor opens with it).
      const perMs = Math.min(
        (prev.admitted - 1) / Math.max(1, now - prev.since),
        this.#perMs(prev.planKey, now),
      );
      const left = prev.n - prev.admitted;
      if (now + left / perMs < prev.validUntil) return now;
    }
    return Math.max(now, prev.validUntil);
  }

  /**
   * A plan's requests a ms: over the last `leaseMs`, or, seen for less
   * time, over the time it was seen (a second at least).
   */
  #perMs(pk: string, now: number): number {
    const r = this.#rates.get(pk);
    if (!r) return 0;
    if (r.last > 0) return this.#expected(pk, now) / this.#leaseMs;
    return r.count / Math.max(1000, now - r.since);
  }

  /**
   * Admits from the plan's open lease, when it has room: no KV write. A
   * lease that has ended or is used up closes, and its successor, once
   * open, takes over.
   */
  #fromLease(pk: string, req: AdmissionRequest, now: number): Admission | null {
    let l: Lease | undefined;
    for (;;) {
      l = this.#leases.get(pk) ?? this.#open(pk, now);
      if (!l) return null;
      if (
        now < l.validUntil && l.signature === signature(req.plan) &&
        l.admitted < l.n &&
        (!l.hasTokens ||
          l.res.tokens - l.tokensHeld - l.tokensUsed >= req.tokens)
      ) break;
      // Ended or used up, it ran its course: its settlement may wait.
      this.#close(l, now >= l.validUntil || l.admitted >= l.n);
    }
    l.admitted++;
    l.inFlight++;
    const reclaimTokens = Math.min(req.tokens, req.reclaimTokens);
    if (l.hasTokens) {
      l.tokensHeld += req.tokens;
      l.reclaimHeld += reclaimTokens;
    }
    this.#changed(l);
    const toGo = l.validUntil - now;
    const next = this.#next.get(pk);
    if (
      next && !this.#renewing.has(pk) && next.validUntil <= l.validUntil &&
      toGo <= l.renewWithinMs && l.admitted >= 2 &&
      this.#successorStart(l, now) > now
    ) {
      // A successor granted in this lease's windows, for a burst that has
      // since slowed down, would end with it unused: it goes back, and one
      // in the next windows is asked for below (else every key slowing
      // down after a burst commits on the path after the window's end).
      this.#close(next, true);
    }
    // With renewWithinMs or less to go, or renewAfter requests used (past
    // half of them, without delay: it may run out within it), its
    // successor is asked for.
    // A lease cut short by its window's end asks from its second request on:
    // its pace then tells which windows the successor counts in (see
    // #successorStart). A key quieter than that commits once after the end.
    if (!this.#renewing.has(pk) && !this.#next.has(pk)) {
      if (l.admitted >= l.renewAfter) {
        this.#renew(pk, l, req, 2 * l.admitted >= l.n ? 0 : this.#renewDelayMs);
      } else if (
        toGo <= l.renewWithinMs &&
        (l.admitted >= 2 || l.validUntil < l.windowEnd)
      ) this.#renew(pk, l, req, this.#renewDelayMs);
    }
    return {
      ok: true,
      reservation: {
        id: l.res.id,
        versionstamp: l.res.versionstamp,
        tokens: req.tokens,
        tokenCounters: [],
        concCounters: [],
        lease: l,
        reclaimTokens,
      },
      view: leaseView(l, now),
    };
  }

  /** Opens the plan's successor lease, once its time has come. */
  #open(pk: string, now: number): Lease | undefined {
    const s = this.#next.get(pk);
    if (!s || now < s.opensAt) return undefined;
    this.#next.delete(pk);
    s.since = now;
    this.#activate(s);
    return s;
  }

  /**
   * Queues the grant of `l`'s successor (sized like any lease, counted in
   * the windows it starts in: see #successorStart) to open when `l` ends,
   * or is used up: a key
   * in steady or rising use never waits for a commit, and the leases
   * ending at a minute boundary are renewed over the seconds before it, in
   * shared commits, not all at once after it.
   */
  #renew(pk: string, l: Lease, req: AdmissionRequest, delayMs: number): void {
    this.#renewing.add(pk);
    this.#renewals.push({
      req,
      renews: l,
      resolve: () => this.#renewing.delete(pk),
      reject: () => this.#renewing.delete(pk), // KV down: asked again
    });
    if (this.#renewTimer !== undefined) {
      if (delayMs > 0) return; // the armed timer takes it
      clearTimeout(this.#renewTimer);
    }
    // A timer even for no delay: this may run inside #take.
    this.#renewTimer = setTimeout(() => {
      this.#renewTimer = undefined;
      this.#pending.push(...this.#renewals);
      this.#renewals = [];
      this.#pump();
    }, delayMs);
  }

  /**
   * Stops a lease admitting; it settles once its last request is done
   * (`ended`: it ran its course, and its settlement may wait a little).
   */
  #close(l: Lease, ended = false): void {
    if (l.closing) return;
    l.closing = true;
    l.ended = ended;
    if (this.#leases.get(l.planKey) === l) this.#leases.delete(l.planKey);
    else if (this.#next.get(l.planKey) === l) this.#next.delete(l.planKey);
    if (
      this.#leases.size === 0 && this.#next.size === 0 &&
      this.#sweep !== undefined
    ) {
      clearInterval(this.#sweep);
      this.#sweep = undefined;
    }
    if (l.inFlight === 0) this.#settleLease(l);
  }

  /** Queues a closed, idle lease's settlement: unused requests and tokens, and every slot, go back. */
  #settleLease(l: Lease): void {
    if (l.shrinking) {
      void l.shrinking.then(() => this.#settleLease(l));
      return;
    }
    const s: PendingSettle = {
      id: l.res.id,
      versionstamp: l.res.versionstamp,
      lease: l,
      releases: leaseReleases(
        l,
        l.hasTokens ? l.tokensReserved - l.tokensUsed : 0,
        l.unitsHeld,
        l.n - l.admitted - l.reqReleased,
      ),
      resolve: () => {},
      reject: () => {}, // KV down: reclaimed with its owner, or by its deadline
    };
    if (l.ended) this.#deferSettle(s);
    else this.#queueSettle(s);
  }

  /**
   * Queues the settlement of a lease that ran its course up to
   * `settleSpreadMs` later, at random: the 1,000 leases that end at a
   * minute boundary settle over those seconds, a few per commit, instead
   * of in a burst of commits that holds up requests. What they give back
   * counts as used meanwhile (conservative); a refusal and `flush()` land
   * them at once.
   */
  #deferSettle(s: PendingSettle): void {
    this.#deferred.push({
      due: Date.now() + this.#settleSpreadMs * Math.random(),
      s,
    });
    if (this.#deferTimer !== undefined) return;
    const timer = setInterval(() => {
      const now = Date.now();
      const keep: { due: number; s: PendingSettle }[] = [];
      for (const d of this.#deferred) {
        if (d.due <= now) this.#queueSettle(d.s);
        else keep.push(d);
      }
      this.#deferred = keep;
      if (keep.length === 0) this.#stopDeferred();
    }, Math.max(10, this.#settleSpreadMs / 20));
    Deno.unrefTimer(timer);
    this.#deferTimer = timer;
  }

  /** Queues every deferred settlement now. */
  #undefer(): void {
    for (const d of this.#deferred) {
      if (d.s.lease) this.#dirty.delete(d.s.lease);
      this.#settles.push(d.s);
    }
    this.#deferred = [];
    this.#stopDeferred();
  }

  #stopDeferred(): void {
    clearInterval(this.#deferTimer);
    this.#deferTimer = undefined;
  }

  /**
   * Releases at once what a closed lease still serving requests will not
   * use (its unused requests and tokens, its idle slots), rewriting its
   * record to hold only what is in flight.
   */
  #shrink(l: Lease): Promise<void> {
    if (l.inFlight === 0 || l.shrinking) {
      return l.shrinking ?? Promise.resolve();
    }
    const tokens = l.hasTokens ? l.tokensUsed + l.tokensHeld : 0;
    const rs = live(
      leaseReleases(
        l,
        l.hasTokens ? l.tokensReserved - tokens : 0,
        l.unitsHeld - l.inFlight,
        l.n - l.admitted - l.reqReleased,
      ),
      Date.now(),
    );
    if (rs.length === 0) return Promise.resolve();
    const key = k.reservation(l.res.id);
    const stored: StoredReservation = {
      ...l.stored,
      tokens,
      reclaimTokens: Math.min(tokens, l.tokensUsed + l.reclaimHeld),
      units: l.inFlight,
      requests: l.admitted,
      reclaimRequests: l.admitted,
    };
    const op = this.#store.kv.atomic()
      .check({ key, versionstamp: l.res.versionstamp })
      .set(key, stored, { expireIn: l.stored.deadline - Date.now() + 7 * DAY });
    for (const [, k2, n] of rs) op.sum(k2, BigInt(n));
    const units = l.inFlight;
    const reqReleased = l.n - l.admitted;
    l.shrinking = op.commit().then((res) => {
      if (!res.ok) return;
      l.res.versionstamp = res.versionstamp;
      l.tokensReserved = tokens;
      l.unitsHeld = units;
      l.reqReleased = reqReleased;
      this.#released(rs);
    }, () => {}).finally(() => l.shrinking = null);
    return l.shrinking;
  }

  /** Marks a lease's use changed: it is checkpointed within CHECKPOINT_MS. */
  #changed(l: Lease): void {
    this.#dirty.add(l);
    if (this.#checkpointTimer !== undefined) return;
    this.#checkpointTimer = setTimeout(() => {
      this.#checkpointTimer = undefined;
      // After the one before, if it is still running (one at a time).
      const run = (this.#checkpointing ?? Promise.resolve())
        .then(() => this.#checkpoint());
      this.#checkpointing = run;
      void run.finally(() => {
        if (this.#checkpointing === run) this.#checkpointing = null;
      });
    }, CHECKPOINT_MS);
    Deno.unrefTimer(this.#checkpointTimer);
  }

  /**
   * Writes what each changed lease has used to its checkpoint
   * (k.reservationUse): its finished requests' tokens plus its in-flight
   * requests' reclaimTokens, and the requests it admitted. A reclaim after
   * a crash bills exactly that, so a counter misses at most the last
   * CHECKPOINT_MS of a key's traffic and never keeps a lease's unused
   * capacity. Blind sets (a reclaim checks the lease's record, not this),
   * up to MAX_SETTLE_MUTATIONS a commit: a busy key costs two sets a
   * second, 1,000 of them ~16 commits. What fails is written next time.
   */
  async #checkpoint(): Promise<void> {
    const leases = [...this.#dirty];
    this.#dirty.clear();
    const now = Date.now();
    for (let i = 0; i < leases.length; i += MAX_SETTLE_MUTATIONS) {
      const part = leases.slice(i, i + MAX_SETTLE_MUTATIONS);
      let ok = false;
      try {
        const op = this.#store.kv.atomic();
        for (const l of part) {
          const use: ReservationUse = {
            tokens: l.tokensUsed + l.reclaimHeld,
            requests: l.admitted,
          };
          op.set(k.reservationUse(l.res.id), use, {
            expireIn: Math.max(0, l.stored.deadline - now) + DAY,
          });
        }
        ok = (await op.commit()).ok;
      } catch { /* KV down: next time */ }
      if (!ok) { for (const l of part) this.#changed(l); }
    }
  }

  /**
   * Closes every lease, giving nothing back: this instance was presumed
   * dead and another reclaimed what it held (GatewayInstance `onLost`).
   */
  dropLeases(): void {
    this.#closeLeases(null);
  }

  /** Closes the leases of `tenants` (all when null; successors too); returns those closed. */
  #closeLeases(tenants: Set<string> | null): Lease[] {
    const closed: Lease[] = [];
    for (const l of [...this.#leases.values(), ...this.#next.values()]) {
      if (!tenants || tenants.has(l.planKey.split("\u0000")[0]!)) {
        this.#close(l);
        closed.push(l);
      }
    }
    return closed;
  }

  /** Opens a lease (`next`: holds it as the open lease's successor). */
  #activate(l: Lease, next = false): void {
    const map = next ? this.#next : this.#leases;
    const old = map.get(l.planKey);
    if (old) this.#close(old, true);
    map.set(l.planKey, l);
    if (this.#sweep === undefined) {
      const sweep = setInterval(() => {
        const t = Date.now();
        for (const l of [...this.#leases.values(), ...this.#next.values()]) {
          if (t >= l.validUntil) this.#close(l, true);
        }
      }, Math.min(this.#leaseMs, 1000));
      this.#sweep = sweep;
      Deno.unrefTimer(sweep);
    }
  }

  /** Starts commits while a slot is free and a tenant without one in flight waits. */
  #pump(): void {
    while (this.#inFlight < this.#maxInFlight && this.#pending.length > 0) {
      const batch = this.#take();
      if (batch.length === 0) return; // every waiting tenant has a commit in flight
      this.#inFlight++;
      const tenants = new Set(batch.map((p) => p.req.plan.tenantId));
      for (const t of tenants) this.#busy.add(t);
      this.#run(batch).finally(() => {
        for (const t of tenants) this.#busy.delete(t);
        this.#inFlight--;
        this.#pump();
      });
    }
  }

  /** Takes the next batch: waiting requests of idle tenants, in order, within the check budget. */
  #take(): Pending[] {
    const batch: Pending[] = [];
    const rest: Pending[] = [];
    const counters = new Set<string>();
    /** Checks of successors: theirs alone (they may be in later windows). */
    let own = 0;
    const now = Date.now();
    const pending = this.#pending;
    for (let i = 0; i < pending.length; i++) {
      const p = pending[i]!;
      if (
        batch.length >= this.#maxBatch ||
        counters.size + own >= this.#maxChecks
      ) {
        // Full: the rest wait, unread (each scan of a long queue would
        // cost as much as its commit).
        for (let j = i; j < pending.length; j++) rest.push(pending[j]!);
        break;
      }
      const leased = !p.renews &&
        this.#fromLease(planKey(p.req.plan), p.req, now);
      if (leased) {
        p.resolve(leased);
        continue;
      }
      if (this.#busy.has(p.req.plan.tenantId)) {
        rest.push(p);
        continue;
      }
      const ids = planInfo(p.req.plan).counters;
      let added = p.renews ? ids.length : 0;
      if (!p.renews) { for (const id of ids) if (!counters.has(id)) added++; }
      if (batch.length > 0 && counters.size + own + added > this.#maxChecks) {
        rest.push(p);
        continue;
      }
      batch.push(p);
      if (p.renews) own += ids.length;
      else for (const id of ids) counters.add(id);
    }
    this.#pending = rest;
    return batch;
  }

  #run(batch: Pending[]): Promise<void> {
    const run = this.#admitBatch(batch);
    if (batch.some((p) => p.renews)) {
      this.#renewCommits.add(run);
      void run.finally(() => this.#renewCommits.delete(run));
    }
    return run;
  }

  async #admitBatch(batch: Pending[]): Promise<void> {
    try {
      const results = await this.#commit(batch);
      batch.forEach((p, i) => p.resolve(results[i]!));
    } catch (e) {
      const err = e instanceof QuotaUnavailableError
        ? e
        : new QuotaUnavailableError("Cannot reach the quota store", {
          cause: e,
        });
      for (const p of batch) p.reject(err);
    }
  }

  async #commit(batch: Pending[]): Promise<Admission[]> {
    const kv = this.#store.kv;
    const reqs = batch.map((p) => p.req);
    for (let attempt = 0; attempt < this.#maxAttempts; attempt++) {
      const now = Date.now();
      const counters = new Map<string, Counter>();
      // A successor counts in the windows it starts in, decided once here:
      // its lease may admit more while this commit waits for reads.
      const starts = batch.map((p) =>
        p.renews ? this.#successorStart(p.renews, now) : now
      );
      const per = batch.map((p, i) =>
        p.req.plan.rules.map((r) => {
          const [window, end] = windowOf(r.kind, starts[i]!);
          const id = `${r.subject}\u0000${window}`;
          let c = counters.get(id);
          if (!c) {
            c = {
              id,
              kind: r.kind,
              key: k.quotaCounter(r.subject, window),
              relKey: k.quotaCounter(r.subject, rel(window)),
              end,
              value: 0,
              versionstamp: null,
              released: this.#releasedCache.get(id) ?? 0,
              added: 0,
            };
            counters.set(id, c);
          }
          return c;
        })
      );
      const all = [...counters.values()];
      // Admission counters: cached from our own commits, else read. A
      // counter not cached yet is first assumed absent (`check` with a null
      // versionstamp): if it exists the commit fails and it is read below.
      const unknown: Counter[] = [];
      for (const c of all) {
        const cached = this.#admitted.get(c.id);
        if (cached) {
          c.value = cached.value;
          c.versionstamp = cached.versionstamp;
        } else if (attempt > 0) unknown.push(c);
      }
      if (unknown.length > 0) {
        const read = await getManyChunked(kv, unknown.map((c) => c.key));
        unknown.forEach((c, i) => {
          c.value = u64(read[i]!.value);
          c.versionstamp = read[i]!.versionstamp;
          this.#cacheAdmitted(c.id, c);
        });
      }
      let out = this.#decideAll(batch, per, starts, now);
      const refused = out.admissions.flatMap((a, i) => a.ok ? [] : [i]);
      if (refused.length > 0) {
        // Before refusing: this tenant's leases close, our own releases
        // land, then the release counters of the refused are read fresh.
        const tenants = new Set(refused.map((i) => reqs[i]!.plan.tenantId));
        const closed = this.#closeLeases(tenants);
        await Promise.all(closed.map((l) => this.#shrink(l)));
        await this.#flushSettles();
        const need = new Set<Counter>();
        for (const i of refused) for (const c of per[i]!) need.add(c);
        const list = [...need];
        if (list.length > 0) {
          const read = await getManyChunked(kv, list.map((c) => c.relKey));
          list.forEach((c, i) => {
            c.released = Math.max(c.released, u64(read[i]!.value));
            this.#setReleased(c.id, c.released);
          });
        }
        for (const c of all) c.added = 0;
        out = this.#decideAll(batch, per, starts, now);
      }
      if (out.admitted === 0 && out.leases.length === 0) {
        return out.admissions;
      }
      const op = out.op;
      for (const c of all) {
        op.check({ key: c.key, versionstamp: c.versionstamp });
        if (c.added > 0) {
          op.set(c.key, new Deno.KvU64(BigInt(c.value + c.added)), {
            // A minute's counter lives as long as its release counter
            // (see TIDY_AFTER_MS), a day's or month's a day longer.
            expireIn: c.kind === "concurrency" ? undefined : c.end - now +
              (c.kind === "rpm" || c.kind === "tpm" ? TIDY_AFTER_MS : DAY),
          });
        }
      }
      const res = await op.commit();
      if (res.ok) {
        for (const c of all) {
          if (c.added > 0) {
            this.#cacheAdmitted(c.id, {
              value: c.value + c.added,
              versionstamp: res.versionstamp,
            });
          }
        }
        for (const a of out.admissions) {
          if (a.ok && a.reservation) {
            a.reservation.versionstamp = res.versionstamp;
          }
        }
        for (const l of out.leases) {
          l.res.versionstamp = res.versionstamp;
          if (l.opensAt === l.openedAt && !this.#leases.has(l.planKey)) {
            this.#activate(l);
          } else this.#activate(l, true);
        }
        return out.admissions;
      }
      for (const c of all) this.#admitted.delete(c.id); // another instance moved: re-read
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
    this.#admitted.set(id, { value: c.value, versionstamp: c.versionstamp });
  }

  #setReleased(id: string, value: number): void {
    if (this.#releasedCache.size >= 100_000) this.#releasedCache.clear();
    this.#releasedCache.set(id, value);
  }

  #decideAll(
    batch: Pending[],
    per: Counter[][],
    starts: number[],
    now: number,
  ) {
    const op = this.#store.kv.atomic();
    const admissions: Admission[] = [];
    const leases: Lease[] = [];
    let admitted = 0;
    batch.forEach(({ req, renews }, i) => {
      const pk = planKey(req.plan);
      const granted = leases.some((l) => l.planKey === pk);
      if (renews) {
        admissions.push({ ok: true, reservation: null, view: renews.view });
        // Not when a successor or a newer lease was granted meanwhile. A
        // lease used up meanwhile (a burst) still gets it.
        const open = this.#leases.get(pk);
        if (granted || this.#next.has(pk) || (open && open !== renews)) return;
        const l = this.#grantSuccessor(
          renews,
          starts[i]!,
          req,
          per[i]!,
          now,
          op,
        );
        if (l) leases.push(l);
        return;
      }
      const a = this.#decide(req, per[i]!, now, op);
      admissions.push(a);
      if (!a.ok) return;
      admitted++;
      if (!granted && !this.#leases.has(pk)) {
        const l = this.#grantLease(pk, req, per[i]!, now, op);
        if (l) leases.push(l);
      }
    });
    return { admissions, admitted, op, leases };
  }

  /**
   * Adds `prev`'s successor to the commit: its span starts `at` (when
   * `prev` ends, or earlier: see #successorStart), in the windows of that
   * moment; it opens then, or, counting in the same windows as `prev`, as
   * soon as `prev` is used up. A lease used faster than its rate predicted
   * (a burst) gets one sized at the pace it was used, up to 4 times it.
   */
  #grantSuccessor(
    prev: Lease,
    at: number,
    req: AdmissionRequest,
    cs: Counter[],
    now: number,
    op: Deno.AtomicOperation,
  ): Lease | null {
    const sameWindows = at < prev.windowEnd;
    const pace = Math.min(
      4 * prev.n,
      Math.floor(
        prev.admitted * this.#leaseMs / Math.max(1, now - prev.since),
      ),
    );
    return this.#grantLease(
      prev.planKey,
      req,
      cs,
      now,
      op,
      at,
      sameWindows ? now : at,
      pace,
    );
  }

  /**
   * Adds a lease for a busy plan to the commit (it opens once the commit
   * lands, or, a successor, at `opensAt`): as many requests as it
   * makes in `leaseMs`, or `atLeast` (at most `maxLease`; see LEASE_SHARE
   * and LEASE_MIN_ROOM).
   */
  #grantLease(
    pk: string,
    req: AdmissionRequest,
    cs: Counter[],
    now: number,
    op: Deno.AtomicOperation,
    startsAt = now,
    opensAt = now,
    atLeast = 0,
  ): Lease | null {
    if (this.#leaseMs <= 0) return null;
    const rules = req.plan.rules;
    let windowEnd = Infinity;
    rules.forEach((r, i) => {
      if (r.kind !== "concurrency") windowEnd = Math.min(windowEnd, cs[i]!.end);
    });
    // Leases granted together (a minute boundary, a restart) end at random
    // within the last quarter of leaseMs, not all in the same second. One
    // that would end less than half of leaseMs before its window does runs
    // to the window's end instead: the stub after it would cost a grant and
    // a settlement for a few requests (a third of all leases in a minute).
    let validUntil = Math.min(
      windowEnd,
      Math.floor(startsAt + this.#leaseMs * (0.75 + 0.25 * Math.random())),
    );
    if (2 * (windowEnd - validUntil) < this.#leaseMs) validUntil = windowEnd;
    // Sized for its span (rates are per leaseMs; a shorter one keeps the
    // full size: what it does not use goes back when it settles).
    const span = Math.max(1, (validUntil - startsAt) / this.#leaseMs);
    let n = Math.min(
      this.#maxLease,
      Math.floor(span * Math.max(atLeast, this.#expected(pk, now))),
    );
    for (let i = 0; i < rules.length && n >= 2; i++) {
      const r = rules[i]!;
      const unit = isTokenRule(r.kind) ? Math.max(1, req.tokens) : 1;
      const free = (r.limit - used(cs[i]!)) / unit; // requests like this one
      if (free < LEASE_MIN_ROOM) return null;
      n = Math.min(n, Math.floor(free * LEASE_SHARE));
    }
    if (n < 2) return null;
    const tokenCounters: [string, string][] = [];
    const concCounters: [string, string][] = [];
    const reqCounters: [string, string][] = [];
    const hasTokens = rules.some((r) => isTokenRule(r.kind));
    const tokens = hasTokens ? n * req.tokens : 0;
    rules.forEach((r, i) => {
      const c = cs[i]!;
      const w: [string, string] = [r.subject, c.id.slice(r.subject.length + 1)];
      if (isTokenRule(r.kind)) {
        c.added += tokens;
        tokenCounters.push(w);
      } else {
        c.added += n;
        (r.kind === "concurrency" ? concCounters : reqCounters).push(w);
      }
    });
    // Requests join until it ends, then each finishes within ttlMs.
    const deadline = Math.max(startsAt + this.#leaseMs, validUntil) +
      req.ttlMs;
    const id = newIdAt(deadline);
    const renewAt = RENEW_AT[0] + (RENEW_AT[1] - RENEW_AT[0]) * Math.random();
    // Nothing used yet: its checkpoints (see #checkpoint) say what it uses.
    const stored: StoredReservation = {
      tenantId: req.plan.tenantId,
      keyId: req.plan.keyId,
      owner: this.#owner,
      deadline,
      tokens,
      reclaimTokens: 0,
      units: n,
      tokenCounters,
      concCounters,
      requests: n,
      reclaimRequests: 0,
      reqCounters,
    };
    op.set(k.reservation(id), stored, { expireIn: req.ttlMs + 7 * DAY });
    return new Lease({
      planKey: pk,
      signature: signature(req.plan),
      res: { id, versionstamp: "", tokens, tokenCounters, concCounters },
      stored,
      n,
      hasTokens,
      reqCounters,
      openedAt: now,
      opensAt,
      windowEnd,
      validUntil,
      view: viewOf(rules, cs, now),
      // Asked for at a random point of its span (see Lease.renewAfter); by
      // count, one request before the last at the latest.
      renewAfter: Math.max(1, Math.min(n - 1, Math.ceil(n * renewAt))),
      // By time, with a share of leaseMs to go: one cut short by its
      // window's end (a few seconds) asks from its second request on.
      renewWithinMs: this.#leaseMs * (1 - renewAt),
    });
  }

  /** Decides one request against the running counters, adding its reservation to `op`. */
  #decide(
    req: AdmissionRequest,
    cs: Counter[],
    now: number,
    op: Deno.AtomicOperation,
  ): Admission {
    const rules = req.plan.rules;
    let grant = req.tokens;
    for (let i = 0; i < rules.length; i++) {
      const r = rules[i]!;
      if (isTokenRule(r.kind)) grant = Math.min(grant, r.limit - used(cs[i]!));
    }
    for (let i = 0; i < rules.length; i++) {
      const r = rules[i]!;
      const over = isTokenRule(r.kind)
        ? grant < req.minTokens || grant <= 0
        : used(cs[i]!) + 1 > r.limit;
      if (over) {
        const quota = r.kind === "day" || r.kind === "month";
        return {
          ok: false,
          reason: quota ? "quota" : "rate",
          rule: r,
          // A slot frees when a request ends (any moment: 1 s), or when a
          // gateway that stopped beating is reclaimed.
          retryAfterMs: r.kind === "concurrency"
            ? Math.max(1000, this.#reclaimDueMs())
            : cs[i]!.end - now,
          view: viewOf(rules, cs, now),
        };
      }
    }
    const tokenCounters: [string, string][] = [];
    const concCounters: [string, string][] = [];
    for (let i = 0; i < rules.length; i++) {
      const r = rules[i]!;
      const c = cs[i]!;
      const window = c.id.slice(r.subject.length + 1);
      if (isTokenRule(r.kind)) {
        c.added += grant;
        tokenCounters.push([r.subject, window]);
      } else {
        c.added += 1;
        if (r.kind === "concurrency") concCounters.push([r.subject, window]);
      }
    }
    const view = viewOf(rules, cs, now);
    if (tokenCounters.length === 0 && concCounters.length === 0) {
      return { ok: true, reservation: null, view };
    }
    const deadline = now + req.ttlMs;
    const id = newIdAt(deadline);
    const stored: StoredReservation = {
      tenantId: req.plan.tenantId,
      keyId: req.plan.keyId,
      owner: this.#owner,
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

  /**
   * Settles a reservation to the actual usage (clamped to the grant) off
   * the client's path: it waits up to `settleDelayMs` to share one commit
   * with other settlements. Resolves false when it was already settled or
   * reclaimed; rejects when KV fails.
   */
  settle(r: Reservation, actualTokens: number): Promise<boolean> {
    const l = r.lease;
    if (l) {
      l.inFlight--;
      if (l.hasTokens) {
        l.tokensHeld -= r.tokens;
        l.reclaimHeld -= r.reclaimTokens ?? 0;
        l.tokensUsed += Math.max(
          0,
          Math.min(r.tokens, Math.ceil(actualTokens)),
        );
      }
      this.#changed(l);
      if (l.closing && l.inFlight === 0) this.#settleLease(l);
      return Promise.resolve(true);
    }
    return new Promise((resolve, reject) =>
      this.#queueSettle({
        id: r.id,
        versionstamp: r.versionstamp,
        releases: releases(r, actualTokens),
        resolve,
        reject,
      })
    );
  }

  #queueSettle(s: PendingSettle): void {
    // Its settlement bills it exactly: no checkpoint needed any more.
    if (s.lease) this.#dirty.delete(s.lease);
    this.#settles.push(s);
    this.#kickSettles(
      this.#settles.length >= this.#settleBatch() ? 0 : this.#settleDelayMs,
    );
  }

  /**
   * Closes every lease (those still serving requests settle when their last
   * one ends) and resolves once every settlement queued is committed.
   */
  async flush(): Promise<void> {
    clearTimeout(this.#renewTimer);
    this.#renewTimer = undefined;
    this.#renewals = [];
    this.#pending = this.#pending.filter((p) => !p.renews);
    this.#renewing.clear();
    await Promise.all(this.#renewCommits);
    this.#closeLeases(null);
    await this.#flushSettles();
    await this.#checkpointing;
    if (this.#dirty.size === 0) {
      clearTimeout(this.#checkpointTimer);
      this.#checkpointTimer = undefined;
    }
  }

  async #flushSettles(): Promise<void> {
    this.#undefer();
    while (this.#settles.length > 0 || this.#settling) {
      this.#kickSettles(0);
      await this.#settling;
    }
  }

  #settleBatch(): number {
    return Math.min(this.#maxChecks, 64);
  }

  /**
   * How many of the queued settlements the next commit takes: up to a
   * batch, within MAX_SETTLE_MUTATIONS (a check and a delete each, a
   * lease's checkpoint deleted, and a sum per counter released:
   * settlements of one tenant share theirs), at least one.
   */
  #nextSettles(): number {
    const max = Math.min(this.#settleBatch(), this.#settles.length);
    const counters = new Set<string>();
    let ops = 0;
    let n = 0;
    for (; n < max; n++) {
      const s = this.#settles[n]!;
      for (const [id] of s.releases) counters.add(id);
      ops += s.lease ? 3 : 2;
      if (n > 0 && ops + counters.size > MAX_SETTLE_MUTATIONS) break;
    }
    return n;
  }

  #kickSettles(delayMs: number): void {
    if (this.#settling) return; // the running drain takes what was queued
    if (delayMs > 0) {
      this.#settleTimer ??= setTimeout(() => {
        this.#settleTimer = undefined;
        this.#settling ??= this.#drainSettles();
      }, delayMs);
      return;
    }
    clearTimeout(this.#settleTimer);
    this.#settleTimer = undefined;
    this.#settling = this.#drainSettles();
  }

  async #drainSettles(): Promise<void> {
    try {
      while (this.#settles.length > 0) {
        await this.#settleMany(this.#settles.splice(0, this.#nextSettles()));
      }
    } finally {
      this.#settling = null;
    }
  }

  /**
   * One commit for a batch. When a check fails (one was already settled or
   * reclaimed), those are dropped and the rest committed again; when KV
   * fails, one by one (each rejecting on its own).
   */
  async #settleMany(batch: PendingSettle[]): Promise<void> {
    for (let attempt = 0; attempt < 2 && batch.length > 0; attempt++) {
      const ok = await this.#commitSettles(batch).catch(() => null);
      if (ok === null) break;
      if (ok) return;
      const held = await getManyChunked(
        this.#store.kv,
        batch.map((s) => k.reservation(s.id)),
      ).catch(() => null);
      if (!held) break;
      batch = batch.filter((s, i) => {
        if (held[i]!.versionstamp === s.versionstamp) return true;
        s.resolve(false);
        return false;
      });
    }
    for (const s of batch) {
      try {
        s.releases = live(s.releases, Date.now());
        const ok = await settleOne(
          this.#store,
          s.id,
          s.versionstamp,
          s.releases,
          s.lease !== undefined,
        );
        if (ok) this.#released(s.releases);
        s.resolve(ok);
      } catch (e) {
        s.reject(e);
      }
    }
  }

  /** Commits a batch of settlements (one check each, sums merged per counter). */
  async #commitSettles(batch: PendingSettle[]): Promise<boolean> {
    const op = this.#store.kv.atomic();
    const now = Date.now();
    const sums = new Map<string, { key: Deno.KvKey; n: number }>();
    let mutations = 0;
    for (const s of batch) {
      const key = k.reservation(s.id);
      mutations += s.lease ? 3 : 2;
      op.check({ key, versionstamp: s.versionstamp }).delete(key);
      if (s.lease) op.delete(k.reservationUse(s.id));
      s.releases = live(s.releases, now);
      for (const [id, key, n] of s.releases) {
        const e = sums.get(id);
        if (e) e.n += n;
        else sums.set(id, { key, n });
      }
    }
    for (const { key, n } of sums.values()) op.sum(key, BigInt(n));
    const tidied = this.#tidyInto(
      op,
      MAX_SETTLE_MUTATIONS - mutations - sums.size,
      now,
    );
    let ok = false;
    try {
      ok = (await op.commit()).ok;
    } finally {
      // Not deleted: tracked again for the next commit.
      if (!ok) { for (const t of tidied) this.#toTidy(t.at, t.id, t.key); }
    }
    if (!ok) return false;
    for (const s of batch) {
      this.#released(s.releases);
      s.resolve(true);
    }
    return true;
  }

  /** Adds a committed release to the cached release counters (which stay ≤ the truth). */
  #released(rs: Release[]): void {
    for (const [id, key, n, end] of rs) {
      const v = this.#releasedCache.get(id);
      if (v !== undefined) this.#releasedCache.set(id, v + n);
      if (end !== Infinity) this.#toTidy(end + TIDY_AFTER_MS, id, key);
    }
  }

  /**
   * Reclaims crashed gateways' expired reservations (see reclaimExpired),
   * deleting the release counters it adds to after their window, as this
   * process's own.
   */
  reclaimExpired(now = Date.now(), limit = 500): Promise<number> {
    return reclaimExpired(
      this.#store,
      now,
      limit,
      (id, key, end) => this.#toTidy(end + TIDY_AFTER_MS, id, key),
    );
  }

  /**
   * Reclaims every reservation the gateway instances `owners` hold (see
   * reclaimOwned), deleting the release counters it adds to after their
   * window, as this process's own.
   */
  reclaimOwned(owners: ReadonlySet<string>, now = Date.now()): Promise<number> {
    return reclaimOwned(
      this.#store,
      owners,
      now,
      (id, key, end) => this.#toTidy(end + TIDY_AFTER_MS, id, key),
    );
  }

  /** Tracks a release counter to delete `at` (see TIDY_AFTER_MS). */
  #toTidy(at: number, id: string, key: Deno.KvKey): void {
    let due = this.#tidy.get(at);
    if (!due) this.#tidy.set(at, due = new Map());
    due.set(id, key);
  }

  /**
   * Adds to `op` the deletion of up to `room` release counters this
   * process added to whose window ended TIDY_AFTER_MS ago (their rows have
   * no expiry: see TIDY_AFTER_MS); returns them, to be tracked again if
   * the commit fails. Releases into ended windows are dropped (see
   * Release), so none comes back. A crash leaves the last minute's behind.
   */
  #tidyInto(
    op: Deno.AtomicOperation,
    room: number,
    now: number,
  ): Tidy[] {
    const out: Tidy[] = [];
    for (const [at, due] of this.#tidy) {
      if (at > now) continue; // few: one per window
      for (const [id, key] of due) {
        if (out.length >= room) return out;
        op.delete(key);
        out.push({ at, id, key });
        due.delete(id);
      }
      this.#tidy.delete(at);
    }
    return out;
  }
}

/** What settling `r` at `actual` adds to each release counter: `[cacheId, key, n]`. */
function releases(r: Reservation, actual: number): Release[] {
  const used = Math.max(0, Math.min(r.tokens, Math.ceil(actual)));
  const out: Release[] = [];
  releaseTo(out, r.tokenCounters, r.tokens - used);
  releaseTo(out, r.concCounters, 1);
  return out;
}

/** Releases of a lease: tokens, concurrency units and unused requests. */
function leaseReleases(
  l: Lease,
  tokens: number,
  units: number,
  requests: number,
): Release[] {
  const out: Release[] = [];
  releaseTo(out, l.res.tokenCounters, tokens);
  releaseTo(out, l.res.concCounters, units);
  releaseTo(out, l.reqCounters, requests);
  return out;
}

/** Adds `n` (when positive) to the release counter of each `[subject, window]`. */
function releaseTo(
  out: Release[],
  counters: [string, string][],
  n: number,
): void {
  if (n <= 0) return;
  for (const [s, w] of counters) {
    out.push([`${s}\u0000${w}`, k.quotaCounter(s, rel(w)), n, windowEnd(w)]);
  }
}

/** A lease's view: the one at its grant plus what it has not used yet. */
function leaseView(l: Lease, now: number): QuotaView {
  const age = now - l.openedAt;
  const v = l.view;
  const unusedTokens = l.res.tokens - l.tokensHeld - l.tokensUsed;
  return {
    requests: v.requests && {
      limit: v.requests.limit,
      remaining: Math.min(
        v.requests.limit,
        v.requests.remaining + l.n - l.admitted,
      ),
      resetMs: Math.max(0, v.requests.resetMs - age),
    },
    tokens: v.tokens && {
      limit: v.tokens.limit,
      remaining: Math.min(v.tokens.limit, v.tokens.remaining + unusedTokens),
      resetMs: Math.max(0, v.tokens.resetMs - age),
    },
  };
}

/** A counter's usage as decided so far: admitted − released + added. */
const used = (c: Counter) => c.value - c.released + c.added;

function viewOf(rules: Rule[], cs: Counter[], now: number): QuotaView {
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
      remaining: Math.max(0, r.limit - used(cs[i]!)),
      resetMs: cs[i]!.end - now,
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
export function settle(
  store: Store,
  r: Reservation,
  actualTokens: number,
): Promise<boolean> {
  return settleOne(
    store,
    r.id,
    r.versionstamp,
    live(releases(r, actualTokens), Date.now()),
  );
}

/**
 * Deletes a reservation record (if still held as seen), and a lease's
 * checkpoint, and adds its releases (into windows not ended: see live).
 */
async function settleOne(
  store: Store,
  id: string,
  versionstamp: string,
  rs: Release[],
  lease = false,
): Promise<boolean> {
  const op = store.kv.atomic()
    .check({ key: k.reservation(id), versionstamp })
    .delete(k.reservation(id));
  if (lease) op.delete(k.reservationUse(id));
  for (const [, key, n] of rs) op.sum(key, BigInt(n));
  return (await op.commit()).ok;
}

/** Learns each release counter a reclaim added to, and when its window ends. */
type OnReleased = (id: string, key: Deno.KvKey, end: number) => void;

/**
 * Settles every reservation whose deadline has passed (the holds of a
 * gateway that crashed or failed to settle); returns how many were
 * reclaimed (see reclaimOne). `onReleased` learns each release counter
 * added to whose window ends (the Admitter deletes it after, as it does
 * its own: see TIDY_AFTER_MS).
 */
export async function reclaimExpired(
  store: Store,
  now = Date.now(),
  limit = 500,
  onReleased?: OnReleased,
): Promise<number> {
  let n = 0;
  const iter = store.kv.list<StoredReservation>({
    start: k.reservationPrefix(),
    end: k.reservation(newIdAt(now)),
  }, { limit });
  for await (const e of iter) {
    if (e.value.deadline > now) continue;
    if (await reclaimOne(store, e, now, onReleased)) n++;
  }
  return n;
}

/**
 * Settles every reservation held by the gateway instances `owners` (one
 * restarted, or whose liveness lapsed: store/instances.ts), whatever its
 * deadline; returns how many were reclaimed (see reclaimOne). Reads every
 * reservation: it runs at start and when an instance lapses.
 */
export async function reclaimOwned(
  store: Store,
  owners: ReadonlySet<string>,
  now = Date.now(),
  onReleased?: OnReleased,
): Promise<number> {
  let n = 0;
  if (owners.size === 0) return n;
  const iter = store.kv.list<StoredReservation>({
    prefix: k.reservationPrefix(),
  });
  for await (const e of iter) {
    const owner = e.value.owner;
    if (owner === undefined || !owners.has(owner)) continue;
    if (await reclaimOne(store, e, now, onReleased)) n++;
  }
  return n;
}

/**
 * Settles a reservation nobody else will: bills its `reclaimTokens` (a
 * request's prompt estimate; a lease's checkpoint, see
 * Admitter.#checkpoint) and gives back the rest of its tokens, all its
 * slots and a lease's requests not admitted, into windows not ended.
 * False when it was settled meanwhile.
 */
async function reclaimOne(
  store: Store,
  e: Deno.KvEntry<StoredReservation>,
  now: number,
  onReleased?: OnReleased,
): Promise<boolean> {
  const v = e.value;
  const useKey = k.reservationUse(String(e.key[1]));
  const lease = v.requests !== undefined;
  const use = lease ? (await store.kv.get<ReservationUse>(useKey)).value : null;
  const billed = Math.min(v.tokens, use?.tokens ?? v.reclaimTokens);
  const requests = v.requests ?? 0;
  const counted = Math.min(requests, use?.requests ?? v.reclaimRequests ?? 0);
  const rs: Release[] = [];
  releaseTo(rs, v.tokenCounters, v.tokens - billed);
  releaseTo(rs, v.concCounters, v.units ?? 1);
  releaseTo(rs, v.reqCounters ?? [], requests - counted);
  const op = store.kv.atomic().check(e).delete(e.key);
  if (lease) op.delete(useKey);
  const added = live(rs, now);
  for (const [, key, n] of added) op.sum(key, BigInt(n));
  if (!(await op.commit()).ok) return false;
  for (const [id, key, , end] of added) {
    if (end !== Infinity) onReleased?.(id, key, end);
  }
  return true;
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
