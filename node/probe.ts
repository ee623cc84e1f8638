/**
 * The hardware probe sent at enrollment and now and then in heartbeats:
 * liborchard's probe (Metal GPU, RDMA, thermal state) when the native
 * library loads, else what Deno itself can see.
 */
import { log } from "../lib/log.ts";

/** A probe as sent to the gateway (a JSON object). */
export type Probe = Record<string, unknown>;

/** What Deno can see without the native library. */
export function basicProbe(): Probe {
  const mem = Deno.systemMemoryInfo();
  return {
    schema: "orchard.probe.basic/1",
    os: Deno.build.os,
    arch: Deno.build.arch,
    osRelease: Deno.osRelease(),
    hostname: Deno.hostname(),
    addresses: addresses(),
    cpus: navigator.hardwareConcurrency,
    memory: { totalBytes: mem.total, availableBytes: mem.available },
    loadavg: Deno.loadavg(),
  };
}

/**
 * The machine's own non-loopback addresses (at most 16): the gateway maps
 * an Exo instance's members to nodes by them (fleet/instances.ts).
 */
function addresses(): string[] {
  try {
    const out = new Set<string>();
    for (const i of Deno.networkInterfaces()) {
      if (i.address === "127.0.0.1" || i.address === "::1") continue;
      if (i.family === "IPv6" && i.address.startsWith("fe80")) continue;
      out.add(i.address);
      if (out.size >= 16) break;
    }
    return [...out];
  } catch {
    return [];
  }
}

let nativeProbe: (() => Promise<Probe>) | null | undefined;

/** The richest probe available (native when it loads, basic otherwise). */
export async function collectProbe(): Promise<Probe> {
  if (nativeProbe === undefined) {
    nativeProbe = null;
    try {
      const spec = new URL("./native/probe.ts", import.meta.url).href;
      const mod = await import(spec) as {
        probe?: (opts: { isolate: boolean }) => Promise<Probe>;
      };
      const probe = mod.probe;
      // Isolated: the probe runs in the orchard-linktest child, killed if a verbs call hangs.
      if (typeof probe === "function") {
        nativeProbe = () => probe({ isolate: true });
      }
    } catch (err) {
      log.debug("native probe unavailable", { error: String(err) });
    }
  }
  if (nativeProbe) {
    try {
      return { ...basicProbe(), native: await nativeProbe() };
    } catch (err) {
      log.warn("native probe failed", { error: String(err) });
    }
  }
  return basicProbe();
}

/** Memory for the heartbeat: total and available bytes. */
export function memoryNow(): { totalBytes: number; freeBytes: number } {
  const m = Deno.systemMemoryInfo();
  return { totalBytes: m.total, freeBytes: m.available };
}
