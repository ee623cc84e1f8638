/**
 * Spanning instances in the fleet: one model instance running across
 * several machines (a llama.cpp RPC split, or an Exo instance sharded
 * across Macs), as the nodes that host or front it report it
 * (protocol/engine.ts `SpanningInstance`). Pure: the registry
 * (fleet/registry.ts) calls it on each fleet read, the capacity report
 * (store/capacity.ts) on the statuses it reads.
 *
 * Rules:
 * - **One unit of capacity.** Every node reporting the same instance id is
 *   grouped; its slots count once (the most any of its serving nodes
 *   reports), and requests go only to nodes reporting `serves: true` (rpc:
 *   the head; exo: any fronting node, so they fail over to each other).
 * - **Members.** An Orchard member is named by `nodeId`; an Exo member by
 *   `exoNodeId`, resolved to the node that reports it as `self` (the Exo
 *   node behind that node's upstream), else to the one node sharing one of
 *   its addresses or its host name (probe `addresses`, `hostname`, the
 *   node URL's host). None, or several: the member is unmanaged.
 * - **Availability.** Any managed member gone, unhealthy, draining or
 *   drained, or the instance not `ready`: unavailable (the gateway answers
 *   503 `model_unavailable` with `retry-after`), until the member is back.
 * - **Dedication.** Members all dedicated to one tenant: the instance is
 *   that tenant's (its fronting nodes serve only that tenant). Some
 *   dedicated and some not (another tenant's, shared, or unmanaged): the
 *   instance is degraded, with the reason, and not routed.
 */
import type {
  EngineModel,
  EngineStats,
  InstanceKind,
  InstanceMember,
  InstanceState,
} from "../protocol/engine.ts";
import type { NodeState } from "./types.ts";
import {
  type Identity,
  identityOf,
  resolveMember,
} from "./_instance_members.ts";

/** What the grouping needs to know of a node. */
export interface InstanceNode {
  id: string;
  name: string;
  url: string;
  state: NodeState;
  models: readonly EngineModel[];
  stats: EngineStats;
  dedicatedTo: string | null;
  /** Its last probe's `hostname` and `addresses`, when it sent them. */
  probe?: Record<string, unknown> | null;
}

/** A member as the fleet sees it: resolved to an Orchard node, or unmanaged. */
export interface FleetMember extends InstanceMember {
  /** The Orchard node it is (null: unmanaged, no Orchard node runs there). */
  nodeId?: string;
  managed: boolean;
  /** How it was matched to its node. */
  matchedBy?: "node_id" | "self" | "address" | "hostname";
  /** Its node's name and state (managed members). */
  name?: string;
  nodeState?: NodeState | "gone";
  dedicatedTo?: string | null;
}

/** A spanning instance as the fleet sees it. */
export interface FleetInstance {
  id: string;
  kind: InstanceKind;
  /** The model it runs. */
  model: string;
  members: FleetMember[];
  /** The head (rpc), when one member says it is. */
  head: string | null;
  /** Nodes that report it with `serves: true` (fronting nodes, or the head). */
  fronts: string[];
  /** Fronting nodes requests may go to (healthy, and not another tenant's). */
  serving: string[];
  /** The fronting nodes' names, by id (for pages). */
  frontNames: Record<string, string>;
  /** What its members say it is doing (the worst any reports). */
  state: InstanceState;
  /** Whether requests may be routed to it now. */
  available: boolean;
  /** Why it is not available or degraded (null: it is fine). */
  reason: string | null;
  /** The tenant whose dedicated nodes it runs on alone, or null (shared). */
  dedicatedTo: string | null;
  /** Its slots: one unit of capacity, counted once. */
  slots: number;
}

const STATE_RANK: Record<InstanceState, number> = {
  ready: 0,
  loading: 1,
  degraded: 2,
  stopped: 3,
};

/** The key a member is merged on across reports. */
function memberKey(m: InstanceMember): string {
  return m.nodeId ? `node:${m.nodeId}` : `exo:${m.exoNodeId ?? "?"}`;
}

