/**
 * An Exo 1.0 `GET /state` body, for scripted upstreams: built from the
 * shapes in exo-explore/exo's source, as its API serialises them (pydantic
 * models with camelCase aliases, `src/exo/utils/pydantic_ext.py`
 * FrozenModel; tagged unions as `{ClassName: {...}}`, TaggedModel):
 * - `State` (src/exo/shared/types/state.py): `instances`, `runners`,
 *   `nodeIdentities`, `nodeMemory`, `nodeNetwork`, `topology`, …
 * - `MlxRingInstance` / `MlxJacclInstance`
 *   (src/exo/shared/types/worker/instances.py): `instanceId`,
 *   `shardAssignments`, and `hostsByNode` + `ephemeralPort` (ring) or
 *   `jacclDevices` + `jacclCoordinators` (JACCL, RDMA).
 * - `ShardAssignments` (src/exo/shared/types/worker/runners.py):
 *   `modelId`, `runnerToShard`, `nodeToRunner`; runner statuses
 *   `RunnerReady`, `RunnerLoading`, `RunnerFailed` (`errorMessage`), …
 * - `PipelineShardMetadata` (src/exo/shared/types/worker/shards.py):
 *   `modelCard` (src/exo/shared/models/model_cards.py: `modelId`,
 *   `storageSize: {inBytes}`, `nLayers`, …), `deviceRank`, `worldSize`,
 *   `startLayer`, `endLayer`, `nLayers`.
 * - `NodeIdentity` and `NodeNetworkInfo` (src/exo/shared/types/profiling.py):
 *   `friendlyName`, `interfaces: [{name, ipAddress, interfaceType}]`.
 */

/** One Exo node of the scripted cluster. */
export interface ExoNode {
  id: string;
  friendlyName: string;
  ips: string[];
}

/** One running instance: a model pipelined across `members` (Exo node ids). */
export interface ExoInstanceSpec {
  instanceId: string;
  modelId: string;
  members: string[];
  /** Weights, bytes (split by layers across members). */
  bytes: number;
  nLayers: number;
  /** "MlxRingInstance" (TCP ring) or "MlxJacclInstance" (RDMA). */
  kind?: "MlxRingInstance" | "MlxJacclInstance";
  /** Each runner's status tag (default RunnerReady). */
  status?: string;
}

/** The `/state` body of an Exo cluster of `nodes` running `instances`. */
export function exoState(
  nodes: ExoNode[],
  instances: ExoInstanceSpec[],
): Record<string, unknown> {
  const out: Record<string, unknown> = {
    instances: {},
    runners: {},
    downloads: {},
    tasks: {},
    lastSeen: {},
    topology: { nodes: nodes.map((n) => n.id), connections: {} },
    lastEventAppliedIdx: 42,
    nodeIdentities: Object.fromEntries(nodes.map((n) => [n.id, {
      modelId: "Mac16,9",
      chipId: "Apple M3 Ultra",
      friendlyName: n.friendlyName,
      osVersion: "26.2",
      osBuildVersion: "25C56",
    }])),
    nodeMemory: Object.fromEntries(nodes.map((n) => [n.id, {
      ramTotal: { inBytes: 512 * 2 ** 30 },
      ramAvailable: { inBytes: 300 * 2 ** 30 },
      swapTotal: { inBytes: 0 },
      swapAvailable: { inBytes: 0 },
    }])),
    nodeNetwork: Object.fromEntries(nodes.map((n) => [n.id, {
      interfaces: n.ips.map((ip, i) => ({
        name: `en${i}`,
        ipAddress: ip,
        interfaceType: i === 0 ? "ethernet" : "thunderbolt",
      })),
    }])),
    instanceLinks: {},
    prefillServerPorts: {},
    customModelCards: {},
  };
  const insts = out.instances as Record<string, unknown>;
  const runners = out.runners as Record<string, unknown>;
  for (const spec of instances) {
    const per = Math.ceil(spec.nLayers / spec.members.length);
    const runnerToShard: Record<string, unknown> = {};
    const nodeToRunner: Record<string, string> = {};
    spec.members.forEach((node, rank) => {
      const runner = `runner-${spec.instanceId}-${rank}`;
      nodeToRunner[node] = runner;
      runnerToShard[runner] = {
        PipelineShardMetadata: {
          modelCard: {
            modelId: spec.modelId,
            storageSize: { inBytes: spec.bytes },
            nLayers: spec.nLayers,
            hiddenSize: 4096,
            supportsTensor: true,
            tasks: ["TextGeneration"],
            backends: ["mlx"],
          },
          deviceRank: rank,
          worldSize: spec.members.length,
          startLayer: rank * per,
          endLayer: Math.min(spec.nLayers, (rank + 1) * per),
          nLayers: spec.nLayers,
        },
      };
      runners[runner] = { [spec.status ?? "RunnerReady"]: {} };
    });
    const kind = spec.kind ?? "MlxRingInstance";
    const body: Record<string, unknown> = {
      instanceId: spec.instanceId,
      shardAssignments: { modelId: spec.modelId, runnerToShard, nodeToRunner },
    };
    if (kind === "MlxRingInstance") {
      body.hostsByNode = Object.fromEntries(spec.members.map((m) => [
        m,
        [{ ip: nodes.find((n) => n.id === m)?.ips[0] ?? "0.0.0.0", port: 0 }],
      ]));
      body.ephemeralPort = 52416;
    } else {
      body.jacclDevices = spec.members.map(() => spec.members.map(() => null));
      body.jacclCoordinators = Object.fromEntries(
        spec.members.map((m) => [m, "169.254.0.1:52417"]),
      );
    }
    insts[spec.instanceId] = { [kind]: body };
  }
  return out;
}
