/**
 * The fleet registry: an in-memory copy of node records and heartbeat
 * status, refreshed from KV every `refreshMs`, so `candidates()` is a
 * synchronous scan on the gateway hot path. Health is computed from the
 * time of the last heartbeat at each call, never by a timer that can die.
 */
import { signEdDSA } from "../lib/jwt.ts";
import { log } from "../lib/log.ts";
import type {
  EngineModel,
  EngineStats,
  PromptOverhead,
} from "../protocol/engine.ts";
import { k } from "../store/kv_keys.ts";
import {
  getNodeRecord,
  type NodeRecord,
  nodeState,
  type NodeStatus,
} from "../store/nodes.ts";
import type { Store } from "../store/store.ts";
import {
  GATEWAY_AUDIENCE,
  NODE_JWT_REUSE_MS,
  NODE_JWT_TTL_SECONDS,
} from "../protocol/node_messages.ts";
import type { Fleet, NodeTarget, NodeView, ServedModel } from "./types.ts";
import {
  type FleetInstance,
  instanceOf,
  resolveInstances,
} from "./instances.ts";

/** A node's JWT, and its target while the JWT is reused (one object, not one a call). */
interface NodeJwt {
  token: string;
  at: number;
  target?: NodeTarget;
}

/** Options of `createFleet`. */
export interface FleetDeps {
  store: Store;
  /** How often node records and status are re-read from KV (default 500 ms). */
  refreshMs?: number;
}

/** The fleet plus what its owner needs: a forced refresh and `close()`. */
export interface FleetRegistry extends Fleet {
  /** Every node the registry knows, whatever its state. */
  nodes(): NodeView[];
  /** Re-reads KV now (tests, and after admin changes on this instance). */
  refresh(): Promise<void>;
  /** Stops refreshing (resolves once a refresh in progress ends); idempotent. */
  close(): Promise<void>;
}

/** How long servedModels' list is reused while no fleet read came in (ms). */
const SERVED_TTL_MS = 250;

const NO_STATS: EngineStats = {
  inFlight: 0,
  queued: 0,
  slots: 0,
  tokensPerSecond: 0,
  healthy: false,
  detail: "no heartbeat yet",
};

function load(s: EngineStats): number {
  return (s.inFlight + s.queued) / Math.max(1, s.slots);
}

