/**
 * Node selection: among the fleet's candidates for a model, the node with
 * the fewest requests in flight FROM THIS GATEWAY (relative to its slots;
 * equal nodes are chosen at random, so idle time is spread), never more
 * than its slot count. A request with a prefix affinity (gateway/affinity.ts)
 * goes to the node its conversation maps to (rendezvous hashing, so a node
 * joining or leaving moves only its share), as long as that node's share
 * of slots in use is within AFFINITY_SLACK of the least loaded one's: a
 * conversation keeps its cached prefix, and no node is piled on for it.
 * When every slot is busy, requests wait in a bounded FIFO queue with a
 * deadline per model (default 120 s: an agent's prefill of tens of
 * thousands of tokens holds a slot for a while), then fail with 503 and a
 * `retry-after` that estimates the real wait: how long slots of the model
 * are held (a moving average), less what the oldest holder already used,
 * plus a hold for each slot's worth of requests still queued ahead.
 */
import { OpenAIError } from "../protocol/openai/errors.ts";
import type { Fleet, NodeView } from "../fleet/types.ts";
import { nodeHash, rendezvous } from "./affinity.ts";

/**
 * How much more of its slots in use (a share, 0..1) a conversation's node
 * may have than the least loaded candidate and still get the request:
 * reusing a cached prefix saves its whole prefill, worth a busier node.
 */
const AFFINITY_SLACK = 0.5;
/**
 * While requests wait, how often the fleet is looked at again: a slot frees
 * up when a request ends (which wakes a waiter at once), but also when a
 * node comes back or joins, which only the fleet's next refresh shows.
 */
const RECHECK_MS = 250;
/** The queue's default deadline, ms. */
export const DEFAULT_QUEUE_TIMEOUT_MS = 120_000;
/** A slot's hold time assumed before any was measured, ms. */
const UNKNOWN_HOLD_MS = 10_000;

/** A candidate's slots: its spanning instance's (counted once), else its own. */
function slotsOf(n: NodeView): number {
  return Math.max(1, n.pool?.slots ?? n.stats?.slots ?? 1);
}

/** A held slot on a node; release exactly once. */
export interface SlotGrant {
  node: NodeView;
  /** How long the request waited in the queue for it, ms (0: a slot was free). */
  queuedMs: number;
  release(): void;
}

/**
 * A request refused for lack of capacity (503 `server_busy`): every slot
 * of the nodes it may use busy and the queue full, or its wait timed out.
 * Metered as such (store/capacity_rollup.ts counts refusals per hour).
 */
export class CapacityError extends OpenAIError {
  constructor(
    readonly reason: "queue_full" | "queue_timeout",
    /** How long it waited before it was refused, ms. */
    readonly waitedMs: number,
    /** The estimated wait for a slot now, seconds (`retry-after`). */
    readonly retryAfterS = 1,
  ) {
    super(
      503,
      "server_busy",
      `Every node serving this model is busy${
        reason === "queue_timeout"
          ? ` (waited ${Math.round(waitedMs / 1000)} s for a slot)`
          : ""
      }; retry in about ${retryAfterS} s`,
      { headers: { "retry-after": String(retryAfterS) } },
    );
  }
}

/** Who a request is for, as routing needs it (gateway/core.ts AuthContext's tenant). */
export interface RouteTenant {
  id: string;
  /** With dedicated nodes: may it use shared ones when its own cannot take it? */
  overflowToShared: boolean;
}

/** The routing view of a request's tenant. */
export function routeTenant(
  ctx: { tenant: { id: string; overflowToShared?: boolean } },
): RouteTenant {
  return {
    id: ctx.tenant.id,
    overflowToShared: ctx.tenant.overflowToShared === true,
  };
}

interface Waiter {
  /** When it began to wait (performance.now()). */
  since: number;
  model: string;
  exclude: string | null;
  affinity: number | null;
  tenant: RouteTenant | null;
  resolve: (l: SlotGrant) => void;
  reject: (e: unknown) => void;
  done: boolean;
}

/** Options of the router. */
export interface RouterOptions {
  /** Most requests waiting for a slot (default 256). */
  queueMax?: number;
  /** How long a request may wait for a slot, in ms (default 120 s). */
  queueTimeoutMs?: number;
  /** The same per model id, where it differs from `queueTimeoutMs`. */
  queueTimeoutByModel?: Readonly<Record<string, number>>;
}

/** How long a model's slots are held, for `retry-after`. */
interface HoldStats {
  /** Moving average of a slot's hold, ms (null: none ended yet). */
  avgMs: number | null;
  /** Start times of the slots held now (performance.now()). */
  held: Set<{ since: number }>;
}

