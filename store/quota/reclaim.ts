/**
 * Reclaiming: settling the reservations nobody else will, those of a
 * gateway instance that restarted or whose liveness lapsed
 * (store/instances.ts, `reclaimOwned`), or any past its deadline
 * (`reclaimExpired`). What a reclaim bills: see README.md.
 */
import { newIdAt } from "../ids.ts";
import { k } from "../kv_keys.ts";
import type { Store } from "../store.ts";
import { live, type Release, releaseTo } from "./counters.ts";
import type { ReservationUse, StoredReservation } from "./types.ts";

/** Learns each release counter a reclaim added to, and when its window ends. */
export type OnReleased = (id: string, key: Deno.KvKey, end: number) => void;

/**
 * Settles every reservation whose deadline has passed (the holds of a
 * gateway that crashed or failed to settle); returns how many were
 * reclaimed (see reclaimOne). `onReleased` learns each release counter
 * added to whose window ends (the Admitter deletes it after, as it does
 * its own: see tidy.ts).
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
 * request's prompt estimate; in money, `reclaimMoney`, the estimate at the
 * prompt price) or a lease's checkpoint, and gives back the
 * rest of its tokens, all its slots and a lease's requests not admitted,
 * into windows not ended. False when it was settled meanwhile.
 */
async function reclaimOne(
  store: Store,
  e: Deno.KvEntry<StoredReservation>,
  now: number,
  onReleased?: OnReleased,
): Promise<boolean> {
  const v = e.value;
  const useKey = k.reservationUse(String(e.key[1]));
  // A wide plan's request still admitting holds requests too, unused: its
  // record's reclaim fields (nothing billed) say so, with no checkpoint.
  const lease = v.requests !== undefined && !v.admitting;
  const use = lease ? (await store.kv.get<ReservationUse>(useKey)).value : null;
  const billed = Math.min(v.tokens, use?.tokens ?? v.reclaimTokens);
  const requests = v.requests ?? 0;
  const counted = Math.min(requests, use?.requests ?? v.reclaimRequests ?? 0);
  const rs: Release[] = [];
  releaseTo(rs, v.tokenCounters, v.tokens - billed);
  releaseTo(rs, v.concCounters, v.units ?? 1);
  releaseTo(rs, v.reqCounters ?? [], requests - counted);
  if (v.money !== undefined && v.moneyCounters) {
    releaseTo(
      rs,
      v.moneyCounters,
      v.money - Math.min(v.money, v.reclaimMoney ?? 0),
    );
  }
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

/** Counts reservations still held (tests and diagnostics). */
export async function countReservations(store: Store): Promise<number> {
  let n = 0;
  for await (const _ of store.kv.list({ prefix: k.reservationPrefix() })) n++;
  return n;
}
