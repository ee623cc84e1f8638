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
import type { PlacedModel } from "../protocol/placement.ts";

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

/** The operator's placement: entries per node id, and rules. */
export interface Placement {
  nodes: Record<string, PlacedModel[]>;
  rules: PlacementRule[];
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
