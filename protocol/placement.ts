/**
 * Model placement on the wire: the models the gateway asks a node to serve
 * (`PlacedModel`, in each heartbeat answer), and how the node's models
 * compare with them (`PlacementReport`, in its next heartbeat).
 *
 * The node applies the desired set (the llama engine loads pinned models,
 * unloads and stops serving the rest; a fronted engine cannot, so it only
 * reports) and builds its report with `placementReport`. How the gateway
 * computes the desired set from the operator's placement is fleet-side
 * (fleet/placement.ts).
 */
import type { EngineModel } from "./engine.ts";

/** One model a node should serve (the operator placed it on the node). */
export interface PlacedModel {
  id: string;
  /** Keep it loaded: load it now, never unload or evict it when idle. */
  pinned: boolean;
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

/** The instance id of an RPC span placement: `rpc:<placement id>`. */
export function rpcInstanceId(spanId: string): string {
  return `rpc:${spanId}`;
}

/** A worker the head loads across: its RPC server, once it listens. */
export interface SpanWorker {
  nodeId: string;
  /** `host:port` of its ggml-rpc-server; null until the worker reports it listening. */
  endpoint: string | null;
  /** RDMA where the link test between head and worker passed over RDMA, else TCP. */
  transport: "rdma" | "tcp";
}

/**
 * A node's part in a spanning placement (one model loaded by a head across
 * its own memory and its workers' through ggml RPC), in the heartbeat
 * answer. A node takes part in at most one at a time.
 */
export type SpanAssignment =
  & {
    /** `rpc:<placement id>` (rpcInstanceId). */
    instance: string;
    model: string;
    /** Every member's node id, head first. */
    members: string[];
  }
  & (
    | {
      role: "head";
      /** The workers in order; the head loads once every endpoint is known. */
      workers: SpanWorker[];
      /** Share of the layers per member, head first (null: by free memory). */
      split: number[] | null;
    }
    | {
      role: "worker";
      head: string;
      /** The address the RPC server binds to: the one facing the head. */
      bind: string;
      transport: "rdma" | "tcp";
    }
  );
