/**
 * Admission commits. A request reserves its worst case against every
 * applicable window in ONE atomic KV operation (read → `check` every
 * counter → `set` the new values + the reservation record → commit,
 * retried on conflict), so N concurrent requests never overspend any
 * window. Requests that no lease admits queue and are coalesced: one
 * commit admits every waiting request of a tenant and those of other
 * tenants with it (each KV commit costs ~100 µs of CPU whatever it holds,
 * up to `maxChecks` distinct counters), and a tenant never has two commits
 * racing, so a hot key does not collapse under retries. The same commits
 * grant leases and their successors. A plan with more counters than
 * `maxChecks` is admitted by several commits instead (wide.ts).
 */
import type { Store } from "../store.ts";
import {
  type Counter,
  type CounterCache,
  counterExpiry,
  getManyChunked,
  newCounter,
  readReleased,
  u64,
} from "./counters.ts";
import { decide, type Decider } from "./decide.ts";
import type { Lease } from "./lease.ts";
import type { LeaseBook } from "./lease_book.ts";
import { planInfo, planKey, signature } from "./plan.ts";
import type { SettlementQueue } from "./settlement.ts";
import {
  type Admission,
  type AdmissionRequest,
  QuotaUnavailableError,
} from "./types.ts";
import { admitWide, isWide, wideBatch } from "./wide.ts";
import { windowOf } from "./windows.ts";

/** A request waiting for an admission commit. */
export interface PendingAdmission {
  req: AdmissionRequest;
  resolve: (a: Admission) => void;
  reject: (e: unknown) => void;
  /** Set when this only grants the successor of this lease (no request admitted). */
  renews?: Lease;
}

/** What an AdmissionQueue works with (see AdmitterOptions for the tunables). */
export interface AdmissionDeps {
  store: Store;
  counters: CounterCache;
  settlements: SettlementQueue;
  maxBatch: number;
  maxAttempts: number;
  maxChecks: number;
  maxInFlight: number;
  owner: string | undefined;
  reclaimDueMs: () => number;
}

/** The requests of one process waiting for admission commits, and those commits. */
export class AdmissionQueue {
  readonly #store: Store;
  readonly #counters: CounterCache;
  readonly #settlements: SettlementQueue;
  readonly #maxBatch: number;
  readonly #maxAttempts: number;
  readonly #maxChecks: number;
  readonly #maxInFlight: number;
  readonly #decider: Decider;
  /** Set once, right after construction (the two refer to each other). */
  #book!: LeaseBook;
  #pending: PendingAdmission[] = [];
  readonly #busy = new Set<string>();
  #inFlight = 0;
  /** Commits in flight that grant successors (flush waits for them). */
  readonly #renewCommits = new Set<Promise<void>>();

  constructor(deps: AdmissionDeps) {
    this.#store = deps.store;
    this.#counters = deps.counters;
    this.#settlements = deps.settlements;
    this.#maxBatch = deps.maxBatch;
    this.#maxAttempts = deps.maxAttempts;
    this.#maxChecks = deps.maxChecks;
    this.#maxInFlight = deps.maxInFlight;
    this.#decider = { owner: deps.owner, reclaimDueMs: deps.reclaimDueMs };
  }

  /** Gives the queue the lease book its commits admit from and grant into. */
  useBook(book: LeaseBook): void {
    this.#book = book;
  }

  /** Queues a request for a commit. */
  admit(req: AdmissionRequest): Promise<Admission> {
    return new Promise((resolve, reject) => {
      this.#pending.push({ req, resolve, reject });
      this.#pump();
    });
  }

  /** Queues grants of successors (from the lease book). */
  enqueue(ps: PendingAdmission[]): void {
    this.#pending.push(...ps);
    this.#pump();
  }

