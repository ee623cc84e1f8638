/**
 * A lease: capacity one process prepays for a busy (tenant, key), so its
 * requests are admitted with no KV write. Its lifecycle (granted, renewed,
 * checkpointed, settled or reclaimed) is drawn in README.md; LeaseBook
 * runs it.
 */
import { newIdAt } from "../ids.ts";
import { k } from "../kv_keys.ts";
import {
  type Counter,
  type Release,
  releaseTo,
  used,
  viewOf,
} from "./counters.ts";
import { signature } from "./plan.ts";
import type { RateMeter } from "./rates.ts";
import type {
  AdmissionRequest,
  QuotaView,
  Reservation,
  StoredReservation,
} from "./types.ts";
import { DAY, isTokenRule } from "./windows.ts";

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
export const RENEW_AT = [0.1, 0.9] as const;

/**
 * Capacity this process prepaid for one (tenant, key) while it is busy:
 * `n` requests (every rpm and concurrency counter got +n) and `n` times
 * the first request's worst case in tokens (every token counter), held by
 * one reservation record. Its lifecycle: README.md.
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
   * used, or with `renewWithinMs` or less to go, whichever comes first
   * (both from one fraction drawn from RENEW_AT).
   */
  readonly renewAfter!: number;
  readonly renewWithinMs!: number;
  /**
   * Set when it closed because its time ran out or its successor took
   * over: its settlement may wait a few seconds (SettlementQueue.defer).
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

/** A lease's view: the one at its grant plus what it has not used yet. */
export function leaseView(l: Lease, now: number): QuotaView {
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

/** Releases of a lease: tokens, concurrency units and unused requests. */
export function leaseReleases(
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

/** What every grant of one admitter shares (see AdmitterOptions). */
export interface LeaseTerms {
  leaseMs: number;
  maxLease: number;
  owner: string | undefined;
  rates: RateMeter;
}

/** One lease to grant in a commit. */
export interface LeaseGrant {
  /** The plan's key (planKey). */
  pk: string;
  /** The request asking: its plan, worst case and ttlMs. */
  req: AdmissionRequest;
  /** The commit's counters of the plan's rules, in order. */
  cs: Counter[];
  now: number;
  op: Deno.AtomicOperation;
  /** When its span starts (default now; a successor's: see LeaseBook.successorStart). */
  startsAt?: number;
  /** When it may admit (default now). */
  opensAt?: number;
  /** Requests it holds at least, rates aside (a successor after a burst). */
  atLeast?: number;
}

/**
 * Adds a lease for a busy plan to the commit (it opens once the commit
 * lands, or, a successor, at `opensAt`): as many requests as it makes in
 * `leaseMs`, or `atLeast` (at most `maxLease`; see LEASE_SHARE and
 * LEASE_MIN_ROOM). Null when none is due.
 */
export function grantLease(g: LeaseGrant, terms: LeaseTerms): Lease | null {
  const { pk, req, cs, now, op } = g;
  const startsAt = g.startsAt ?? now;
  const opensAt = g.opensAt ?? now;
  const atLeast = g.atLeast ?? 0;
  const { leaseMs, maxLease } = terms;
  if (leaseMs <= 0) return null;
  const rules = req.plan.rules;
  // A spend rule's requests cost what their model's prices say: each one
  // is admitted by a commit, none prepaid.
  if (rules.some((r) => r.kind === "spend")) return null;
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
    Math.floor(startsAt + leaseMs * (0.75 + 0.25 * Math.random())),
  );
  if (2 * (windowEnd - validUntil) < leaseMs) validUntil = windowEnd;
  // Sized for its span (rates are per leaseMs; a shorter one keeps the
  // full size: what it does not use goes back when it settles).
  const span = Math.max(1, (validUntil - startsAt) / leaseMs);
  let n = Math.min(
    maxLease,
    Math.floor(span * Math.max(atLeast, terms.rates.expected(pk, now))),
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
  const deadline = Math.max(startsAt + leaseMs, validUntil) + req.ttlMs;
  const id = newIdAt(deadline);
  const renewAt = RENEW_AT[0] + (RENEW_AT[1] - RENEW_AT[0]) * Math.random();
  // Nothing used yet: its checkpoints say what it uses.
  const stored: StoredReservation = {
    tenantId: req.plan.tenantId,
    keyId: req.plan.keyId,
    owner: terms.owner,
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
    // Asked for at a random point of its span; by count, one request
    // before the last at the latest.
    renewAfter: Math.max(1, Math.min(n - 1, Math.ceil(n * renewAt))),
    // By time, with a share of leaseMs to go: one cut short by its
    // window's end (a few seconds) asks from its second request on.
    renewWithinMs: leaseMs * (1 - renewAt),
  });
}
