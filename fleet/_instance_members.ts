/**
 * How an instance's members are matched to Orchard nodes
 * (fleet/instances.ts): by node id; an Exo member by the node that reports
 * it as its own Mac, else by the one node sharing one of its addresses,
 * else by the one node with its host name; none or several: unmanaged.
 */
import type { InstanceMember } from "../protocol/engine.ts";
import type { FleetMember, InstanceNode } from "./instances.ts";

/** A node's addresses (probe and URL host) and host name, lower case. */
export type Identity = { addresses: Set<string>; host: string | null };

function hostOf(url: string): string | null {
  try {
    return new URL(url).hostname.replace(/^\[|\]$/g, "").toLowerCase();
  } catch {
    return null;
  }
}

/** The addresses and host name a node's probe and URL give. */
export function identityOf(
  n: InstanceNode,
): Identity {
  const addresses = new Set<string>();
  const p = n.probe ?? {};
  if (Array.isArray(p.addresses)) {
    for (const a of p.addresses.slice(0, 64)) {
      if (typeof a === "string") addresses.add(a.toLowerCase());
    }
  }
  const u = hostOf(n.url);
  if (u && u !== "127.0.0.1" && u !== "localhost" && u !== "::1") {
    addresses.add(u);
  }
  const host = typeof p.hostname === "string"
    ? p.hostname.toLowerCase().replace(/\.local\.?$/, "")
    : null;
  return { addresses, host };
}

/** The member as the fleet sees it: resolved to a node, or unmanaged. */
export function resolveMember(
  mem: InstanceMember,
  selfOf: Map<string, string>,
  byId: Map<string, InstanceNode>,
  nodes: readonly InstanceNode[],
  identity: (n: InstanceNode) => Identity,
): FleetMember {
  const { self: _self, ...rest } = mem;
  const as = (
    n: InstanceNode | undefined,
    matchedBy: FleetMember["matchedBy"],
    nodeId?: string,
  ): FleetMember =>
    n
      ? {
        ...rest,
        nodeId: n.id,
        managed: true,
        matchedBy,
        name: n.name,
        nodeState: n.state,
        dedicatedTo: n.dedicatedTo,
      }
      : { ...rest, nodeId, managed: true, matchedBy, nodeState: "gone" };
  if (mem.nodeId) return as(byId.get(mem.nodeId), "node_id", mem.nodeId);
  const self = mem.exoNodeId ? selfOf.get(mem.exoNodeId) : undefined;
  if (self) return as(byId.get(self), "self", self);
  const addrs = (mem.addresses ?? []).map((a) => a.toLowerCase());
  const byAddr = nodes.filter((n) =>
    addrs.some((a) => identity(n).addresses.has(a))
  );
  if (byAddr.length === 1) return as(byAddr[0], "address");
  const host = mem.hostname?.toLowerCase().replace(/\.local\.?$/, "");
  if (host && byAddr.length === 0) {
    const byHost = nodes.filter((n) => identity(n).host === host);
    if (byHost.length === 1) return as(byHost[0], "hostname");
  }
  return { ...rest, managed: false };
}
