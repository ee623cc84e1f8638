/** The shapes of admission: rules and plans, requests, reservations, outcomes. */
import type { Lease } from "./lease.ts";

/**
 * The kind of a limit rule and so of its window. `spend` counts money
 * (micro-units: tokens at the model's prices) in a calendar month.
 */
export type RuleKind =
  | "rpm"
  | "tpm"
  | "concurrency"
  | "day"
  | "month"
  | "spend";

/** One limit to enforce: `subject` is `t:<tenantId>` or `k:<keyId>`. */
export interface Rule {
  subject: string;
  kind: RuleKind;
  limit: number;
  /**
   * Set when the rule is a hard budget (store/budgets.ts) rather than a
   * limit: its refusal names the budget.
   */
  budget?: boolean;
}

/**
 * The prices a request's spend is counted at (micro-units per 1M tokens,
 * store/pricing.ts), and its prompt's upper bound: its worst case in money
 * is `prompt` at the prompt price plus the rest of its tokens at the
 * completion price.
 */
export interface RequestPrice {
  prompt: number;
  promptPerMillion: number;
  completionPerMillion: number;
}

/**
 * The precomputed rules of one (tenant, key): up to 12 (six a subject), one
 * counter (a commit's check) each. A plan with more than a commit may check
 * is admitted group by group (wide.ts).
 */
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
  /** Its prices, for plans with `spend` rules (absent: it costs nothing). */
  price?: RequestPrice;
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
  /** Money (micro-units) held in each of `moneyCounters` (spend rules). */
  money?: number;
  moneyCounters?: [string, string][];
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
    /**
     * "rate": retry later (rpm, tpm, concurrency); "quota": day/month/spend
     * exhausted (what is left, counting requests in flight, is less than
     * it needs); "too_large": it needs more than the rule's whole limit,
     * so it can never be admitted.
     */
    reason: "rate" | "quota" | "too_large";
    rule: Rule;
    /**
     * For token and spend rules: what the window has left (tokens, or
     * micro-units), counting what requests in flight hold, and what the
     * request needs at least (its smallest acceptable grant, or that
     * grant's worst case in money).
     */
    remaining?: number;
    needed?: number;
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

/** A reservation record in KV (k.reservation): a request's hold, or a lease's. */
export interface StoredReservation {
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
  /** Money it holds in each of `moneyCounters`, and that billed if reclaimed (spend rules). */
  money?: number;
  reclaimMoney?: number;
  moneyCounters?: [string, string][];
  /**
   * Set while a wide plan's request is admitted group by group (wide.ts):
   * the record holds what the groups committed so far (one request in
   * each of `reqCounters`), and a reclaim gives all of it back.
   */
  admitting?: true;
}

/** A lease's checkpoint (k.reservationUse): what a reclaim bills it. */
export interface ReservationUse {
  /** Tokens used by its finished requests, plus its in-flight requests' reclaimTokens. */
  tokens: number;
  /** Requests it admitted. */
  requests: number;
}