/** Groups the nodes' reported instances and applies the rules above. */
export function resolveInstances(
  nodes: readonly InstanceNode[],
): Map<string, FleetInstance> {
  const byId = new Map<string, InstanceNode>(nodes.map((n) => [n.id, n]));
  const ids = new Map<InstanceNode, Identity>();
  const identity = (n: InstanceNode) => {
    let i = ids.get(n);
    if (!i) ids.set(n, i = identityOf(n));
    return i;
  };
  type Group = {
    kind: InstanceKind;
    model: string;
    members: Map<string, InstanceMember>;
    selfOf: Map<string, string>;
    fronts: Set<string>;
    state: InstanceState;
    detail: string | null;
  };
  const groups = new Map<string, Group>();
  for (const n of nodes) {
    for (const m of n.models) {
      const inst = m.instance;
      if (!inst) continue;
      let g = groups.get(inst.id);
      if (!g) {
        groups.set(
          inst.id,
          g = {
            kind: inst.kind,
            model: m.id,
            members: new Map(),
            selfOf: new Map(),
            fronts: new Set(),
            state: inst.state,
            detail: inst.detail ?? null,
          },
        );
      }
      for (const mem of inst.members) {
        const key = memberKey(mem);
        if (!g.members.has(key)) g.members.set(key, mem);
        if (mem.self && mem.exoNodeId) g.selfOf.set(mem.exoNodeId, n.id);
      }
      if (inst.serves) g.fronts.add(n.id);
      // the worst state any reporting node that can tell (a healthy one) says
      if (
        n.state !== "unhealthy" &&
        STATE_RANK[inst.state] > STATE_RANK[g.state]
      ) {
        g.state = inst.state;
        g.detail = inst.detail ?? g.detail;
      }
    }
  }
  const out = new Map<string, FleetInstance>();
  for (const [id, g] of groups) {
    const members: FleetMember[] = [];
    for (const mem of g.members.values()) {
      members.push(resolveMember(mem, g.selfOf, byId, nodes, identity));
    }
    const reasons: string[] = [];
    if (g.state !== "ready") {
      reasons.push(`it is ${g.state}${g.detail ? `: ${g.detail}` : ""}`);
    }
    for (const m of members) {
      if (!m.managed) continue;
      const who = m.name ?? m.nodeId;
      if (m.nodeState === "gone") reasons.push(`member ${who} is gone`);
      else if (m.nodeState !== "healthy") {
        reasons.push(`member ${who} is ${m.nodeState}`);
      }
    }
    const tenants = new Set(
      members.map((m) => m.managed ? m.dedicatedTo ?? null : null),
    );
    let dedicatedTo: string | null = null;
    let state = g.state;
    let degraded: string | null = null;
    if (tenants.size === 1) dedicatedTo = [...tenants][0] ?? null;
    else if ([...tenants].some((t) => t !== null)) {
      degraded = "it mixes a tenant's dedicated nodes with " +
        (tenants.has(null) ? "shared or unmanaged nodes" : "another tenant's");
      reasons.unshift(degraded);
      state = "degraded";
    }
    const fronts = [...g.fronts].sort();
    const serving = fronts.filter((f) => {
      const n = byId.get(f);
      return !!n && n.state === "healthy" &&
        (n.dedicatedTo === null || n.dedicatedTo === dedicatedTo);
    });
    if (serving.length === 0 && fronts.length > 0) {
      reasons.push("no fronting node can take requests");
    }
    let slots = 0;
    for (const f of serving) {
      slots = Math.max(slots, byId.get(f)?.stats.slots ?? 0);
    }
    const head = members.find((m) => m.role === "head");
    out.set(id, {
      id,
      kind: g.kind,
      model: g.model,
      members,
      head: head?.nodeId ?? head?.exoNodeId ?? null,
      fronts,
      serving,
      frontNames: Object.fromEntries(
        fronts.map((f) => [f, byId.get(f)?.name ?? f]),
      ),
      state,
      available: reasons.length === 0 && serving.length > 0,
      reason: reasons.length > 0 ? reasons.join("; ") : null,
      dedicatedTo: degraded ? null : dedicatedTo,
      slots,
    });
  }
  return out;
}

/** The instance a node's model runs as, if it spans machines. */
export function instanceOf(
  m: EngineModel,
  table: ReadonlyMap<string, FleetInstance>,
): FleetInstance | null {
  return m.instance ? table.get(m.instance.id) ?? null : null;
}

/**
 * The slots of a set of nodes as units of capacity: each node's own, but
 * the nodes that serve one spanning instance count once, for the most any
 * of them has (null: no node reported slots).
 */
export function slotUnits(
  nodes: Iterable<
    { stats: { slots: number }; models: readonly EngineModel[] }
  >,
): number | null {
  let total: number | null = null;
  const pools = new Map<string, number>();
  for (const n of nodes) {
    const inst = n.models.find((m) => m.instance?.serves)?.instance;
    if (inst) {
      pools.set(inst.id, Math.max(pools.get(inst.id) ?? 0, n.stats.slots));
    } else total = (total ?? 0) + n.stats.slots;
  }
  for (const s of pools.values()) total = (total ?? 0) + s;
  return total;
}
