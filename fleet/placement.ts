/**
 * Model placement, the gateway's side: the operator's per-node entries and
 * rules over the hardware facts a node reports, and a node's desired set
 * computed from them (which models it should serve, and which of them keep
 * loaded: pinned).
 *
 * The gateway computes a node's desired set at each heartbeat
 * (store/placement.ts reads the operator's placement) and answers it; what
 * crosses the wire (the desired models, and the `PlacementReport` the node
 * sends back with its next heartbeat) is in protocol/placement.ts.
 */
import type { EngineKind } from "../protocol/engine.ts";
import {
  type PlacedModel,
  rpcInstanceId,
  type SpanAssignment,
} from "../protocol/placement.ts";

/** The facts a rule can test, as the node reports them. */
export interface NodeFacts {
  engine: EngineKind;
  /** Total memory in GiB (heartbeat), null when unknown. */
  memoryGb: number | null;
  /** `Deno.build.os` from the probe (`darwin`, `linux`, …), null when unknown. */
  os: string | null;
  /** `Deno.build.arch` from the probe (`aarch64`, `x86_64`), null when unknown. */
  arch: string | null;
}

/** A rule: every node whose facts match serves `model` (pinned or not). */
export interface PlacementRule {
  id: string;
  model: string;
  pinned: boolean;
  /** Conditions, all of which must hold (absent: any). */
  minMemoryGb?: number;
  engine?: EngineKind;
  os?: string;
  arch?: string;
}

/**
 * One model spanning several nodes: the head loads it across its own memory
 * and the workers' (ggml RPC); its instance id is `rpc:<id>`.
 */
export interface SpanPlacement {
  id: string;
  model: string;
  /** Head first, then the workers in layer order. */
  nodes: string[];
  /** Share of the layers per node, in `nodes` order (absent: by free memory). */
  split?: number[];
}

/** The operator's placement: entries per node id, rules, and spanning placements. */
export interface Placement {
  nodes: Record<string, PlacedModel[]>;
  rules: PlacementRule[];
  spans?: SpanPlacement[];
}

/** An empty placement (every node serves whatever it has, as before). */
export const NO_PLACEMENT: Placement = { nodes: {}, rules: [] };

/** Whether a rule's conditions hold for a node. */
export function ruleMatches(rule: PlacementRule, f: NodeFacts): boolean {
  if (rule.engine !== undefined && rule.engine !== f.engine) return false;
  if (rule.os !== undefined && rule.os !== f.os) return false;
  if (rule.arch !== undefined && rule.arch !== f.arch) return false;
  if (rule.minMemoryGb !== undefined) {
    if (f.memoryGb === null || f.memoryGb < rule.minMemoryGb) return false;
  }
  return true;
}

/**
 * A node's desired models: its own entries and every matching rule's
 * model (pinned when any of them pins it), sorted by id; null when
 * nothing places a model on it (it serves whatever its engine has).
 */
export function desiredModels(
  placement: Placement,
  nodeId: string,
  facts: NodeFacts,
): PlacedModel[] | null {
  const out = new Map<string, boolean>();
  let placed = false;
  for (const m of placement.nodes[nodeId] ?? []) {
    placed = true;
    out.set(m.id, (out.get(m.id) ?? false) || m.pinned);
  }
  for (const r of placement.rules) {
    if (!ruleMatches(r, facts)) continue;
    placed = true;
    out.set(r.model, (out.get(r.model) ?? false) || r.pinned);
  }
  if (!placed) return null;
  return [...out].map(([id, pinned]) => ({ id, pinned }))
    .sort((a, b) => a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
}

/** Facts from a heartbeat's memory and the node's probe. */
export function factsOf(
  engine: NodeFacts["engine"],
  memory: { totalBytes: number } | null,
  probe: Record<string, unknown> | null,
): NodeFacts {
  const total = memory?.totalBytes ??
    (probe?.memory as { totalBytes?: unknown } | undefined)?.totalBytes;
  return {
    engine,
    memoryGb: typeof total === "number" && total > 0
      ? Math.round(total / 2 ** 30 * 10) / 10
      : null,
    os: typeof probe?.os === "string" ? probe.os : null,
    arch: typeof probe?.arch === "string" ? probe.arch : null,
  };
}

/** What the gateway knows of a span member when it answers a heartbeat. */
export interface SpanMemberView {
  /** Whether the node's heartbeat is fresh (it is online). */
  online: boolean;
  /** The RPC endpoint the node reports for the instance (workers), if any. */
  endpoint: string | null;
  /** The address its URL advertises (host only). */
  urlHost: string | null;
}

/** A link test between two nodes, as the gateway stored it (a listened, b connected). */
export interface LinkView {
  a: string;
  b: string;
  ok: boolean;
  result: unknown;
}

/**
 * The head-facing side of the link between `head` and `worker`: the
 * worker's address on that link and whether the link test ran over RDMA,
 * from the newest passing link test of the pair; null when none passed.
 */
export function linkBetween(
  head: string,
  worker: string,
  links: LinkView[],
): { workerAddress: string | null; transport: "rdma" | "tcp" } | null {
  for (const l of links) {
    if (!l.ok) continue;
    if (
      !((l.a === head && l.b === worker) || (l.a === worker && l.b === head))
    ) {
      continue;
    }
    const r = (l.result ?? {}) as Record<string, unknown>;
    const side = (k: string) => (r[k] ?? {}) as Record<string, unknown>;
    // the connector (b) reports its own address as local, the listener's as peer
    const addr = l.b === worker ? side("local").address : side("peer").address;
    return {
      workerAddress: typeof addr === "string" && addr ? addr : null,
      // the link test names the RDMA mode (`rdma-uc`, …)
      transport: String(r.transport ?? "").startsWith("rdma") ? "rdma" : "tcp",
    };
  }
  return null;
}

/**
 * A node's part in the spanning placements (the first that names it), or
 * null. A worker is told to listen only while the head is online; the head
 * gets each worker's endpoint once the worker reports it.
 */
export function spanAssignment(
  placement: Placement,
  nodeId: string,
  view: (nodeId: string) => SpanMemberView,
  links: LinkView[],
): SpanAssignment | null {
  const span = (placement.spans ?? []).find((s) => s.nodes.includes(nodeId));
  if (!span) return null;
  const head = span.nodes[0]!;
  const base = {
    instance: rpcInstanceId(span.id),
    model: span.model,
    members: [...span.nodes],
  };
  if (nodeId === head) {
    return {
      ...base,
      role: "head",
      split: span.split ?? null,
      workers: span.nodes.slice(1).map((w) => {
        const v = view(w);
        return {
          nodeId: w,
          endpoint: v.online ? v.endpoint : null,
          transport: linkBetween(head, w, links)?.transport ?? "tcp",
        };
      }),
    };
  }
  if (!view(head).online) return null; // the head went away: stop listening
  const link = linkBetween(head, nodeId, links);
  const bind = link?.workerAddress ?? view(nodeId).urlHost;
  if (!bind) return null;
  return {
    ...base,
    role: "worker",
    head,
    bind,
    transport: link?.transport ?? "tcp",
  };
}
