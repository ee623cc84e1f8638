/**
 * Exo's cluster state, read by the openai engine when its upstream is Exo:
 * which running instance serves each model, and on which Exo nodes.
 *
 * The shapes are Exo 1.0's (exo-explore/exo), as its API serialises them
 * (pydantic, camelCase aliases, tagged unions as `{ClassName: {...}}`):
 * - `GET /node_id` answers the node's id, a JSON string
 *   (src/exo/api/main.py: `self.app.get("/node_id")(lambda: self.node_id)`).
 * - `GET /state` answers `State` (src/exo/shared/types/state.py):
 *   `instances` (InstanceId → `{MlxRingInstance | MlxJacclInstance: …}`,
 *   src/exo/shared/types/worker/instances.py) each with `instanceId` and
 *   `shardAssignments` (`modelId`, `runnerToShard`: RunnerId → tagged
 *   shard metadata with `modelCard.storageSize.inBytes`, `startLayer`,
 *   `endLayer`, `nLayers`, `worldSize`; `nodeToRunner`: NodeId → RunnerId,
 *   src/exo/shared/types/worker/runners.py and shards.py), a ring
 *   instance's `hostsByNode` (NodeId → `[{ip, port}]`); `runners` (RunnerId
 *   → tagged RunnerStatus: RunnerReady, RunnerRunning, RunnerLoading,
 *   RunnerFailed with `errorMessage`, …); `nodeIdentities` (NodeId →
 *   `friendlyName`, …) and `nodeNetwork` (NodeId → `interfaces: [{name,
 *   ipAddress, interfaceType}]`, src/exo/shared/types/profiling.py).
 *
 * Everything here is untrusted input: every field is checked, unknown ones
 * are ignored, and the counts are capped (MAX_* below).
 */
import type {
  InstanceMember,
  InstanceState,
  SpanningInstance,
} from "../../protocol/engine.ts";

/** Most instances read from one state. */
const MAX_INSTANCES = 64;
/** Most members of one instance (the heartbeat's schema allows 32). */
const MAX_MEMBERS = 32;
/** Most addresses reported per member (the heartbeat's schema allows 16). */
const MAX_ADDRESSES = 16;
/** Longest id, host name or address kept (longer: the entry is skipped). */
const MAX_ID = 200;

type Json = Record<string, unknown>;

function obj(v: unknown): Json | null {
  return v !== null && typeof v === "object" && !Array.isArray(v)
    ? v as Json
    : null;
}

function str(v: unknown, max = MAX_ID): string | null {
  return typeof v === "string" && v.length > 0 && v.length <= max ? v : null;
}

/** A tagged pydantic model `{ClassName: {...}}`: its tag and body. */
function tagged(v: unknown): [string, Json] | null {
  const o = obj(v);
  if (!o) return null;
  const keys = Object.keys(o);
  if (keys.length !== 1) return null;
  const body = obj(o[keys[0]!]);
  return body ? [keys[0]!, body] : null;
}

/** The id `GET /node_id` answered, or null when the body is not one. */
export function parseExoNodeId(body: unknown): string | null {
  return str(body);
}

/** How an Exo instance's members talk: MLX over a TCP ring, or JACCL over RDMA. */
function transportOf(tag: string): "rdma" | "tcp" | null {
  if (tag === "MlxJacclInstance") return "rdma";
  if (tag === "MlxRingInstance") return "tcp";
  return null;
}

/** The instance's state from its runners' statuses. */
function stateOf(
  statuses: (string | null)[],
  errors: string[],
): { state: InstanceState; detail?: string } {
  if (statuses.some((s) => s === "RunnerFailed")) {
    return {
      state: "degraded",
      detail: errors[0] ? `a runner failed: ${errors[0]}` : "a runner failed",
    };
  }
  if (
    statuses.some((s) => s === "RunnerShutdown" || s === "RunnerShuttingDown")
  ) return { state: "stopped", detail: "a runner is shutting down" };
  if (
    statuses.length > 0 &&
    statuses.every((s) => s === "RunnerReady" || s === "RunnerRunning")
  ) return { state: "ready" };
  return { state: "loading" };
}

