/**
 * Shared by the fleet pages (nodes, mesh, models): their dependencies, and
 * reading a node's hardware probe and a link-test result for display.
 */
import type { LinkTests } from "../fleet/link_tests.ts";
import type { FleetRegistry } from "../fleet/registry.ts";
import type { LinkTestRecord } from "../store/nodes.ts";

/** What the fleet pages are built from. */
export interface FleetPagesDeps {
  fleet: Pick<FleetRegistry, "nodes" | "refresh">;
  links: LinkTests;
  /** How often the live endpoint pushes node state (default 2000 ms). */
  liveIntervalMs?: number;
  /** Requests waiting for a node slot at this gateway (its router's queue). */
  queued?: () => number;
}

/** Hardware facts from a probe (`orchard.probe/1` under `native`, or the basic one). */
export interface Hardware {
  os: string | null;
  cpu: string | null;
  gpu: string | null;
  memoryPressure: string | null;
  thermal: string | null;
  rdma: { available: boolean; reason: string | null };
  ports: { name: string; usable: boolean; reason: string | null }[];
  /**
   * Per RDMA device, its queue-pair and memory-region ceilings (from
   * ibv_query_device) and how many are in use where the OS says (else null):
   * Exo/MLX and Orchard share them.
   */
  headroom: {
    device: string;
    maxQp: number | null;
    maxMr: number | null;
    qpInUse: number | null;
    mrInUse: number | null;
  }[];
  /**
   * Which llama.cpp the node's llama engine runs (protocol/engine.ts
   * LlamaRuntime): `built` from the pinned source with RPC, or the
   * `prebuilt` package without; null for other engines and older nodes.
   */
  llama: {
    build: "built" | "prebuilt";
    version: string | null;
    tag: string | null;
    rpc: boolean;
    rdma: boolean;
  } | null;
}

type Obj = Record<string, unknown>;
const obj = (v: unknown): Obj | null =>
  v && typeof v === "object" && !Array.isArray(v) ? v as Obj : null;
const text = (v: unknown): string | null =>
  typeof v === "string" && v ? v.slice(0, 200) : null;

/** Reads what the nodes page shows from a node's probe (missing parts are null). */
export function hardwareOf(probe: Obj | null): Hardware {
  const native = obj(probe?.native);
  const os = obj(native?.os);
  const cpu = obj(native?.cpu);
  const gpu = obj(native?.gpu);
  const rdma = obj(native?.rdma);
  const ports: Hardware["ports"] = [];
  const headroom: Hardware["headroom"] = [];
  const count = (v: unknown) =>
    typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : null;
  const devices = Array.isArray(rdma?.devices) ? rdma.devices : [];
  for (const d of devices.slice(0, 16)) {
    const dev = obj(d);
    const limits = obj(dev?.limits), used = obj(dev?.in_use);
    if (limits || used) {
      headroom.push({
        device: text(dev?.name) ?? "?",
        maxQp: count(limits?.max_qp),
        maxMr: count(limits?.max_mr),
        qpInUse: count(used?.qp),
        mrInUse: count(used?.mr),
      });
    }
    const list = Array.isArray(dev?.ports) ? dev.ports : [];
    for (const p of list.slice(0, 8)) {
      const port = obj(p);
      ports.push({
        name: `${text(dev?.name) ?? "?"}/${String(port?.port ?? "?")}`,
        usable: port?.usable === true,
        reason: text(port?.reason),
      });
    }
  }
  const gpuName = text(gpu?.name);
  const cores = typeof gpu?.core_count === "number" ? gpu.core_count : null;
  const llama = obj(probe?.llama);
  const build = llama?.build === "built" || llama?.build === "prebuilt"
    ? llama.build
    : null;
  const ws = typeof gpu?.recommended_max_working_set_bytes === "number"
    ? gpu.recommended_max_working_set_bytes
    : null;
  return {
    os: text(os?.pretty_name) ?? text(os?.name) ??
      (probe ? text(probe.os) : null),
    cpu: text(cpu?.brand),
    gpu: gpuName
      ? `${gpuName}${cores ? `, ${cores} cores` : ""}${
        ws ? `, ${(ws / 2 ** 30).toFixed(0)} GiB working set` : ""
      }`
      : null,
    memoryPressure: text(obj(native?.memory)?.pressure),
    thermal: text(obj(native?.thermal)?.state),
    rdma: {
      available: rdma?.available === true,
      reason: text(rdma?.reason),
    },
    ports,
    headroom,
    llama: build
      ? {
        build,
        version: text(llama?.version),
        tag: text(llama?.tag),
        rpc: llama?.rpc === true,
        rdma: llama?.rdma === true,
      }
      : null,
  };
}

/** Health of a link against TB5 thresholds. */
export type LinkHealth = "ok" | "warn" | "bad";

/** A link-test result as the mesh shows it. */
export interface LinkCell {
  health: LinkHealth;
  transport: string | null;
  latencyUs: number | null;
  gbPerSec: number | null;
  at: string;
  error: string | null;
}

/** Healthy: ≤ 10 µs one way and ≥ 7 GB/s; bad: > 25 µs or < 4 GB/s (or failed). */
export function linkCell(rec: LinkTestRecord): LinkCell {
  const r = obj(rec.result);
  const lat = obj(obj(r?.latency)?.one_way_us);
  const latencyUs = typeof lat?.p50 === "number"
    ? lat.p50
    : typeof r?.latencyUs === "number"
    ? r.latencyUs
    : null;
  const bw = obj(r?.bandwidth)?.bytes_per_sec;
  const gbPerSec = typeof bw === "number" ? bw / 1e9 : null;
  let health: LinkHealth = "ok";
  if (!rec.ok || latencyUs === null) health = "bad";
  else if (latencyUs > 25 || (gbPerSec !== null && gbPerSec < 4)) {
    health = "bad";
  } else if (latencyUs > 10 || (gbPerSec !== null && gbPerSec < 7)) {
    health = "warn";
  }
  return {
    health,
    transport: text(r?.transport),
    latencyUs,
    gbPerSec,
    at: rec.at,
    error: rec.error,
  };
}

/** "12 s ago", "5 min ago", "3 h ago". */
export function ago(iso: string | null, now = Date.now()): string {
  if (!iso) return "never";
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}
