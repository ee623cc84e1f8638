// deno-lint-ignore-file no-console -- entry point: prints usage, the node's address and what to do next.
/**
 * `deno task node`: a node worker on a Mac (or Linux box).
 *
 *   deno task node --gateway URL --join TOKEN [--engine llama|openai] …   run here
 *   deno task node join --gateway URL --join TOKEN …   enroll, check, save settings, exit
 *   deno task node service install|uninstall|status    (node/service.ts)
 *   deno task node probe | linktest …   (liborchard tools, node/native/cli.ts)
 *
 * Every flag also reads an environment variable, and a start saves them
 * (never the join token) in the state directory for later starts and the
 * service (node/flags.ts).
 *
 * Exit codes: 0 stopped by a signal, or joined; 1 an error a restart may
 * fix (the gateway unreachable, a port taken); 2 bad flags; 3 not enrolled
 * or removed by the gateway. 2 and 3 need a person, so a service must not
 * restart the node: systemd units say RestartPreventExitStatus=2 3, and
 * under launchd (ORCHARD_NODE_SERVICE=launchd), whose KeepAlive only tells
 * zero from non-zero, the node exits 0 instead.
 */
import { resolve } from "node:path";
import type { Reachability } from "../protocol/node_messages.ts";
import {
  loadSavedFlags,
  type NodeFlags,
  nodeOptions,
  readNodeFlags,
  saveFlags,
  usage,
} from "./flags.ts";
import { defaultStateDir } from "./identity.ts";
import {
  type NodeWorker,
  type NodeWorkerOptions,
  NotEnrolledError,
  startNodeWorker,
} from "./worker.ts";

export { parseNodeArgs } from "./flags.ts";

/** How long `join` waits for the gateway to say whether it reaches the node. */
const JOIN_WAIT_MS = 20_000;

/** The exit code of a stop a restart cannot fix, as this node's service manager needs it. */
function permanent(code: 2 | 3): number {
  return Deno.env.get("ORCHARD_NODE_SERVICE") === "launchd" ? 0 : code;
}

function joinHint(gatewayUrl: string, again: boolean): string {
  const service = Deno.env.get("ORCHARD_NODE_SERVICE");
  return [
    `${
      again ? "To join again, create" : "Create"
    } a join token in the portal (Nodes → Add a node) and run the command it shows:`,
    `  deno task node join --gateway ${gatewayUrl} --join TOKEN${
      service ? " && deno task node service install" : ""
    }`,
    ...(service
      ? [`Its ${service} service does not restart this node until then.`]
      : []),
  ].join("\n");
}

/** What to tell a person when the gateway cannot reach this node. */
export function unreachableMessage(
  r: Reachability,
  host: string,
  port: number,
): string {
  return [
    `WARNING: the gateway cannot reach this node at ${r.url}: ${
      r.error ?? "no answer"
    }.`,
    `This node listens on ${host}:${port}, and the gateway calls the URL the node advertises.`,
    `If the gateway reaches this machine at another address (NAT, Docker, a VPN, a Thunderbolt bridge rather than Wi-Fi),`,
    `start the node with --advertise http://ADDRESS:${port} (ORCHARD_NODE_ADVERTISE_URL) naming that address;`,
    `and check that no firewall blocks port ${port} (macOS: System Settings → Network → Firewall).`,
    `Until then this node cannot serve the gateway's requests.`,
  ].join("\n");
}

/** Flags given, over those saved in the state directory. */
async function settings(
  args: string[],
): Promise<{ flags: NodeFlags; opts: NodeWorkerOptions }> {
  const { flags: given } = readNodeFlags(args);
  const stateDir = resolve(given["state-dir"] ?? defaultStateDir());
  const saved = await loadSavedFlags(stateDir).catch((err) => {
    console.error(`${(err as Error).message}; starting without it`);
    return {};
  });
  const flags: NodeFlags = { ...saved, ...given, "state-dir": stateDir };
  return { flags, opts: nodeOptions(flags) };
}

/**
 * Starts the worker; a node that is not enrolled (and has no token) gets
 * the join hint and the exit code to return instead.
 */
async function start(
  opts: NodeWorkerOptions,
  more: Partial<NodeWorkerOptions>,
): Promise<NodeWorker | number> {
  try {
    return await startNodeWorker({
      ...opts,
      onRemoved: (msg) => {
        console.error(
          `This node was removed from the gateway or is unknown to it (${msg}); it has stopped.\n` +
            joinHint(opts.gatewayUrl, true),
        );
        Deno.exit(permanent(3));
      },
      ...more,
    });
  } catch (err) {
    if (!(err instanceof NotEnrolledError)) throw err;
    console.error(`${err.message}\n${joinHint(opts.gatewayUrl, err.removed)}`);
    return permanent(3);
  }
}