  /** Drops the grants of successors not started; resolves once those in flight landed. */
  async dropRenewals(): Promise<void> {
    this.#pending = this.#pending.filter((p) => !p.renews);
    await Promise.all(this.#renewCommits);
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
  #take(): PendingAdmission[] {
    const batch: PendingAdmission[] = [];
    const rest: PendingAdmission[] = [];
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
        this.#book.admit(planKey(p.req.plan), p.req, now);
      if (leased) {
        p.resolve(leased);
        continue;
      }
      if (this.#busy.has(p.req.plan.tenantId)) {
        rest.push(p);
        continue;
      }
      const ids = planInfo(p.req.plan).counters;
      if (!p.renews && ids.length > this.#maxChecks) {
        // A wide plan: its requests, with no others, by group commits.
        if (batch.length > 0) {
          rest.push(p);
          continue;
        }
        const wide = this.#takeWide(p, pending, i + 1);
        this.#pending = [...rest, ...wide.rest];
        return wide.batch;
      }
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

  /**
   * A batch of a wide plan: `first` and the requests of its plan (same
   * limits) waiting from `from` on, as many as share its group commits
   * (wideBatch); and the other requests, in order.
   */
  #takeWide(
    first: PendingAdmission,
    pending: PendingAdmission[],
    from: number,
  ): { batch: PendingAdmission[]; rest: PendingAdmission[] } {
    const pk = planKey(first.req.plan);
    const sig = signature(first.req.plan);
    const most = wideBatch(
      first.req.plan.rules.length,
      this.#maxChecks,
      this.#maxBatch,
    );
    const batch = [first];
    const rest: PendingAdmission[] = [];
    for (let j = from; j < pending.length; j++) {
      const q = pending[j]!;
      if (
        batch.length < most && !q.renews && planKey(q.req.plan) === pk &&
        signature(q.req.plan) === sig
      ) batch.push(q);
      else rest.push(q);
    }
    return { batch, rest };
  }

  #run(batch: PendingAdmission[]): Promise<void> {
    const first = batch[0]!.req.plan;
    if (!batch[0]!.renews && isWide(first, this.#maxChecks)) {
      return admitWide(batch, {
        store: this.#store,
        counters: this.#counters,
        decider: this.#decider,
        maxChecks: this.#maxChecks,
        maxAttempts: this.#maxAttempts,
        beforeRefusing: (tenants, cs) => this.#beforeRefusing(tenants, cs),
        released: (rs) => this.#settlements.released(rs),
      });
    }
    const run = this.#admitBatch(batch);
    if (batch.some((p) => p.renews)) {
      this.#renewCommits.add(run);
      void run.finally(() => this.#renewCommits.delete(run));
    }
    return run;
  }

  async #admitBatch(batch: PendingAdmission[]): Promise<void> {
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

  async #commit(batch: PendingAdmission[]): Promise<Admission[]> {
    const kv = this.#store.kv;
    const reqs = batch.map((p) => p.req);
    for (let attempt = 0; attempt < this.#maxAttempts; attempt++) {
      const now = Date.now();
      const counters = new Map<string, Counter>();
      // A successor counts in the windows it starts in, decided once here:
      // its lease may admit more while this commit waits for reads.
      const starts = batch.map((p) =>
        p.renews ? this.#book.successorStart(p.renews, now) : now
      );
      const per = batch.map((p, i) =>
        p.req.plan.rules.map((r) => {
          const [window, end] = windowOf(r.kind, starts[i]!);
          const id = `${r.subject}\u0000${window}`;
          let c = counters.get(id);
          if (!c) {
            c = newCounter(r.subject, r.kind, window, end, this.#counters);
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
        const cached = this.#counters.admitted(c.id);
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
          this.#counters.setAdmitted(c.id, c);
        });
      }
      let out = this.#decideAll(batch, per, starts, now);
      const refused = out.admissions.flatMap((a, i) => a.ok ? [] : [i]);
      if (refused.length > 0) {
        const tenants = new Set(refused.map((i) => reqs[i]!.plan.tenantId));
        const need = new Set<Counter>();
        for (const i of refused) for (const c of per[i]!) need.add(c);
        await this.#beforeRefusing(tenants, [...need]);
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
            expireIn: counterExpiry(c, now),
          });
        }
      }
      const res = await op.commit();
      if (res.ok) {
        for (const c of all) {
          if (c.added > 0) {
            this.#counters.setAdmitted(c.id, {
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
          if (l.opensAt === l.openedAt && !this.#book.leaseOf(l.planKey)) {
            this.#book.activate(l);
          } else this.#book.activate(l, true);
        }
        return out.admissions;
      }
      // Another instance moved: re-read.
      for (const c of all) this.#counters.forgetAdmitted(c.id);
    }
    throw new QuotaUnavailableError(
      "Cannot admit: the quota counters stayed contended",
    );
  }

  /**
   * Before refusing: the leases of `tenants` close, this process's own
   * releases land, then the release counters `cs` are read fresh.
   */
  async #beforeRefusing(tenants: Set<string>, cs: Counter[]): Promise<void> {
    const closed = this.#book.closeLeases(tenants);
    await Promise.all(closed.map((l) => this.#book.shrink(l)));
    await this.#settlements.flush();
    await readReleased(this.#store.kv, this.#counters, cs);
  }

  #decideAll(
    batch: PendingAdmission[],
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
        const open = this.#book.leaseOf(pk);
        if (
          granted || this.#book.hasSuccessor(pk) || (open && open !== renews)
        ) {
          return;
        }
        const l = this.#book.grantSuccessor(
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
      const a = decide(req, per[i]!, now, op, this.#decider);
      admissions.push(a);
      if (!a.ok) return;
      admitted++;
      if (!granted && !this.#book.leaseOf(pk)) {
        const l = this.#book.grant(pk, req, per[i]!, now, op);
        if (l) leases.push(l);
      }
    });
    return { admissions, admitted, op, leases };
  }
}
