/**
 * The leases of one process, by plan: the open one and its granted
 * successor, admitting from them, renewing, closing, shrinking and
 * settling them (the lifecycle drawn in README.md).
 */
import { k } from "../kv_keys.ts";
import type { Store } from "../store.ts";
import type { PendingAdmission } from "./admission.ts";
import type { Checkpoints } from "./checkpoints.ts";
import { type Counter, live } from "./counters.ts";
import {
  grantLease,
  type Lease,
  leaseReleases,
  type LeaseTerms,
  leaseView,
} from "./lease.ts";
import { signature } from "./plan.ts";
import type { PendingSettle, SettlementQueue } from "./settlement.ts";
import type {
  Admission,
  AdmissionRequest,
  Reservation,
  StoredReservation,
} from "./types.ts";
import { DAY } from "./windows.ts";

/** What a LeaseBook works with (see AdmitterOptions for the tunables). */
export interface LeaseBookDeps {
  store: Store;
  terms: LeaseTerms;
  renewDelayMs: number;
  checkpoints: Checkpoints;
  settlements: SettlementQueue;
  /** Queues grants of successors for an admission commit. */
  enqueue: (renewals: PendingAdmission[]) => void;
}

/** The open leases of one process and their successors. */
export class LeaseBook {
  readonly #store: Store;
  readonly #terms: LeaseTerms;
  readonly #leaseMs: number;
  readonly #renewDelayMs: number;
  readonly #checkpoints: Checkpoints;
  readonly #settlements: SettlementQueue;
  readonly #enqueue: (renewals: PendingAdmission[]) => void;
  readonly #leases = new Map<string, Lease>();
  /** Granted successors of open leases, waiting to open. */
  readonly #next = new Map<string, Lease>();
  /** Renewals asked for (until their commit lands), and the ones not queued yet. */
  readonly #renewing = new Set<string>();
  #renewals: PendingAdmission[] = [];
  #renewTimer: ReturnType<typeof setTimeout> | undefined;
  #sweep: ReturnType<typeof setInterval> | undefined;

  constructor(deps: LeaseBookDeps) {
    this.#store = deps.store;
    this.#terms = deps.terms;
    this.#leaseMs = deps.terms.leaseMs;
    this.#renewDelayMs = deps.renewDelayMs;
    this.#checkpoints = deps.checkpoints;
    this.#settlements = deps.settlements;
    this.#enqueue = deps.enqueue;
  }

  /** The plan's open lease. */
  leaseOf(pk: string): Lease | undefined {
    return this.#leases.get(pk);
  }

  /** Whether the plan's open lease has a successor granted. */
  hasSuccessor(pk: string): boolean {
    return this.#next.has(pk);
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
  successorStart(prev: Lease, now: number): number {
    if (prev.validUntil >= prev.windowEnd && prev.admitted >= 2) {
      // Its pace, counted from its first request (a successor opens with it).
      const perMs = Math.min(
        (prev.admitted - 1) / Math.max(1, now - prev.since),
        this.#terms.rates.perMs(prev.planKey, now),
      );
      const left = prev.n - prev.admitted;
      if (now + left / perMs < prev.validUntil) return now;
    }
    return Math.max(now, prev.validUntil);
  }

  /**
   * Admits from the plan's open lease, when it has room: no KV write. A
   * lease that has ended or is used up closes, and its successor, once
   * open, takes over.
   */
  admit(pk: string, req: AdmissionRequest, now: number): Admission | null {
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
    this.#checkpoints.changed(l);
    const toGo = l.validUntil - now;
    const next = this.#next.get(pk);
    if (
      next && !this.#renewing.has(pk) && next.validUntil <= l.validUntil &&
      toGo <= l.renewWithinMs && l.admitted >= 2 &&
      this.successorStart(l, now) > now
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
    // successorStart). A key quieter than that commits once after the end.
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

  /** Settles in memory a request admitted from a lease; the lease settles once closed and idle. */
  settle(l: Lease, r: Reservation, actualTokens: number): void {
    l.inFlight--;
    if (l.hasTokens) {
      l.tokensHeld -= r.tokens;
      l.reclaimHeld -= r.reclaimTokens ?? 0;
      l.tokensUsed += Math.max(
        0,
        Math.min(r.tokens, Math.ceil(actualTokens)),
      );
    }
    this.#checkpoints.changed(l);
    if (l.closing && l.inFlight === 0) this.#settleLease(l);
  }

  /** Opens the plan's successor lease, once its time has come. */
  #open(pk: string, now: number): Lease | undefined {
    const s = this.#next.get(pk);
    if (!s || now < s.opensAt) return undefined;
    this.#next.delete(pk);
    s.since = now;
    this.activate(s);
    return s;
  }

  /**
   * Queues the grant of `l`'s successor (sized like any lease, counted in
   * the windows it starts in: see successorStart) to open when `l` ends,
   * or is used up, sharing a commit with others after `delayMs`.
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
    // A timer even for no delay: this may run inside an admission's take.
    this.#renewTimer = setTimeout(() => {
      this.#renewTimer = undefined;
      const renewals = this.#renewals;
      this.#renewals = [];
      this.#enqueue(renewals);
    }, delayMs);
  }

  /** Drops the renewals not committed yet (flush: no lease stays open). */
  stopRenewals(): void {
    clearTimeout(this.#renewTimer);
    this.#renewTimer = undefined;
    this.#renewals = [];
    this.#renewing.clear();
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
    if (l.ended) this.#settlements.defer(s);
    else this.#settlements.queue(s);
  }

  /**
   * Releases at once what a closed lease still serving requests will not
   * use (its unused requests and tokens, its idle slots), rewriting its
   * record to hold only what is in flight.
   */
  shrink(l: Lease): Promise<void> {
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
      this.#settlements.released(rs);
    }, () => {}).finally(() => l.shrinking = null);
    return l.shrinking;
  }

  /** Closes the leases of `tenants` (all when null; successors too); returns those closed. */
  closeLeases(tenants: Set<string> | null): Lease[] {
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
  activate(l: Lease, next = false): void {
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

  /** Adds a lease for a busy plan to the commit (see grantLease). */
  grant(
    pk: string,
    req: AdmissionRequest,
    cs: Counter[],
    now: number,
    op: Deno.AtomicOperation,
  ): Lease | null {
    return grantLease({ pk, req, cs, now, op }, this.#terms);
  }

  /**
   * Adds `prev`'s successor to the commit: its span starts `at` (when
   * `prev` ends, or earlier: see successorStart), in the windows of that
   * moment; it opens then, or, counting in the same windows as `prev`, as
   * soon as `prev` is used up. A lease used faster than its rate predicted
   * (a burst) gets one sized at the pace it was used, up to 4 times it.
   */
  grantSuccessor(
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
    return grantLease({
      pk: prev.planKey,
      req,
      cs,
      now,
      op,
      startsAt: at,
      opensAt: sameWindows ? now : at,
      atLeast: pace,
    }, this.#terms);
  }
}