/** Routes requests to nodes and tracks this gateway's in-flight work per node. */
export class NodeRouter {
  readonly #fleet: Fleet;
  readonly #inflight = new Map<string, number>();
  readonly #waiters: Waiter[] = [];
  readonly #queueMax: number;
  readonly #queueTimeoutMs: number;
  readonly #queueTimeoutByModel: Readonly<Record<string, number>>;
  readonly #holds = new Map<string, HoldStats>();
  readonly #nodeHashes = new Map<string, number>();
  #recheck: ReturnType<typeof setInterval> | undefined;

  constructor(fleet: Fleet, opts: RouterOptions = {}) {
    this.#fleet = fleet;
    this.#queueMax = opts.queueMax ?? 256;
    this.#queueTimeoutMs = opts.queueTimeoutMs ?? DEFAULT_QUEUE_TIMEOUT_MS;
    this.#queueTimeoutByModel = opts.queueTimeoutByModel ?? {};
  }

  /** How long a request for `model` may wait for a slot, ms. */
  queueTimeoutFor(model: string): number {
    return this.#queueTimeoutByModel[model] ?? this.#queueTimeoutMs;
  }

  /**
   * The estimated wait for a slot of `model` now, seconds (at least 1):
   * the oldest holder's remaining hold, plus one average hold for each
   * `slots` requests queued ahead.
   */
  estimateWaitS(model: string): number {
    const h = this.#holds.get(model);
    const avg = h?.avgMs ?? UNKNOWN_HOLD_MS;
    const now = performance.now();
    let oldest = 0;
    for (const g of h?.held ?? []) oldest = Math.max(oldest, now - g.since);
    let slots = 0;
    const pools = new Set<string>();
    for (const n of this.#fleet.candidates(model)) {
      if (n.pool && pools.has(n.pool.key)) continue; // an instance counts once
      if (n.pool) pools.add(n.pool.key);
      slots += slotsOf(n);
    }
    const ahead = this.#waiters.filter((w) => w.model === model).length;
    const ms = Math.max(0, avg - oldest) +
      Math.floor(ahead / Math.max(1, slots)) * avg;
    return Math.min(3600, Math.max(1, Math.ceil(ms / 1000)));
  }

  /** Requests in flight from this gateway on `nodeId`. */
  inFlight(nodeId: string): number {
    return this.#inflight.get(nodeId) ?? 0;
  }

  /** Requests waiting for a slot. */
  get queued(): number {
    return this.#waiters.length;
  }

  /**
   * Takes a slot on the best node for `model` (not `exclude`; the
   * conversation's node for `affinity`), waiting in the queue if all are
   * busy.
   */
  acquire(
    model: string,
    signal: AbortSignal,
    exclude: string | null = null,
    affinity: number | null = null,
    tenant: RouteTenant | null = null,
  ): Promise<SlotGrant> {
    const [cands, fallback] = this.#candidates(model, exclude, tenant);
    if (cands.length === 0 && fallback.length === 0) {
      return Promise.reject(
        new OpenAIError(
          503,
          "no_available_node",
          `No healthy node serves the model \`${model}\` right now`,
          {
            headers: { "retry-after": "5" },
          },
        ),
      );
    }
    const slot = this.#pick(cands, affinity, model) ??
      this.#pick(fallback, affinity, model);
    if (slot) return Promise.resolve(slot);
    if (this.#waiters.length >= this.#queueMax) {
      return Promise.reject(
        new CapacityError("queue_full", 0, this.estimateWaitS(model)),
      );
    }
    return new Promise<SlotGrant>((resolve, reject) => {
      const w: Waiter = {
        since: performance.now(),
        model,
        exclude,
        affinity,
        tenant,
        resolve,
        reject,
        done: false,
      };
      const fail = (e: unknown) => {
        if (w.done) return;
        w.done = true;
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        const i = this.#waiters.indexOf(w);
        if (i >= 0) this.#waiters.splice(i, 1);
        this.#idle();
        reject(e);
      };
      const onAbort = () => fail(signal.reason);
      const timer = setTimeout(() => {
        // the estimate counts those still waiting, not this one
        const i = this.#waiters.indexOf(w);
        if (i >= 0) this.#waiters.splice(i, 1);
        fail(
          new CapacityError(
            "queue_timeout",
            Math.round(performance.now() - w.since),
            this.estimateWaitS(model),
          ),
        );
      }, this.queueTimeoutFor(model));
      signal.addEventListener("abort", onAbort, { once: true });
      w.resolve = (l) => {
        w.done = true;
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        resolve(l);
      };
      this.#waiters.push(w);
      this.#recheck ??= setInterval(() => this.#wake(), RECHECK_MS);
    });
  }

