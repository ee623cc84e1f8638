// deno-lint-ignore-file no-console -- entry point: prints usage and the node's address.
/**
 * `deno task node`: a node worker on a Mac (or Linux box).
 *
 *   deno task node --gateway URL --join TOKEN [--engine llama|openai] …
 *   deno task node probe | linktest …   (liborchard tools, node/native/cli.ts)
 *
 * Every flag also reads an environment variable (see FLAGS).
 */
import { parseArgs } from "node:util";
import { defaultStateDir } from "./identity.ts";
import { type NodeWorkerOptions, startNodeWorker } from "./worker.ts";

/** Flags, their environment variables and help text. */
const FLAGS = {
  gateway: ["ORCHARD_GATEWAY_URL", "gateway base URL (required)"],
  join: ["ORCHARD_JOIN_TOKEN", "join token (first start only)"],
  engine: ["ORCHARD_NODE_ENGINE", "llama (default) or openai"],
  models: ["ORCHARD_MODELS_DIR", "GGUF directory for llama (./models)"],
  upstream: ["ORCHARD_UPSTREAM_URL", "OpenAI-compatible server for openai"],
  "upstream-key": ["ORCHARD_UPSTREAM_API_KEY", "bearer key for the upstream"],
  tokenizers: [
    "ORCHARD_TOKENIZER_DIRS",
    "openai: more folders of model folders with tokenizer.json (colon-separated)",
  ],
  port: ["ORCHARD_NODE_PORT", "port to listen on (8100)"],
  host: ["ORCHARD_NODE_HOST", "address to listen on (0.0.0.0)"],
  advertise: ["ORCHARD_NODE_ADVERTISE_URL", "URL the gateway calls"],
  name: ["ORCHARD_NODE_NAME", "display name (the advertised URL)"],
  slots: [
    "ORCHARD_NODE_SLOTS",
    "parallel sequences (llama: 4; openai: what the engine reports, else 16)",
  ],
  threads: ["ORCHARD_NODE_THREADS", "CPU threads for llama"],
  context: ["ORCHARD_CONTEXT_SIZE", "llama context tokens per slot"],
  preload: ["ORCHARD_MODELS_PRELOAD", "llama: load every model at start"],
  "state-dir": [
    "ORCHARD_NODE_STATE_DIR",
    "identity directory (~/.orchard/node)",
  ],
  "heartbeat-ms": ["ORCHARD_NODE_HEARTBEAT_MS", "heartbeat interval (2000)"],
} as const;

type Flag = keyof typeof FLAGS;

function usage(): string {
  const lines = Object.entries(FLAGS).map(([f, [env, help]]) =>
    `  --${f.padEnd(14)} ${env.padEnd(28)} ${help}`
  );
  return [
    "Usage: deno task node --gateway URL --join TOKEN [options]",
    "       deno task node probe | linktest …",
    "",
    "Options (flag, environment variable, meaning):",
    ...lines,
  ].join("\n");
}

function int(name: Flag, raw: string | undefined, min: number, max: number) {
  if (raw === undefined || raw === "") return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new Error(
      `Cannot start the node: --${name} must be an integer in ${min}..${max}: current value is ${raw}`,
    );
  }
  return n;
}

function flag(name: Flag, raw: string | undefined): boolean {
  if (raw === undefined || raw === "" || raw === "false" || raw === "0") {
    return false;
  }
  if (raw === "true" || raw === "1") return true;
  throw new Error(
    `Cannot start the node: --${name} must be true or false: current value is ${raw}`,
  );
}

/** Parses flags (falling back to environment variables) into worker options. */
export function parseNodeArgs(
  args: string[],
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): NodeWorkerOptions {
  const options = Object.fromEntries(
    Object.keys(FLAGS).map((f) => [f, { type: "string" as const }]),
  );
  const { values } = parseArgs({ args, options, strict: true });
  const get = (f: Flag): string | undefined =>
    (values[f] as string | undefined) ?? (env(FLAGS[f][0]) || undefined);
  const gateway = get("gateway");
  if (!gateway) {
    throw new Error("Cannot start the node: --gateway URL is required");
  }
  const engine = get("engine") ?? "llama";
  if (engine !== "llama" && engine !== "openai") {
    throw new Error(
      `Cannot start the node: --engine must be llama or openai: current value is ${engine}`,
    );
  }
  return {
    gatewayUrl: gateway,
    joinToken: get("join") ?? null,
    engine,
    modelsDir: get("models") ?? "./models",
    upstreamUrl: get("upstream") ?? null,
    upstreamApiKey: get("upstream-key") ?? null,
    tokenizerDirs: (get("tokenizers") ?? "").split(
      Deno.build.os === "windows" ? ";" : ":",
    ).filter(Boolean),
    port: int("port", get("port"), 0, 65535) ?? 8100,
    host: get("host") ?? "0.0.0.0",
    advertiseUrl: get("advertise") ?? null,
    name: get("name") ?? null,
    slots: int("slots", get("slots"), 1, 256) ?? undefined,
    threads: int("threads", get("threads"), 1, 1024) ?? null,
    contextSize: int("context", get("context"), 64, 1 << 20) ?? null,
    preload: flag("preload", get("preload")),
    stateDir: get("state-dir") ?? defaultStateDir(),
    heartbeatMs: int("heartbeat-ms", get("heartbeat-ms"), 50, 600_000) ?? 2000,
  };
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
  let opts: NodeWorkerOptions;
  try {
    opts = parseNodeArgs(args);
  } catch (err) {
    console.error(`${(err as Error).message}\n\n${usage()}`);
    return 2;
  }
  const worker = await startNodeWorker({
    ...opts,
    onRemoved: (msg) => {
      console.error(
        `This node was removed from the gateway or is unknown to it (${msg}); it has stopped.\n` +
          `To join again, create a join token in the portal (Nodes → Add a node) and run:\n` +
          `  deno task node --gateway ${opts.gatewayUrl} --join TOKEN`,
      );
      Deno.exit(3);
    },
  });
  console.log(`Orchard node ${worker.nodeId} serving at ${worker.url}`);
  const stop = async () => {
    await worker.close();
    Deno.exit(0);
  };
  Deno.addSignalListener("SIGINT", stop);
  Deno.addSignalListener("SIGTERM", stop);
  return -1; // keep running
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
