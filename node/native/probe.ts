/**
 * Hardware probe (orchard.probe/1) through liborchard, in process via FFI or
 * isolated in the orchard-linktest child process.
 *
 * @module
 */
import { ensureNativeBuilt, nativePaths } from "./build.ts";
import { Liborchard, ProbeFlags } from "./liborchard.ts";
import { type RdmaInUse, rdmaInUse } from "./rdma_usage.ts";

/** One failed or unsupported probe section. */
export interface ProbeError {
  section: string;
  code: "unsupported" | "failed" | "timeout" | "skipped";
  message: string;
}

/** One GID of an RDMA port. */
export interface ProbeGid {
  index: number;
  gid: string;
  kind: "ipv4-mapped" | "link-local" | "other";
  ipv4: string | null;
}

/** One RDMA port and whether the link test can use it. */
export interface ProbePort {
  port: number;
  state?: string;
  state_code?: number;
  phys_state?: number;
  link_layer?: "InfiniBand" | "Ethernet" | "unspecified";
  active_mtu?: number;
  max_mtu?: number;
  active_speed?: number;
  active_width?: number;
  speed_gbps?: number | null;
  lid?: number;
  gid_tbl_len?: number;
  gids?: ProbeGid[];
  usable: boolean;
  reason: string | null;
  gid_index?: number | null;
  error?: string;
}

/** One RDMA device (rdma_enN on macOS, mlx5_0 and friends on Linux). */
export interface ProbeDevice {
  name: string;
  interface: string | null;
  interface_ipv4: string | null;
  transport: number;
  transport_name: string;
  qp_type: "UC" | "RC";
  fw_ver?: string;
  vendor_id?: number;
  vendor_part_id?: number;
  hw_ver?: number;
  limits?: {
    max_qp: number;
    max_qp_wr: number;
    max_cq: number;
    max_cqe: number;
    max_mr: number;
    max_mr_size: number;
    max_sge: number;
    max_pd: number;
  };
  phys_port_cnt?: number;
  ports: ProbePort[];
  /** QPs and MRs in use (every program's), where the OS says; else null. */
  in_use?: RdmaInUse | null;
  error?: string;
}

/** A network interface. */
export interface ProbeInterface {
  name: string;
  up: boolean;
  running: boolean;
  loopback: boolean;
  mtu: number | null;
  mac: string | null;
  ipv4: string[];
  ipv6: string[];
  /** The IPv4 addresses with their prefix length ("10.0.12.1/30"). */
  ipv4_cidr?: string[];
}

/** orchard.probe/1: every section is present; a failed one is null with an entry in errors. */
export interface ProbeResult {
  schema: "orchard.probe/1";
  liborchard: { version: string; abi: number };
  taken_at_ms: number;
  os: {
    name: "macOS" | "Linux";
    version: string | null;
    pretty_name: string | null;
    build: string | null;
    kernel: string;
    arch: string;
    hostname: string;
  } | null;
  machine: { model: string | null; vendor: string | null } | null;
  cpu: {
    brand: string | null;
    logical_cores: number | null;
    physical_cores: number | null;
    performance_cores: number | null;
    efficiency_cores: number | null;
  } | null;
  memory: {
    total_bytes: number;
    available_bytes: number | null;
    pressure: "normal" | "warning" | "critical" | "unknown";
    pressure_source: string | null;
    pressure_value: number | null;
  } | null;
  gpu: {
    api: "metal";
    name: string;
    unified_memory: boolean;
    recommended_max_working_set_bytes: number;
    current_allocated_bytes: number;
    core_count: number | null;
  } | null;
  thermal: {
    state: "nominal" | "fair" | "serious" | "critical" | "unknown";
    source: string | null;
    max_zone_celsius: number | null;
  } | null;
  rdma: {
    library: {
      status: "loaded" | "missing";
      path: string | null;
      source: string | null;
      reason: string | null;
      link_test_capable?: boolean;
    };
    rdma_ctl: "enabled" | "disabled" | null;
    available: boolean;
    usable: boolean;
    reason: string | null;
    devices: ProbeDevice[];
  } | null;
  interfaces: ProbeInterface[] | null;
  duration_ms: number;
  errors: ProbeError[];
}

/** Options for probe(). */
export interface ProbeOptions {
  /** Overall bound in ms (default 5000). */
  timeoutMs?: number;
  skipRdma?: boolean;
  skipGpu?: boolean;
  /**
   * Run in the orchard-linktest child process, killed after timeoutMs + 2 s:
   * a verbs call that hangs the provider cannot take the node with it.
   */
  isolate?: boolean;
}

let shared: Liborchard | undefined;

/** The process-wide liborchard, kept open: an abandoned hung verbs thread must not see it unloaded. */
function library(): Liborchard {
  shared ??= Liborchard.open();
  return shared;
}

function parse(text: string): ProbeResult {
  const result = JSON.parse(text) as ProbeResult;
  if (result.schema !== "orchard.probe/1") {
    throw new Error(
      `Cannot read probe: schema is ${
        String(result.schema)
      }, expected orchard.probe/1`,
    );
  }
  return result;
}

/** Probes this machine and returns orchard.probe/1. */
export async function probe(options: ProbeOptions = {}): Promise<ProbeResult> {
  const timeoutMs = options.timeoutMs ?? 5000;
  if (!Number.isInteger(timeoutMs) || timeoutMs <= 0) {
    throw new RangeError(
      `Cannot probe: timeoutMs must be a positive integer, current value is ${timeoutMs}`,
    );
  }
  const flags = (options.skipRdma ? ProbeFlags.SKIP_RDMA : 0) |
    (options.skipGpu ? ProbeFlags.SKIP_GPU : 0);
  if (!options.isolate) {
    return await withInUse(parse(await library().probeJson(flags, timeoutMs)));
  }
  await ensureNativeBuilt();
  const args = ["probe", "--timeout-ms", String(timeoutMs)];
  if (options.skipRdma) args.push("--skip-rdma");
  if (options.skipGpu) args.push("--skip-gpu");
  const { code, stdout } = await new Deno.Command(nativePaths.cli, {
    args,
    stdout: "piped",
    stderr: "null",
    signal: AbortSignal.timeout(timeoutMs + 2000),
  }).output();
  if (code !== 0) {
    throw new Error(`Cannot probe: orchard-linktest exited with ${code}`);
  }
  return await withInUse(parse(new TextDecoder().decode(stdout)));
}

/** Adds each RDMA device's QPs/MRs in use where the OS reports them (the headroom under max_qp/max_mr). */
async function withInUse(r: ProbeResult): Promise<ProbeResult> {
  const devices = r.rdma?.devices ?? [];
  if (devices.length === 0) return r;
  const used = await rdmaInUse();
  for (const d of devices) d.in_use = used?.get(d.name) ?? null;
  return r;
}
