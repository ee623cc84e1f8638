/**
 * The contract between the node registry (fleet) and the gateway's router.
 * The fleet knows which nodes exist, their health and load from heartbeats,
 * and how to call them with a gateway-signed JWT; the gateway picks among
 * `candidates()` and tracks its own in-flight counts per node.
 */
import type { FleetInstance } from "./instances.ts";
import type {
  EngineKind,
  EngineModel,
  EngineStats,
} from "../protocol/engine.ts";

/** Lifecycle state of a node as the gateway sees it. */
export type NodeState = "healthy" | "unhealthy" | "draining" | "drained";

/** What the gateway needs to know about a node to route to it. */
export interface NodeView {
  id: string;
  name: string;
  /** Base URL the gateway calls (validated at enrollment). */
  url: string;
  engine: EngineKind;
  state: NodeState;
  models: EngineModel[];
  /** Last heartbeat's load and health. */
  stats: EngineStats;
  lastHeartbeatAt: string | null;
  enrolledAt: string;
  /** The tenant it serves alone, or null (shared). */
  dedicatedTo: string | null;
  /**
   * For a candidate of a model that spans machines (fleet/instances.ts):
   * the instance its slots belong to. The router counts in-flight requests
   * and slots per pool, so the instance is one unit of capacity however
   * many nodes front it.
   */
  pool?: {
    key: string;
    slots: number;
    /** The Orchard nodes it runs on (managed members): all count busy while it works. */
    members: readonly string[];
  };
}

/** Where a node is called, and the headers each call carries. */
export interface NodeTarget {
  url: string;
  headers: Record<string, string>;
}

/** The node registry as the gateway uses it. */
/** A model some healthy, undrained node serves. */
export interface ServedModel {
  readonly id: string;
  readonly aliases: readonly string[];
  readonly kind: EngineModel["kind"];
  /** Every serving node also embeds with this chat model. */
  readonly embeddings?: boolean;
  readonly contextLength?: number;
  /** The largest template overhead its nodes report. */
  readonly promptOverhead?: EngineModel["promptOverhead"];
  readonly nodeIds: readonly string[];
}

export interface Fleet {
  /**
   * Healthy, undrained nodes serving `model` (an id or alias), least loaded
   * first. Empty when none can serve it.
   */
  candidates(model: string): NodeView[];
  /**
   * Every model (id, aliases) some healthy, undrained node serves (not
   * those it reports `servable: false`). Shared between callers (the
   * registry builds it once per fleet read, not per request): read only.
   */
  servedModels(): readonly ServedModel[];
  /** Every enrolled node, whatever its state (for metrics and pages). */
  nodes?(): NodeView[];
  /** The spanning instances the nodes report (fleet/instances.ts), for pages. */
  instances?(): readonly FleetInstance[];
  /** Whether some enrolled node (in any state) is dedicated to the tenant. */
  hasDedicated?(tenantId: string): boolean;
  /** The operator's aliases, client-facing name → model id (store/placement.ts). */
  operatorAliases?(): ReadonlyMap<string, string>;
  /** Resolves an alias to its model id (or returns the id unchanged). */
  resolveModel(model: string): string;
  /**
   * Whether some enrolled node lists `model` (id or alias) even though none
   * can serve it now (draining, unhealthy, down, or its engine lists it but
   * cannot serve it: `servable: false`): such a model is temporarily
   * unavailable (503), not unknown (404).
   */
  knownModel(model: string): boolean;
  /**
   * How to call a node: its base URL and the headers every call carries (a
   * short-lived gateway-signed JWT, `aud` = node id). The gateway's own
   * HTTP/1.1 client sends its requests with them.
   */
  nodeTarget(nodeId: string): Promise<NodeTarget>;
  /**
   * Calls a node with `fetch`: `path` like `/v1/chat/completions`, with the
   * target's headers added. Redirects are not followed.
   */
  fetchNode(nodeId: string, path: string, init: RequestInit): Promise<Response>;
}