/** Creates the registry and starts refreshing it from KV. */
export function createFleet(deps: FleetDeps): FleetRegistry {
  const { store } = deps;
  const refreshMs = deps.refreshMs ?? 500;
  if (!(refreshMs > 0)) {
    throw new RangeError(
      `Cannot create fleet: refreshMs must be > 0: current value is ${refreshMs}`,
    );
  }
  let records = new Map<string, NodeRecord>();
  let statuses = new Map<string, NodeStatus>();
  let probes = new Map<string, Record<string, unknown>>();
  /** The spanning instances, as of a fleet read and a time (node health follows the clock). */
  let table: {
    gen: number;
    at: number;
    map: ReadonlyMap<string, FleetInstance>;
  } | null = null;
  /** Tenants some node is dedicated to. */
  let dedicated = new Set<string>();
  /** The operator's aliases (store/placement.ts): client-facing name → model id. */
  let aliases = new Map<string, string>();
  const jwts = new Map<string, NodeJwt>();
  let closed = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let inflight: Promise<void> | null = null;
  /** Fleet reads so far: what servedModels' list was built from. */
  let generation = 0;
  let served: { gen: number; at: number; list: readonly ServedModel[] } | null =
    null;

  async function readAll(): Promise<void> {
    const r = new Map<string, NodeRecord>();
    const s = new Map<string, NodeStatus>();
    for await (
      const e of store.kv.list<NodeRecord>({ prefix: k.nodePrefix() })
    ) {
      r.set(e.value.id, e.value);
    }
    const it = store.kv.list<NodeStatus>({ prefix: k.nodeStatusPrefix() });
    for await (const e of it) s.set(String(e.key[1]), e.value);
    const p = new Map<string, Record<string, unknown>>();
    const pl = store.kv.list<Record<string, unknown>>({
      prefix: k.nodeProbePrefix(),
    });
    for await (const e of pl) p.set(String(e.key[1]), e.value);
    const a = await store.kv.get<Record<string, string>>(k.modelAliases());
    records = r;
    statuses = s;
    probes = p;
    generation++;
    aliases = new Map(Object.entries(a.value ?? {}));
    dedicated = new Set(
      [...r.values()].map((n) => n.dedicatedTo).filter((t): t is string => !!t),
    );
    for (const id of jwts.keys()) if (!r.has(id)) jwts.delete(id);
  }

  function refresh(): Promise<void> {
    inflight ??= readAll().finally(() => inflight = null);
    return inflight;
  }

  function tick() {
    refresh().catch((err) =>
      log.warn("fleet refresh failed", { error: String(err) })
    ).finally(() => {
      if (!closed) timer = setTimeout(tick, refreshMs);
    });
  }
  tick();

  /** The spanning instances now (rebuilt per fleet read, and every SERVED_TTL_MS). */
  function instances(now: number): ReadonlyMap<string, FleetInstance> {
    if (table && table.gen === generation && now - table.at < SERVED_TTL_MS) {
      return table.map;
    }
    const raw = [...records.values()].map((r) => ({
      ...rawView(r, now),
      probe: probes.get(r.id) ?? null,
    }));
    const map = raw.some((v) => v.models.some((m) => m.instance))
      ? resolveInstances(raw)
      : new Map<string, FleetInstance>();
    table = { gen: generation, at: now, map };
    return map;
  }

  /**
   * A node as routing sees it: a model of a spanning instance is servable
   * here only while the instance is available and this node serves it.
   */
  function view(rec: NodeRecord, now: number): NodeView {
    const v = rawView(rec, now);
    if (!v.models.some((m) => m.instance)) return v;
    const map = instances(now);
    v.models = v.models.map((m) => {
      const inst = instanceOf(m, map);
      if (!inst || m.servable === false) return m;
      return inst.available && inst.serving.includes(rec.id)
        ? m
        : { ...m, servable: false as const };
    });
    return v;
  }

  /** For a candidate of `model`: its instance's pool and dedication. */
  function asCandidate(v: NodeView, model: string): NodeView {
    const m = v.models.find((x) => matches(x, model));
    if (!m?.instance) return v;
    const inst = instances(Date.now()).get(m.instance.id);
    if (!inst) return v;
    return {
      ...v,
      dedicatedTo: inst.dedicatedTo,
      pool: {
        key: `instance:${inst.id}`,
        slots: Math.max(1, inst.slots),
        members: inst.members.flatMap((x) =>
          x.managed && x.nodeId ? [x.nodeId] : []
        ),
      },
    };
  }

  function rawView(rec: NodeRecord, now: number): NodeView {
    const st = statuses.get(rec.id) ?? null;
    return {
      id: rec.id,
      name: rec.name,
      url: rec.url,
      engine: rec.engine,
      state: nodeState(rec, st, now),
      models: st?.models ?? rec.models,
      stats: st?.stats ?? NO_STATS,
      lastHeartbeatAt: st?.at ?? null,
      enrolledAt: rec.enrolledAt,
      dedicatedTo: rec.dedicatedTo ?? null,
    };
  }

  function serving(): NodeView[] {
    const now = Date.now();
    const out: NodeView[] = [];
    for (const rec of records.values()) {
      const v = view(rec, now);
      if (v.state === "healthy") out.push(v);
    }
    return out;
  }

  function matches(m: EngineModel, model: string): boolean {
    return m.id === model || (m.aliases?.includes(model) ?? false);
  }

  /** A model the node can serve (not one its engine lists but cannot serve now). */
  function servable(m: EngineModel): boolean {
    return m.servable !== false;
  }

  /** The node's current JWT (signed anew after NODE_JWT_REUSE_MS). */
  async function jwtFor(nodeId: string): Promise<NodeJwt> {
    const hit = jwts.get(nodeId);
    const now = Date.now();
    if (hit && now - hit.at < NODE_JWT_REUSE_MS) return hit;
    const token = await signEdDSA(store.secrets.gatewayPrivateKey, {}, {
      iss: GATEWAY_AUDIENCE,
      aud: nodeId,
      sub: "gateway",
      ttlSeconds: NODE_JWT_TTL_SECONDS,
    });
    const jwt: NodeJwt = { token, at: now };
    jwts.set(nodeId, jwt);
    return jwt;
  }

  /** A node's URL and the headers of a call to it. */
  async function nodeTarget(nodeId: string): Promise<NodeTarget> {
    const rec = records.get(nodeId) ?? await getNodeRecord(store, nodeId);
    if (!rec) {
      throw new Error(`Cannot call node ${nodeId}: it is not enrolled`);
    }
    const jwt = await jwtFor(nodeId);
    if (jwt.target?.url !== rec.url) {
      jwt.target = {
        url: rec.url,
        headers: { authorization: `Bearer ${jwt.token}` },
      };
    }
    return jwt.target;
  }

  /** The model an operator alias names, or `model` itself. */
  function unalias(model: string): string {
    return aliases.get(model) ?? model;
  }

  return {
    candidates(named) {
      const model = unalias(named);
      return serving().filter((v) =>
        v.models.some((m) => servable(m) && matches(m, model))
      ).map((v) => asCandidate(v, model))
        .sort((a, b) => load(a.stats) - load(b.stats));
    },
    knownModel(named) {
      const model = unalias(named);
      const now = Date.now();
      for (const rec of records.values()) {
        if (view(rec, now).models.some((m) => matches(m, model))) return true;
      }
      return false;
    },
    servedModels() {
      // Every request asks (to bound its prompt, to list models): built
      // once per fleet read and SERVED_TTL_MS (node health follows the
      // clock), not per request, which with several nodes listing dozens
      // of models each (Exo lists every card it knows) was a map, a copy
      // per model and a locale sort per request.
      const now = Date.now();
      if (
        served && served.gen === generation && now - served.at < SERVED_TTL_MS
      ) {
        return served.list;
      }
      const byId = new Map<
        string,
        {
          id: string;
          aliases: string[];
          kind: EngineModel["kind"];
          embeddings?: boolean;
          contextLength?: number;
          promptOverhead?: EngineModel["promptOverhead"];
          nodeIds: string[];
        }
      >();
      for (const v of serving()) {
        for (const m of v.models) {
          if (!servable(m)) continue;
          const got = byId.get(m.id);
          if (got) {
            got.nodeIds.push(v.id);
            got.embeddings = !!got.embeddings && !!m.embeddings;
            // any of its nodes may get a request: the smallest context holds
            if (m.contextLength) {
              got.contextLength = Math.min(
                got.contextLength ?? Infinity,
                m.contextLength,
              );
            }
            if (m.promptOverhead) {
              got.promptOverhead = maxOverhead(
                got.promptOverhead,
                m.promptOverhead,
              );
            }
            for (const a of m.aliases ?? []) {
              if (!got.aliases.includes(a)) got.aliases.push(a);
            }
          } else {
            byId.set(m.id, {
              id: m.id,
              aliases: [...(m.aliases ?? [])],
              kind: m.kind,
              ...(m.embeddings ? { embeddings: true } : {}),
              ...(m.contextLength ? { contextLength: m.contextLength } : {}),
              ...(m.promptOverhead ? { promptOverhead: m.promptOverhead } : {}),
              nodeIds: [v.id],
            });
          }
        }
      }
      for (const [alias, id] of aliases) {
        const got = byId.get(id);
        if (got && !got.aliases.includes(alias)) got.aliases.push(alias);
      }
      const list: readonly ServedModel[] = Object.freeze(
        [...byId.values()].sort((a, b) => a.id.localeCompare(b.id)).map((m) => {
          Object.freeze(m.aliases);
          Object.freeze(m.nodeIds);
          return Object.freeze(m);
        }),
      );
      served = { gen: generation, at: now, list };
      return list;
    },
    resolveModel(named) {
      const model = unalias(named);
      if (model !== named) return model;
      for (const v of serving()) {
        for (const m of v.models) {
          if (servable(m) && matches(m, model)) return m.id;
        }
      }
      return model;
    },
    nodeTarget,
    async fetchNode(nodeId, path, init) {
      const target = await nodeTarget(nodeId);
      const headers = new Headers(init.headers);
      for (const [k, v] of Object.entries(target.headers)) headers.set(k, v);
      return await fetch(target.url + path, {
        ...init,
        headers,
        redirect: "manual",
      });
    },
    nodes() {
      const now = Date.now();
      return [...records.values()].map((r) => view(r, now));
    },
    instances() {
      return [...instances(Date.now()).values()];
    },
    hasDedicated(tenantId) {
      return dedicated.has(tenantId);
    },
    operatorAliases() {
      return aliases;
    },
    refresh,
    async close() {
      closed = true;
      clearTimeout(timer);
      await inflight?.catch(() => {});
    },
  };
}

/** The larger bound of two nodes' template overheads for one model. */
function maxOverhead(
  a: PromptOverhead | undefined,
  b: PromptOverhead,
): PromptOverhead {
  if (!a) return b;
  return {
    fixed: Math.max(a.fixed, b.fixed),
    perMessage: Math.max(a.perMessage, b.perMessage),
    tools: Math.max(a.tools, b.tools),
  };
}
