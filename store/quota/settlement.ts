/**
 * Settlement: a reservation is replaced by what its request used (clamped
 * to the grant), exactly once (guarded by its record's versionstamp),
 * off the client's path. Settlements queue and share commits: one check
 * and delete per reservation, `sum`s merged per release counter.
 */
import { k } from "../kv_keys.ts";
import type { Store } from "../store.ts";
import type { Checkpoints } from "./checkpoints.ts";
import {
  type CounterCache,
  getManyChunked,
  live,
  type Release,
  releaseTo,
} from "./counters.ts";
import type { Lease } from "./lease.ts";
import type { Tidier } from "./tidy.ts";
import type { Reservation } from "./types.ts";

/**
 * Most mutations in one settlement commit. A commit builds and serializes
 * its mutations on the main thread (~2-10 µs each), and 64 leases of 64
 * tenants settled together (a check, a delete and ~8 sums each: ~600)
 * held requests up for ~5 ms.
 */
export const MAX_SETTLE_MUTATIONS = 128;

/** A settlement waiting for its commit. */
export interface PendingSettle {
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
 * What settling `r` at `actual` tokens (costing `actualMoney` micro-units,
 * for a reservation holding money) adds to each release counter.
 */
export function releases(
  r: Reservation,
  actual: number,
  actualMoney = 0,
): Release[] {
  const used = Math.max(0, Math.min(r.tokens, Math.ceil(actual)));
  const out: Release[] = [];
  releaseTo(out, r.tokenCounters, r.tokens - used);
  releaseTo(out, r.concCounters, 1);
  if (r.money !== undefined && r.moneyCounters) {
    const spent = Math.max(0, Math.min(r.money, Math.ceil(actualMoney)));
    releaseTo(out, r.moneyCounters, r.money - spent);
  }
  return out;
}

/**
 * Replaces a reservation by the actual usage (clamped to the grant); a
 * no-op when it was already settled or reclaimed.
 */
export function settle(
  store: Store,
  r: Reservation,
  actualTokens: number,
  actualMoney = 0,
): Promise<boolean> {
  return settleOne(
    store,
    r.id,
    r.versionstamp,
    live(releases(r, actualTokens, actualMoney), Date.now()),
  );
}

/**
 * Deletes a reservation record (if still held as seen), and a lease's
 * checkpoint, and adds its releases (into windows not ended: see live).
 */
export async function settleOne(
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

/** Tunables of a SettlementQueue (see AdmitterOptions). */
export interface SettlementOptions {
  settleDelayMs: number;
  settleSpreadMs: number;
  maxChecks: number;
}

/**
 * One process's settlements: queued, committed in batches (deleting the
 * release counters it is time to tidy with them), and those of leases
 * that ran their course spread over `settleSpreadMs`.
 */
export class SettlementQueue {
  readonly #store: Store;
  readonly #counters: CounterCache;
  readonly #tidy: Tidier;
  readonly #checkpoints: Checkpoints;
  readonly #settleDelayMs: number;
  readonly #settleSpreadMs: number;
  readonly #maxChecks: number;
  #settles: PendingSettle[] = [];
  /** Settlements of leases that ran their course, each queued at `due`. */
  #deferred: { due: number; s: PendingSettle }[] = [];
  #deferTimer: ReturnType<typeof setInterval> | undefined;
  #settleTimer: ReturnType<typeof setTimeout> | undefined;
  #settling: Promise<void> | null = null;

  constructor(
    store: Store,
    counters: CounterCache,
    tidy: Tidier,
    checkpoints: Checkpoints,
    opts: SettlementOptions,
  ) {
    this.#store = store;
    this.#counters = counters;
    this.#tidy = tidy;
    this.#checkpoints = checkpoints;
    this.#settleDelayMs = opts.settleDelayMs;
    this.#settleSpreadMs = opts.settleSpreadMs;
    this.#maxChecks = opts.maxChecks;
  }

  /**
   * Settles a request's reservation (not a lease's) in a shared commit,
   * after up to `settleDelayMs`. Resolves false when it was already
   * settled or reclaimed; rejects when KV fails.
   */
  settle(
    r: Reservation,
    actualTokens: number,
    actualMoney = 0,
  ): Promise<boolean> {
    return new Promise((resolve, reject) =>
      this.queue({
        id: r.id,
        versionstamp: r.versionstamp,
        releases: releases(r, actualTokens, actualMoney),
        resolve,
        reject,
      })
    );
  }

  /** Queues a settlement for the next commit. */
  queue(s: PendingSettle): void {
    // Its settlement bills it exactly: no checkpoint needed any more.
    if (s.lease) this.#checkpoints.forget(s.lease);
    this.#settles.push(s);
    this.#kick(
      this.#settles.length >= this.#batch() ? 0 : this.#settleDelayMs,
    );
  }

  /**
   * Queues the settlement of a lease that ran its course up to
   * `settleSpreadMs` later, at random: the 1,000 leases that end at a
   * minute boundary settle over those seconds, a few per commit, instead
   * of in a burst of commits that holds up requests. What they give back
   * counts as used meanwhile (conservative); a refusal and `flush()` land
   * them at once.
   */
  defer(s: PendingSettle): void {
    this.#deferred.push({
      due: Date.now() + this.#settleSpreadMs * Math.random(),
      s,
    });
    if (this.#deferTimer !== undefined) return;
    const timer = setInterval(() => {
      const now = Date.now();
      const keep: { due: number; s: PendingSettle }[] = [];
      for (const d of this.#deferred) {
        if (d.due <= now) this.queue(d.s);
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
      if (d.s.lease) this.#checkpoints.forget(d.s.lease);
      this.#settles.push(d.s);
    }
    this.#deferred = [];
    this.#stopDeferred();
  }

  #stopDeferred(): void {
    clearInterval(this.#deferTimer);
    this.#deferTimer = undefined;
  }

  /** Commits every settlement queued or deferred; resolves once all are. */
  async flush(): Promise<void> {
    this.#undefer();
    while (this.#settles.length > 0 || this.#settling) {
      this.#kick(0);
      await this.#settling;
    }
  }

  #batch(): number {
    return Math.min(this.#maxChecks, 64);
  }

  /**
   * How many of the queued settlements the next commit takes: up to a
   * batch, within MAX_SETTLE_MUTATIONS (a check and a delete each, a
   * lease's checkpoint deleted, and a sum per counter released:
   * settlements of one tenant share theirs), at least one.
   */
  #next(): number {
    const max = Math.min(this.#batch(), this.#settles.length);
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

  #kick(delayMs: number): void {
    if (this.#settling) return; // the running drain takes what was queued
    if (delayMs > 0) {
      this.#settleTimer ??= setTimeout(() => {
        this.#settleTimer = undefined;
        this.#settling ??= this.#drain();
      }, delayMs);
      return;
    }
    clearTimeout(this.#settleTimer);
    this.#settleTimer = undefined;
    this.#settling = this.#drain();
  }

  async #drain(): Promise<void> {
    try {
      while (this.#settles.length > 0) {
        await this.#settleMany(this.#settles.splice(0, this.#next()));
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
      const ok = await this.#commit(batch).catch(() => null);
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
        if (ok) this.released(s.releases);
        s.resolve(ok);
      } catch (e) {
        s.reject(e);
      }
    }
  }

  /** Commits a batch of settlements (one check each, sums merged per counter). */
  async #commit(batch: PendingSettle[]): Promise<boolean> {
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
    const tidied = this.#tidy.into(
      op,
      MAX_SETTLE_MUTATIONS - mutations - sums.size,
      now,
    );
    let ok = false;
    try {
      ok = (await op.commit()).ok;
    } finally {
      // Not deleted: tracked again for the next commit.
      if (!ok) this.#tidy.restore(tidied);
    }
    if (!ok) return false;
    for (const s of batch) {
      this.released(s.releases);
      s.resolve(true);
    }
    return true;
  }

  /**
   * Adds committed releases to the cached release counters (which stay ≤
   * the truth), and tracks each to delete after its window (see tidy.ts).
   */
  released(rs: Release[]): void {
    for (const [id, key, n, end] of rs) {
      this.#counters.addReleased(id, n);
      if (end !== Infinity) this.#tidy.afterWindow(id, key, end);
    }
  }
}