  /**
   * The nodes a request may use, first choice then fallback. A tenant with
   * dedicated nodes gets its own (and shared ones as fallback only when it
   * may overflow); every other request gets shared nodes only, so a
   * dedicated node never serves another tenant.
   */
  #candidates(
    model: string,
    exclude: string | null,
    tenant: RouteTenant | null,
  ): [NodeView[], NodeView[]] {
    let all = this.#fleet.candidates(model);
    if (exclude) all = all.filter((n) => n.id !== exclude);
    const shared = all.filter((n) => !n.dedicatedTo);
    if (!tenant || !this.#fleet.hasDedicated?.(tenant.id)) {
      return [shared.length === all.length ? all : shared, []];
    }
    const own = all.filter((n) => n.dedicatedTo === tenant.id);
    return [own, tenant.overflowToShared ? shared : []];
  }

  /**
   * The least loaded node with a free slot (ties go to a random one of
   * them), or for an affinity the highest-scoring node within
   * AFFINITY_SLACK of that load.
   */
  #pick(
    cands: NodeView[],
    affinity: number | null,
    model: string,
  ): SlotGrant | null {
    let best: NodeView | null = null;
    let bestLoad = Infinity;
    let ties = 0;
    for (const n of cands) {
      const used = this.#used(n);
      const slots = slotsOf(n);
      if (used >= slots) continue;
      const load = used / slots;
      if (load < bestLoad) {
        best = n;
        bestLoad = load;
        ties = 1;
      } else if (load === bestLoad && Math.random() * ++ties < 1) {
        best = n; // reservoir sampling: each tied node with probability 1/ties
      }
    }
    if (!best) return null;
    if (affinity !== null && cands.length > 1) {
      let top = -1;
      for (const n of cands) {
        const used = this.#used(n);
        const slots = slotsOf(n);
        if (used >= slots || used / slots > bestLoad + AFFINITY_SLACK) continue;
        const score = rendezvous(affinity, this.#hashOf(n.id));
        if (score > top) [top, best] = [score, n];
      }
    }
    const node = best!;
    this.#inflight.set(node.id, (this.#inflight.get(node.id) ?? 0) + 1);
    const pool = node.pool?.key;
    if (pool) this.#inflight.set(pool, (this.#inflight.get(pool) ?? 0) + 1);
    let hold = this.#holds.get(model);
    if (!hold) {
      if (this.#holds.size >= 10_000) this.#holds.clear();
      this.#holds.set(model, hold = { avgMs: null, held: new Set() });
    }
    const h = hold;
    const held = { since: performance.now() };
    h.held.add(held);
    let released = false;
    return {
      node,
      queuedMs: 0,
      release: () => {
        if (released) return;
        released = true;
        h.held.delete(held);
        const ms = performance.now() - held.since;
        h.avgMs = h.avgMs === null ? ms : h.avgMs * 0.8 + ms * 0.2;
        for (const key of pool ? [node.id, pool] : [node.id]) {
          const n = (this.#inflight.get(key) ?? 1) - 1;
          if (n <= 0) this.#inflight.delete(key);
          else this.#inflight.set(key, n);
        }
        this.#wake();
      },
    };
  }

  /** Requests in flight from this gateway on a candidate: its instance's, for a spanning one. */
  #used(n: NodeView): number {
    return this.#inflight.get(n.pool?.key ?? n.id) ?? 0;
  }

  #hashOf(id: string): number {
    let h = this.#nodeHashes.get(id);
    if (h === undefined) {
      if (this.#nodeHashes.size >= 10_000) this.#nodeHashes.clear();
      this.#nodeHashes.set(id, h = nodeHash(id));
    }
    return h;
  }

  /** Gives free slots to waiters, first come first served (each may take several). */
  #wake(): void {
    for (let i = 0; i < this.#waiters.length; i++) {
      const w = this.#waiters[i]!;
      const [cands, fallback] = this.#candidates(w.model, w.exclude, w.tenant);
      const slot = this.#pick(cands, w.affinity, w.model) ??
        this.#pick(fallback, w.affinity, w.model);
      if (!slot) continue;
      this.#waiters.splice(i--, 1);
      slot.queuedMs = Math.round(performance.now() - w.since);
      w.resolve(slot);
    }
    this.#idle();
  }

  /** Stops looking at the fleet again once nobody waits. */
  #idle(): void {
    if (this.#waiters.length > 0 || this.#recheck === undefined) return;
    clearInterval(this.#recheck);
    this.#recheck = undefined;
  }
}