function portNote(w: NodeWorker): string | null {
  if (w.skippedPorts.length === 0) return null;
  const list = w.skippedPorts.join(", ");
  return `Port${w.skippedPorts.length > 1 ? "s" : ""} ${list} ${
    w.skippedPorts.length > 1 ? "are" : "is"
  } in use by another program; this node listens on port ${w.port} (choose one with --port).`;
}

async function save(flags: NodeFlags, stateDir: string): Promise<void> {
  await saveFlags(stateDir, flags).catch((err) =>
    console.error(
      `Cannot save the node's settings in ${stateDir}: ${
        (err as Error).message
      }`,
    )
  );
}

/** `deno task node …`: runs the node until a signal. */
async function run(args: string[]): Promise<number> {
  let s: Awaited<ReturnType<typeof settings>>;
  try {
    s = await settings(args);
  } catch (err) {
    console.error(`${(err as Error).message}\n\n${usage()}`);
    return permanent(2);
  }
  const { flags, opts } = s;
  let last = "";
  const worker = await start(opts, {
    onReachability: (r, port) => {
      const key = r.ok ? "ok" : `${r.url} ${r.error}`;
      if (key === last) return;
      if (!r.ok) console.error(unreachableMessage(r, opts.host!, port));
      else if (last) {
        console.error(`The gateway reaches this node at ${r.url} again.`);
      }
      last = key;
    },
  });
  if (typeof worker === "number") return worker;
  await save(flags, opts.stateDir!);
  console.log(`Orchard node ${worker.nodeId} serving at ${worker.url}`);
  const note = portNote(worker);
  if (note) console.log(note);
  const stop = async () => {
    await worker.close();
    Deno.exit(0);
  };
  Deno.addSignalListener("SIGINT", stop);
  Deno.addSignalListener("SIGTERM", stop);
  return -1; // keep running
}

/**
 * `deno task node join …`: enrolls (or checks an enrollment), waits for the
 * gateway to say whether it reaches the node, saves the settings, stops.
 */
async function join(args: string[]): Promise<number> {
  let s: Awaited<ReturnType<typeof settings>>;
  try {
    s = await settings(args);
  } catch (err) {
    console.error(`${(err as Error).message}\n\n${usage()}`);
    return 2;
  }
  const { flags, opts } = s;
  let latest: Reachability | null = null;
  const worker = await start(opts, {
    // Fast beats for a quick answer; the saved settings keep the interval.
    heartbeatMs: Math.min(opts.heartbeatMs ?? 2000, 250),
    onReachability: (r) => latest = r,
  });
  if (typeof worker === "number") return worker;
  const note = portNote(worker);
  if (note) console.log(note);
  const deadline = Date.now() + JOIN_WAIT_MS;
  let verdict: Reachability | null = null;
  while (Date.now() < deadline) {
    const r = latest as Reachability | null;
    if (r?.url === worker.url) {
      verdict = r;
      break;
    }
    await new Promise((ok) => setTimeout(ok, 100));
  }
  await worker.close();
  await save(flags, opts.stateDir!);
  if (verdict && !verdict.ok) {
    console.error(
      `${unreachableMessage(verdict, opts.host!, worker.port)}\n` +
        `This node is enrolled (${worker.nodeId}) and its settings are saved. Fix the address (--advertise URL, or --advertise "" to drop a saved one), then run this command again: its join token is no longer needed.`,
    );
    return 1;
  }
  console.log(
    `Orchard node ${worker.nodeId} joined ${opts.gatewayUrl}${
      verdict
        ? `; the gateway reaches it at ${verdict.url}.`
        : ` (the gateway did not say whether it reaches ${worker.url}).`
    }`,
  );
  console.log(
    [
      `Its settings are saved in ${opts.stateDir}/options.json. Run it as a service (it starts now and at every login, restarts if it stops):`,
      "  deno task node service install",
      "or in this terminal:",
      "  deno task node",
    ].join("\n"),
  );
  return 0;
}

async function main(args: string[]): Promise<number> {
  if (args[0] === "probe" || args[0] === "linktest") {
    const spec = new URL("./native/cli.ts", import.meta.url).href;
    const mod = await import(spec) as {
      runNativeCommand(args: string[]): Promise<number>;
    };
    return await mod.runNativeCommand(args);
  }
  if (args.includes("--help") || args.includes("-h")) {
    console.log(usage());
    return 0;
  }
  if (args[0] === "service") {
    const { runServiceCommand } = await import("./service.ts");
    return await runServiceCommand(args.slice(1));
  }
  if (args[0] === "join") return await join(args.slice(1));
  return await run(args);
}

if (import.meta.main) {
  try {
    const code = await main(Deno.args);
    if (code >= 0) Deno.exit(code);
  } catch (err) {
    console.error((err as Error).message);
    const cause = (err as Error).cause;
    if (cause) console.error(`  cause: ${String(cause)}`);
    Deno.exit(1);
  }
}
