/**
 * The spanning instances as the portal pages show them (`/nodes`,
 * `/mesh`, `/models`, `/capacity`): read from the node records, their last
 * heartbeats and probes, and grouped by fleet/instances.ts under the same
 * rules the gateway routes by (platform admins only).
 */
import {
  type FleetInstance,
  type InstanceNode,
  resolveInstances,
} from "../fleet/instances.ts";
import { k } from "./kv_keys.ts";
import { type NodeRecord, nodeState, type NodeStatus } from "./nodes.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import type { Store } from "./store.ts";

/** Every spanning instance the nodes report, sorted by model. */
export async function listInstances(
  store: Store,
  p: Principal,
  now = Date.now(),
): Promise<FleetInstance[]> {
  requirePlatform(p);
  const [records, statuses, probes] = await Promise.all([
    values<NodeRecord>(store, k.nodePrefix()),
    values<NodeStatus>(store, k.nodeStatusPrefix()),
    values<Record<string, unknown>>(store, k.nodeProbePrefix()),
  ]);
  const nodes: InstanceNode[] = [];
  let any = false;
  for (const [, rec] of records) {
    const st = statuses.get(rec.id) ?? null;
    const models = st?.models ?? rec.models;
    any ||= models.some((m) => m.instance);
    nodes.push({
      id: rec.id,
      name: rec.name,
      url: rec.url,
      state: nodeState(rec, st, now),
      models,
      stats: st?.stats ?? {
        inFlight: 0,
        queued: 0,
        slots: 0,
        tokensPerSecond: 0,
        healthy: false,
      },
      dedicatedTo: rec.dedicatedTo ?? null,
      probe: probes.get(rec.id) ?? null,
    });
  }
  if (!any) return [];
  return [...resolveInstances(nodes).values()].sort((a, b) =>
    a.model.localeCompare(b.model) || (a.id < b.id ? -1 : 1)
  );
}

async function values<T>(
  store: Store,
  prefix: Deno.KvKey,
): Promise<Map<string, T>> {
  const out = new Map<string, T>();
  for await (const e of store.kv.list<T>({ prefix })) {
    out.set(String(e.key[1]), e.value);
  }
  return out;
}
