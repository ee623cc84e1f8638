/**
 * How many queue pairs and memory regions each RDMA device has in use, where
 * the OS says: on Linux, iproute2's `rdma resource show` (rdma-core's netlink
 * resource tracking, every process's QPs and MRs); verbs itself has no call
 * for it, and macOS offers no such tool, so there it stays unknown (null).
 * The device ceilings (`max_qp`, `max_mr`) come from `ibv_query_device` in
 * liborchard's probe; this adds what is taken of them.
 *
 * @module
 */

/** QPs and MRs in use on one device. */
export interface RdmaInUse {
  qp: number;
  mr: number;
  source: "rdma resource show";
}

/** Reads `rdma -j resource show` output: device name → counts. Ignores anything malformed. */
export function parseRdmaResource(json: unknown): Map<string, RdmaInUse> {
  const out = new Map<string, RdmaInUse>();
  if (!Array.isArray(json)) return out;
  for (const row of json) {
    if (!row || typeof row !== "object") continue;
    const r = row as Record<string, unknown>;
    const name = r.ifname;
    if (
      typeof name !== "string" || !name ||
      !Number.isInteger(r.qp) || !Number.isInteger(r.mr)
    ) continue;
    out.set(name, {
      qp: r.qp as number,
      mr: r.mr as number,
      source: "rdma resource show",
    });
  }
  return out;
}

/** Runs `rdma -j resource show` (Linux only, 2 s bound); null when unknown. */
export async function rdmaInUse(
  command = "rdma",
): Promise<Map<string, RdmaInUse> | null> {
  if (Deno.build.os !== "linux") return null;
  try {
    const { success, stdout } = await new Deno.Command(command, {
      args: ["-j", "resource", "show"],
      stdout: "piped",
      stderr: "null",
      signal: AbortSignal.timeout(2000),
    }).output();
    if (!success) return null;
    return parseRdmaResource(JSON.parse(new TextDecoder().decode(stdout)));
  } catch {
    return null; // not installed, no netlink RDMA socket, or not JSON
  }
}
