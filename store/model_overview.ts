/**
 * Where each model runs: for every model some node lists or the placement
 * names, its replicas (nodes serving it) with their health, whether each
 * is loaded and pinned, the nodes that should serve it but do not, and
 * the aliases clients may use. What the models page and
 * `GET /api/admin/v1/models` show (platform admins).
 */
import { desiredModels, factsOf, type Placement } from "../fleet/placement.ts";
import type { PlacedModel, PlacementReport } from "../protocol/placement.ts";
import type { EngineModel } from "../protocol/engine.ts";
import { listNodes, type NodeDetail } from "./nodes.ts";
import {
  getModelAliases,
  getPlacement,
  type ModelAliases,
} from "./placement.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import type { Store } from "./store.ts";

/** One node's copy of a model. */
export interface Replica {
  nodeId: string;
  nodeName: string;
  state: NodeDetail["state"];
  loaded: boolean;
  /** The node lists it and can serve it now. */
  servable: boolean;
  /** The placement puts it here (null: no placement applies to the node). */
  placed: boolean | null;
  pinned: boolean;
  /** What is wrong with this copy, in words (null: nothing). */
  problem: string | null;
}

/** A model across the fleet. */
export interface ModelOverview {
  id: string;
  kind: EngineModel["kind"] | null;
  contextLength: number | null;
  /** The node's own aliases (llama sidecars) and the operator's. */
  aliases: string[];
  replicas: Replica[];
  /** Healthy nodes that serve it now. */
  healthyReplicas: number;
}

/** A node whose models differ from its placement. */
export interface NodeMismatch {
  nodeId: string;
  nodeName: string;
  engine: NodeDetail["engine"];
  desired: PlacedModel[];
  report: PlacementReport | null;
  /** The node's words ("desired X, engine serves Y"), or the gateway's when the node sent none. */
  mismatch: string;
}

/** Everything the models page shows. */
export interface ModelsView {
  models: ModelOverview[];
  mismatches: NodeMismatch[];
  placement: Placement;
  aliases: ModelAliases;
  /** Each node's desired models (null: no placement applies). */
  desired: Record<string, PlacedModel[] | null>;
  nodes: NodeDetail[];
}

/** Builds the models view (platform admins only). */
export async function modelsView(
  store: Store,
  p: Principal,
): Promise<ModelsView> {
  requirePlatform(p);
  const [nodes, placement, aliases] = await Promise.all([
    listNodes(store, p),
    getPlacement(store),
    getModelAliases(store),
  ]);
  const rows = new Map<string, ModelOverview>();
  const row = (id: string, m?: EngineModel) => {
    let r = rows.get(id);
    if (!r) {
      r = {
        id,
        kind: m?.kind ?? null,
        contextLength: m?.contextLength ?? null,
        aliases: [],
        replicas: [],
        healthyReplicas: 0,
      };
      rows.set(id, r);
    }
    if (m && r.kind === null) r.kind = m.kind;
    if (m?.contextLength && r.contextLength === null) {
      r.contextLength = m.contextLength;
    }
    return r;
  };
  const desired: Record<string, PlacedModel[] | null> = {};
  const mismatches: NodeMismatch[] = [];
  for (const n of nodes) {
    const want = desiredModels(
      placement,
      n.id,
      factsOf(n.engine, n.status?.memory ?? null, n.probe),
    );
    desired[n.id] = want;
    const wantBy = new Map((want ?? []).map((d) => [d.id, d.pinned]));
    const models = n.status?.models ?? n.models;
    for (const m of models) {
      const r = row(m.id, m);
      for (const a of m.aliases ?? []) {
        if (!r.aliases.includes(a)) r.aliases.push(a);
      }
      const servable = m.servable !== false;
      const placed = want ? wantBy.has(m.id) : null;
      const pinned = wantBy.get(m.id) === true;
      let problem: string | null = null;
      if (placed && servable && pinned && !m.loaded) {
        problem = n.status?.placement?.errors[m.id] ?? "pinned, not loaded yet";
      } else if (placed === false && servable) {
        problem = "not placed here, still served (the engine cannot unload it)";
      }
      r.replicas.push({
        nodeId: n.id,
        nodeName: n.name,
        state: n.state,
        loaded: m.loaded,
        servable,
        placed,
        pinned,
        problem,
      });
      if (servable && n.state === "healthy") r.healthyReplicas++;
    }
    // desired here but not listed by the node at all
    for (const d of want ?? []) {
      if (models.some((m) => m.id === d.id)) continue;
      row(d.id).replicas.push({
        nodeId: n.id,
        nodeName: n.name,
        state: n.state,
        loaded: false,
        servable: false,
        placed: true,
        pinned: d.pinned,
        problem: n.status?.placement?.errors[d.id] ??
          "placed here, but the node does not have it",
      });
    }
    const report = n.status?.placement ?? null;
    const listed = models.filter((m) => m.servable !== false).map((m) => m.id);
    const fallback = want && want.some((d) => !listed.includes(d.id))
      ? `desired ${
        want.map((d) => d.id).join(", ") || "nothing"
      }, engine serves ${listed.join(", ") || "nothing"}`
      : null;
    const mismatch = report?.mismatch ?? fallback;
    if (want && mismatch) {
      mismatches.push({
        nodeId: n.id,
        nodeName: n.name,
        engine: n.engine,
        desired: want,
        report,
        mismatch,
      });
    }
  }
  for (const [alias, target] of Object.entries(aliases)) {
    const r = rows.get(target);
    if (r && !r.aliases.includes(alias)) r.aliases.push(alias);
  }
  for (const r of rows.values()) r.aliases.sort();
  return {
    models: [...rows.values()].sort((a, b) => a.id.localeCompare(b.id)),
    mismatches,
    placement,
    aliases,
    desired,
    nodes,
  };
}
