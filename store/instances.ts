/**
 * Gateway instances: each has an identity and a liveness record in KV that
 * it rewrites every `heartbeatMs`. Every reservation records its owner
 * (store/quota/), so what a gateway held never waits out a deadline:
 *
 * - a restarted instance (same identity) reclaims at start, before it
 *   serves, everything its previous incarnation held;
 * - any instance reclaims what another held once that one's record has not
 *   changed for `lapseMs` (timed by the observer's own clock, so clocks
 *   need not agree), deleting the record first: an instance that was only
 *   paused finds its record gone at its next beat, and drops its leases.
 *
 * An embedded KV belongs to one process, so its identity lives in the data
 * directory (`localInstanceId`): a restart on it is the same instance. With
 * a remote KV each process is a new instance, and the one before it is
 * reclaimed once its record lapses.
 */
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import type { Store } from "./store.ts";

/** An instance's liveness record (times for people; liveness is its versionstamp changing). */
export interface InstanceRecord {
  startedAt: number;
  heartbeatAt: number;
}

/** Tunables and hooks of a `GatewayInstance`. */
export interface GatewayInstanceOptions {
  /** Reclaims every reservation held by the given instances; resolves with how many. */
  reclaim(owners: ReadonlySet<string>): Promise<number>;
  /** Called when this instance finds its record gone: another presumed it dead and reclaimed what it held. */
  onLost?(): void;
  /** How often the record is rewritten and the others looked at (default 1000 ms). */
  heartbeatMs?: number;
  /** How long another's record may stay unchanged before it is presumed dead (default 5000 ms). */
  lapseMs?: number;
}

const ID_FILE = "instance_id";
const ID_RE = /^[0-9a-z]{26}$/;

/**
 * The identity of the gateway that owns the embedded KV in `dataDir`,
 * created on first use (`<dataDir>/instance_id`).
 */
