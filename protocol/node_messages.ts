/**
 * The wire contract between gateway and nodes: paths, JWT audiences and
 * lifetimes, and the enrollment and heartbeat message shapes. Both sides
 * import it, so a change is one edit.
 */
import type { EngineKind, EngineModel, EngineStats } from "./engine.ts";
import type {
  PlacedModel,
  PlacementReport,
  SpanAssignment,
} from "./placement.ts";

/** Where the gateway mounts the node-facing API. */
export const NODE_API_PATH = "/api/node/v1";
/** `iss` of gateway→node JWTs and `aud` of node→gateway JWTs. */
export const GATEWAY_AUDIENCE = "orchard-gateway";
/** Lifetime of every gateway↔node JWT, seconds. */
export const NODE_JWT_TTL_SECONDS = 60;
/** How long a signed gateway→node JWT is reused before signing a new one, ms. */
export const NODE_JWT_REUSE_MS = 15_000;
/** Oldest `iat` accepted on a gateway↔node JWT. */
export const NODE_JWT_MAX_AGE = "2m";

/** `POST /enroll` request. */
export interface EnrollRequest {
  token: string;
  publicJwk: JsonWebKey;
  url: string;
  name?: string;
  engine: EngineKind;
  models: EngineModel[];
  probe: Record<string, unknown> | null;
  version: string | null;
}

/** `POST /enroll` response. */
export interface EnrollResponse {
  nodeId: string;
  name: string;
  url: string;
  gatewayJwks: { keys: JsonWebKey[] };
}

/** `POST /heartbeat` request. */
export interface HeartbeatRequest extends EngineStats {
  intervalMs: number;
  memory: { totalBytes: number; freeBytes: number } | null;
  models: EngineModel[];
  drainState: "none" | "draining" | "drained";
  probe?: Record<string, unknown>;
  /** The URL the node serves at now (updated when it changed since enrollment). */
  url?: string;
  /** How its models compare with the placement it last received (null: none applies). */
  placement?: PlacementReport | null;
}

/**
 * Whether the gateway reaches a node at the URL it advertises: a
 * gateway-signed `GET {url}/health`, at enrollment, on the first heartbeat,
 * then every few minutes (fleet/reachability.ts).
 */
export interface Reachability {
  /** The URL checked. */
  url: string;
  ok: boolean;
  /** Why it is not reachable (absent when ok). */
  error?: string;
  checkedAt: string;
}

/** `POST /heartbeat` response. */
export interface HeartbeatResponse {
  drain: boolean;
  /** The gateway's last check of the node's current URL (absent until one ended). */
  reachability?: Reachability;
  /**
   * The models the node should serve, pinned ones kept loaded
   * (fleet/placement.ts); null or absent: no placement applies, serve
   * whatever the engine has.
   */
  placement?: PlacedModel[] | null;
  /**
   * The node's part in a spanning placement (head or worker of an RPC
   * split); null or absent: none, and a worker stops its RPC server.
   */
  span?: SpanAssignment | null;
}