/**
 * The instances in an Exo `/state` body, by model id (the first instance
 * of a model when several run it), as the node at Exo id `selfId` reports
 * them: every fronting node serves (Exo's API on any node reaches every
 * instance), members are the Exo nodes the shards are assigned to, the one
 * that is `selfId` marked `self`.
 */
export function exoInstances(
  state: unknown,
  selfId: string | null,
): Map<string, SpanningInstance> {
  const out = new Map<string, SpanningInstance>();
  const s = obj(state);
  if (!s) return out;
  const runners = obj(s.runners) ?? {};
  const identities = obj(s.nodeIdentities) ?? {};
  const network = obj(s.nodeNetwork) ?? {};
  const entries = Object.entries(obj(s.instances) ?? {}).slice(
    0,
    MAX_INSTANCES,
  );
  for (const [key, raw] of entries) {
    const t = tagged(raw);
    if (!t) continue;
    const [tag, inst] = t;
    const id = str(inst.instanceId) ?? str(key);
    const sa = obj(inst.shardAssignments);
    const model = str(sa?.modelId);
    if (!id || !sa || !model || out.has(model)) continue;
    const shards = obj(sa.runnerToShard) ?? {};
    const nodeToRunner = Object.entries(obj(sa.nodeToRunner) ?? {}).slice(
      0,
      MAX_MEMBERS,
    );
    const hostsByNode = obj(inst.hostsByNode) ?? {};
    const transport = transportOf(tag);
    const members: InstanceMember[] = [];
    const statuses: (string | null)[] = [];
    const errors: string[] = [];
    for (const [exoNodeId, runnerRaw] of nodeToRunner) {
      const runner = str(runnerRaw);
      if (!str(exoNodeId) || !runner) continue;
      const member: InstanceMember = { exoNodeId, transport };
      const addresses = new Set<string>();
      const net = obj(network[exoNodeId]);
      for (const i of Array.isArray(net?.interfaces) ? net.interfaces : []) {
        const ip = str(obj(i)?.ipAddress, 100);
        if (ip && addresses.size < MAX_ADDRESSES) addresses.add(ip);
      }
      const hosts = hostsByNode[exoNodeId];
      for (const h of Array.isArray(hosts) ? hosts : []) {
        const ip = str(obj(h)?.ip, 100);
        if (ip && addresses.size < MAX_ADDRESSES) addresses.add(ip);
      }
      if (addresses.size > 0) member.addresses = [...addresses];
      const name = str(obj(identities[exoNodeId])?.friendlyName, 255);
      if (name && name !== "Unknown") member.hostname = name;
      const [shardTag, shard] = tagged(shards[runner]) ?? [null, null];
      const bytes = obj(obj(shard?.modelCard)?.storageSize)?.inBytes;
      if (shard && typeof bytes === "number" && bytes >= 0) {
        // a pipeline shard holds its layers; a tensor shard 1/worldSize of each
        const { startLayer: a, endLayer: b, nLayers: n, worldSize: w } = shard;
        const share = shardTag === "TensorShardMetadata"
          ? 1 / Math.max(1, typeof w === "number" ? w : 1)
          : typeof a === "number" && typeof b === "number" &&
              typeof n === "number" && n > 0
          ? Math.max(0, b - a) / n
          : 1;
        member.memoryBytes = Math.round(Math.min(1e15, bytes * share));
      }
      if (selfId !== null && exoNodeId === selfId) member.self = true;
      members.push(member);
      const status = tagged(runners[runner]);
      statuses.push(status?.[0] ?? null);
      const err = str(status?.[1].errorMessage, 300);
      if (err) errors.push(err);
    }
    if (members.length === 0) continue;
    out.set(model, {
      id: `exo:${id}`,
      kind: "exo",
      members,
      serves: true,
      ...stateOf(statuses, errors),
    });
  }
  return out;
}
