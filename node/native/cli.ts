/**
 * `probe` and `linktest` subcommands for `deno task node …`.
 *
 * @module
 */
import { probe } from "./probe.ts";
import { runLinktestConnect, startLinktestListener } from "./linktest.ts";

const USAGE = `usage:
  probe [--timeout-ms N] [--isolate]
  linktest --listen PORT --token T [--host H] [--timeout-ms N] [--transport auto|tcp|rdma] [--device D]
  linktest --connect HOST:PORT --token T [--timeout-ms N] [--transport auto|tcp|rdma] [--device D]
The token may also come from env ORCHARD_LINKTEST_TOKEN.`;

function write(text: string, to: "out" | "err" = "out"): void {
  const bytes = new TextEncoder().encode(text + "\n");
  (to === "out" ? Deno.stdout : Deno.stderr).writeSync(bytes);
}

function flags(args: string[]): Map<string, string | true> {
  const out = new Map<string, string | true>();
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (!a.startsWith("--")) throw new Error(`unexpected argument ${a}`);
    const next = args[i + 1];
    if (next !== undefined && !next.startsWith("--")) {
      out.set(a.slice(2), next);
      i++;
    } else {
      out.set(a.slice(2), true);
    }
  }
  return out;
}

function str(f: Map<string, string | true>, key: string): string | undefined {
  const v = f.get(key);
  if (v === true) throw new Error(`--${key} needs a value`);
  return v;
}

function int(f: Map<string, string | true>, key: string): number | undefined {
  const v = str(f, key);
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n)) {
    throw new Error(`--${key} must be an integer, got ${v}`);
  }
  return n;
}

/** Runs `probe` or `linktest` with CLI arguments; prints JSON and returns the exit code. */
export async function runNativeCommand(args: string[]): Promise<number> {
  const [cmd, ...rest] = args;
  try {
    const f = flags(rest);
    if (cmd === "probe") {
      const result = await probe({
        timeoutMs: int(f, "timeout-ms"),
        isolate: f.has("isolate"),
      });
      write(JSON.stringify(result, null, 2));
      return 0;
    }
    if (cmd === "linktest") {
      const token = str(f, "token") ?? Deno.env.get("ORCHARD_LINKTEST_TOKEN");
      if (!token) {
        throw new Error("--token (or env ORCHARD_LINKTEST_TOKEN) is required");
      }
      const transport = str(f, "transport");
      if (transport && !["auto", "tcp", "rdma"].includes(transport)) {
        throw new Error(
          `--transport must be auto, tcp or rdma, got ${transport}`,
        );
      }
      const common = {
        token,
        timeoutMs: int(f, "timeout-ms"),
        transport: transport as "auto" | "tcp" | "rdma" | undefined,
        device: str(f, "device"),
      };
      const ac = new AbortController();
      const onSignal = () => ac.abort();
      Deno.addSignalListener("SIGINT", onSignal);
      try {
        let result;
        if (f.has("listen")) {
          const listener = await startLinktestListener({
            ...common,
            port: int(f, "listen") ?? 0,
            host: str(f, "host"),
            signal: ac.signal,
          });
          write(`listening on port ${listener.port}`, "err");
          result = await listener.result;
        } else if (f.has("connect")) {
          const target = str(f, "connect")!;
          const colon = target.lastIndexOf(":");
          const port = Number(target.slice(colon + 1));
          if (colon <= 0 || !Number.isInteger(port)) {
            throw new Error(`--connect needs HOST:PORT, got ${target}`);
          }
          result = await runLinktestConnect({
            ...common,
            host: target.slice(0, colon).replace(/^\[|\]$/g, ""),
            port,
            signal: ac.signal,
          });
        } else {
          throw new Error(
            "linktest needs --listen PORT or --connect HOST:PORT",
          );
        }
        write(JSON.stringify(result, null, 2));
        return result.status === "ok" ? 0 : 1;
      } finally {
        Deno.removeSignalListener("SIGINT", onSignal);
      }
    }
    throw new Error(cmd ? `unknown command ${cmd}` : "missing command");
  } catch (err) {
    write(
      `${err instanceof Error ? err.message : String(err)}\n${USAGE}`,
      "err",
    );
    return 2;
  }
}

if (import.meta.main) Deno.exit(await runNativeCommand(Deno.args));
