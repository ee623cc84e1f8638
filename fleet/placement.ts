/**
 * Model placement, the pure part both sides share: which models a node
 * should serve (and which of them keep loaded: pinned), from the
 * operator's per-node entries and rules over the hardware facts the node
 * reports; and how a node's models compare with what it was asked for.
 *
 * The gateway computes a node's desired set at each heartbeat
 * (store/placement.ts reads the operator's placement) and answers it; the
 * node applies it (the llama engine loads pinned models, unloads and stops
 * serving the rest; a fronted engine cannot, so it only reports) and sends
 * back a `PlacementReport` with its next heartbeat.
 */
import type { EngineModel } from "../node/engine.ts";

/** One model a node should serve; `pinned`: keep it loaded, never evict it. */
export interface PlacedModel {
  id: string;
  pinned: boolean;
}

/** The facts a rule can test, as the node reports them. */
export interface NodeFacts {
  engine: "llama" | "openai";
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
  engine?: "llama" | "openai";
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

/** How a node's models compare with its desired set (sent in its heartbeat). */
export interface PlacementReport {
  /** The desired models it applied. */
  desired: PlacedModel[];
  /** Desired models it does not serve (no such file, or the engine does not run them). */
  missing: string[];
  /** Pinned models not loaded (yet, or because loading failed: see `errors`). */
  notLoaded: string[];
  /** Models it serves that are not desired (a fronted engine cannot unload them). */
  extra: string[];
  /** Why a desired model could not be loaded, by model id. */
  errors: Record<string, string>;
  /** One line for people, e.g. "desired qwen-7b, engine serves llama-3"; null when it matches. */
  mismatch: string | null;
}

/**
 * Compares what a node serves with its desired set. `canUnload`: the
 * engine stops serving models not desired (llama); a fronted engine
 * cannot, so they are reported as `extra`.
 */
export function placementReport(
  desired: PlacedModel[],
  models: EngineModel[],
  opts: { canUnload: boolean; errors?: Record<string, string> },
): PlacementReport {
  const serves = (m: EngineModel) => m.servable !== false;
  const byId = new Map(models.map((m) => [m.id, m]));
  const want = new Set(desired.map((d) => d.id));
  const missing = desired.filter((d) => {
    const m = byId.get(d.id);
    return !m || !serves(m) || (!!opts.errors?.[d.id] && !m.loaded);
  }).map((d) => d.id);
  const notLoaded = desired.filter((d) =>
    d.pinned && byId.has(d.id) && !byId.get(d.id)!.loaded
  ).map((d) => d.id);
  const extra = opts.canUnload
    ? []
    : models.filter((m) => serves(m) && !want.has(m.id)).map((m) => m.id);
  const errors = Object.fromEntries(
    Object.entries(opts.errors ?? {}).filter(([id]) => want.has(id)),
  );
  let mismatch: string | null = null;
  if (missing.length || extra.length) {
    const served = models.filter(serves).map((m) => m.id);
    mismatch = `desired ${desired.map((d) => d.id).join(", ") || "nothing"}, ` +
      `engine serves ${served.join(", ") || "nothing"}`;
    const why = missing.filter((id) => errors[id]).map((id) =>
      `${id}: ${errors[id]}`
    );
    if (why.length) mismatch += ` (${why.join("; ")})`;
  }
  return { desired, missing, notLoaded, extra, errors, mismatch };
}
