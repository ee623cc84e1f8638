/**
 * The Admitter: exact admission and settlement for one gateway process,
 * composed of an admission queue (admission.ts), a lease book
 * (lease_book.ts) with its checkpoints (checkpoints.ts), a settlement
 * queue (settlement.ts) and the reclaiming of what crashed gateways held
 * (reclaim.ts). How it all fits: README.md.
 */
import type { Store } from "../store.ts";
import { AdmissionQueue } from "./admission.ts";
import { Checkpoints } from "./checkpoints.ts";
import { CounterCache } from "./counters.ts";
import { LeaseBook } from "./lease_book.ts";
import { planKey } from "./plan.ts";
import { RateMeter } from "./rates.ts";
import { reclaimExpired, reclaimOwned } from "./reclaim.ts";
import { SettlementQueue } from "./settlement.ts";
import { Tidier } from "./tidy.ts";
import type { Admission, AdmissionRequest, Reservation } from "./types.ts";

/** Tunables of an `Admitter`. */
export interface AdmitterOptions {
  /** Most requests admitted by one commit (default 128). */
  maxBatch?: number;
  /** Commit attempts before failing closed (default 100). */
  maxAttempts?: number;
  /**
   * Most distinct counters (KV checks) in one commit: Deno KV allows 100;
   * the self-hosted denokv protocol documents 10 (default 100). A plan with
   * more counters is admitted by several commits (wide.ts).
   */
  maxChecks?: number;
  /** Admission commits in flight at once, for different tenants (default 2). */
  maxInFlight?: number;
  /** How long a settlement may wait to share its commit with others (default 20 ms). */
  settleDelayMs?: number;
  /**
   * The longest the settlement of a lease that ran its course (ended, or
   * used up) waits (default 15 s; each waits a random share of it, see
   * SettlementQueue.defer).
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
   * with others (default 100 ms; when it is asked for: README.md).
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
  /**
   * How often reservations past their deadline (of gateways that crashed
   * or failed to settle) are reclaimed (default 30 s; 0: never, but by
   * calling `reclaimExpired`).
   */
  reclaimEveryMs?: number;
  /** Told how many reservations each timed reclaim settled, when any. */
  onReclaimed?: (count: number) => void;
}

/**
 * Admits and settles for one gateway process: a request is admitted from
 * its key's lease when one is open, else by a shared commit; settlements
 * are off the client's path and batched. A timer reclaims reservations
 * past their deadline every `reclaimEveryMs` until `close()`.
 */
export class Admitter implements AsyncDisposable {
  readonly #store: Store;
  readonly #rates: RateMeter;
  readonly #tidy = new Tidier();
  readonly #checkpoints: Checkpoints;
  readonly #settlements: SettlementQueue;
  readonly #queue: AdmissionQueue;
  readonly #book: LeaseBook;
  #reclaimTimer: ReturnType<typeof setInterval> | undefined;
  #reclaiming: Promise<void> | null = null;

  constructor(store: Store, opts: AdmitterOptions = {}) {
    this.#store = store;
    const leaseMs = opts.leaseMs ?? 60_000;
    // Two at least: a wide plan's later groups check a counter and a record.
    const maxChecks = Math.max(2, Math.min(opts.maxChecks ?? 100, 100));
    const counters = new CounterCache();
    this.#rates = new RateMeter(leaseMs);
    this.#checkpoints = new Checkpoints(store);
    this.#settlements = new SettlementQueue(
      store,
      counters,
      this.#tidy,
      this.#checkpoints,
      {
        settleDelayMs: opts.settleDelayMs ?? 20,
        settleSpreadMs: opts.settleSpreadMs ?? 15_000,
        maxChecks,
      },
    );
    const queue = new AdmissionQueue({
      store,
      counters,
      settlements: this.#settlements,
      maxBatch: opts.maxBatch ?? 128,
      maxAttempts: opts.maxAttempts ?? 100,
      maxChecks,
      maxInFlight: opts.maxInFlight ?? 2,
      owner: opts.owner,
      reclaimDueMs: opts.reclaimDueMs ?? (() => 0),
    });
    this.#book = new LeaseBook({
      store,
      terms: {
        leaseMs,
        maxLease: opts.maxLease ?? 256,
        owner: opts.owner,
        rates: this.#rates,
      },
      renewDelayMs: opts.renewDelayMs ?? 100,
      checkpoints: this.#checkpoints,
      settlements: this.#settlements,
      enqueue: (renewals) => queue.enqueue(renewals),
    });
    queue.useBook(this.#book);
    this.#queue = queue;
    const every = opts.reclaimEveryMs ?? 30_000;
    if (every > 0) {
      const onReclaimed = opts.onReclaimed;
      this.#reclaimTimer = setInterval(() => {
        this.#reclaiming ??= this.reclaimExpired()
          .catch(() => 0)
          .then((n) => {
            if (n > 0) onReclaimed?.(n);
          })
          .finally(() => this.#reclaiming = null);
      }, every);
      Deno.unrefTimer(this.#reclaimTimer);
    }
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
    this.#rates.count(pk, now);
    const leased = this.#book.admit(pk, req, now);
    if (leased) return Promise.resolve(leased);
    return this.#queue.admit(req);
  }

  /**
   * Settles a reservation to the actual usage (clamped to the grant) off
   * the client's path: one admitted from a lease in memory, any other
   * after up to `settleDelayMs`, sharing one commit with other
   * settlements. `actualMoney` is what the tokens cost (micro-units), for
   * a reservation that holds money (spend rules; never a lease's).
   * Resolves false when it was already settled or reclaimed; rejects when
   * KV fails.
   */
  settle(
    r: Reservation,
    actualTokens: number,
    actualMoney = 0,
  ): Promise<boolean> {
    if (r.lease) {
      this.#book.settle(r.lease, r, actualTokens);
      return Promise.resolve(true);
    }
    return this.#settlements.settle(r, actualTokens, actualMoney);
  }

  /**
   * Closes every lease (those still serving requests settle when their last
   * one ends) and resolves once every settlement queued is committed.
   */
  async flush(): Promise<void> {
    this.#book.stopRenewals();
    await this.#queue.dropRenewals();
    this.#book.closeLeases(null);
    await this.#settlements.flush();
    await this.#checkpoints.idle();
  }

  /**
   * Closes every lease, giving nothing back: this instance was presumed
   * dead and another reclaimed what it held (GatewayInstance `onLost`).
   */
  dropLeases(): void {
    this.#book.closeLeases(null);
  }

  /**
   * Reclaims crashed gateways' expired reservations (see reclaimExpired),
   * deleting the release counters it adds to after their window, as this
   * process's own. The reclaim timer calls it every `reclaimEveryMs`.
   */
  reclaimExpired(now = Date.now(), limit = 500): Promise<number> {
    return reclaimExpired(
      this.#store,
      now,
      limit,
      (id, key, end) => this.#tidy.afterWindow(id, key, end),
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
      (id, key, end) => this.#tidy.afterWindow(id, key, end),
    );
  }

  /** Stops the reclaim timer (waiting for a reclaim in progress), then flushes. */
  async close(): Promise<void> {
    clearInterval(this.#reclaimTimer);
    this.#reclaimTimer = undefined;
    await this.#reclaiming;
    await this.flush();
  }

  /** Closes (see close). */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