export async function localInstanceId(dataDir: string): Promise<string> {
  const path = `${dataDir.replace(/\/+$/, "")}/${ID_FILE}`;
  try {
    const id = (await Deno.readTextFile(path)).trim();
    if (!ID_RE.test(id)) {
      throw new Error(
        `Cannot read the gateway instance id: ${path} must hold a 26-character id: current value is ${
          JSON.stringify(id.slice(0, 40))
        }`,
      );
    }
    return id;
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
  const id = newId();
  try {
    await Deno.writeTextFile(path, `${id}\n`, { createNew: true });
    return id;
  } catch (e) {
    if (e instanceof Deno.errors.AlreadyExists) return localInstanceId(dataDir);
    throw e;
  }
}

/** One gateway's liveness record, and the reclaiming of instances that stopped beating. */
export class GatewayInstance {
  readonly id: string;
  readonly #store: Store;
  readonly #opts: GatewayInstanceOptions;
  readonly #heartbeatMs: number;
  readonly #lapseMs: number;
  readonly #startedAt = Date.now();
  #versionstamp: string | null = null;
  /** Other instances' records as last seen: versionstamp, and since when (our clock) unchanged. */
  readonly #seen = new Map<string, { versionstamp: string; since: number }>();
  /** Instances whose record this one deleted and whose holds it has still to reclaim. */
  readonly #orphans = new Set<string>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #beating: Promise<void> | null = null;
  #closed = false;

  constructor(store: Store, id: string, opts: GatewayInstanceOptions) {
    const { heartbeatMs = 1000, lapseMs = 5000 } = opts;
    if (!(heartbeatMs > 0 && lapseMs > 2 * heartbeatMs)) {
      throw new RangeError(
        `Cannot create a gateway instance: lapseMs must be > 2 × heartbeatMs > 0: current values are ${lapseMs} and ${heartbeatMs}`,
      );
    }
    this.id = id;
    this.#store = store;
    this.#opts = opts;
    this.#heartbeatMs = heartbeatMs;
    this.#lapseMs = lapseMs;
  }

  /**
   * Writes this instance's record, reclaims what its previous incarnation
   * held (when its record says there was one), and starts beating; resolves
   * with how many reservations were reclaimed. Call before serving.
   */
  async start(): Promise<number> {
    const kv = this.#store.kv;
    const key = k.gatewayInstance(this.id);
    const previous = await kv.get<InstanceRecord>(key);
    this.#versionstamp = (await kv.set(key, this.#record())).versionstamp;
    const n = previous.value ? await this.#opts.reclaim(new Set([this.id])) : 0;
    this.#schedule();
    return n;
  }

  /**
   * How long until what the instances that stopped beating hold is
   * reclaimed, at the latest (0 when none has stopped): the truthful wait
   * for a slot such an instance holds.
   */
  reclaimDueMs(now = Date.now()): number {
    let due = this.#orphans.size > 0 ? this.#heartbeatMs : 0;
    for (const { since } of this.#seen.values()) {
      if (now - since > 2 * this.#heartbeatMs) {
        due = Math.max(due, since + this.#lapseMs + this.#heartbeatMs - now);
      }
    }
    return due;
  }

  /**
   * Stops beating, reclaims what this instance still holds (settlements
   * that failed) and deletes its record. Call after the last request
   * settled. Idempotent.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#timer);
    await this.#beating;
    try {
      await this.#opts.reclaim(new Set([this.id]));
      await this.#store.kv.delete(k.gatewayInstance(this.id));
    } catch { /* KV down: a restart (or another instance) reclaims them */ }
  }

  /** Runs `#beat()` every `heartbeatMs`, one at a time. */
  #schedule(): void {
    if (this.#closed) return;
    this.#timer = setTimeout(() => {
      this.#beating = this.#beat().catch(() => {}).finally(() => {
        this.#beating = null;
        this.#schedule();
      });
    }, this.#heartbeatMs);
    Deno.unrefTimer(this.#timer);
  }

  /**
   * One heartbeat: rewrites this instance's record (when it is gone,
   * re-creates it and calls `onLost`), then reclaims what the instances
   * whose record lapsed held.
   */
  async #beat(): Promise<void> {
    const now = Date.now();
    const kv = this.#store.kv;
    const key = k.gatewayInstance(this.id);
    const res = await kv.atomic()
      .check({ key, versionstamp: this.#versionstamp })
      .set(key, this.#record())
      .commit();
    if (res.ok) this.#versionstamp = res.versionstamp;
    else {
      this.#versionstamp = (await kv.set(key, this.#record())).versionstamp;
      this.#opts.onLost?.();
    }
    const lapsed: Deno.KvEntry<InstanceRecord>[] = [];
    const listed = new Set<string>();
    for await (
      const e of kv.list<InstanceRecord>({
        prefix: k.gatewayInstancePrefix(),
      })
    ) {
      const id = String(e.key[1]);
      if (id === this.id) continue;
      listed.add(id);
      const seen = this.#seen.get(id);
      if (!seen || seen.versionstamp !== e.versionstamp) {
        this.#seen.set(id, { versionstamp: e.versionstamp, since: now });
      } else if (now - seen.since >= this.#lapseMs) lapsed.push(e);
    }
    for (const id of this.#seen.keys()) {
      if (!listed.has(id)) this.#seen.delete(id);
    }
    for (const e of lapsed) {
      // Deleted first: if it is only paused, its next beat finds out.
      if ((await kv.atomic().check(e).delete(e.key).commit()).ok) {
        this.#orphans.add(String(e.key[1]));
        this.#seen.delete(String(e.key[1]));
      }
    }
    if (this.#orphans.size > 0) {
      await this.#opts.reclaim(new Set(this.#orphans));
      this.#orphans.clear();
    }
  }

  #record(): InstanceRecord {
    return { startedAt: this.#startedAt, heartbeatAt: Date.now() };
  }
}
