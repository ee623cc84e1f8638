/**
 * The node's flags, each with an environment variable, and the settings it
 * remembers: after a start the node saves the flags it ran with (never the
 * join token) in its state directory, `options.json`, so later starts and
 * `deno task node service install` need none of them again. Flags and
 * environment variables given later override what was saved.
 */
import { parseArgs } from "node:util";
import { resolve } from "node:path";
import { ENGINE_KINDS, isEngineKind } from "../protocol/engine.ts";
import { defaultStateDir } from "./identity.ts";
import { type MemorySpec, parseMemorySpec } from "./memory_spec.ts";
import type { NodeWorkerOptions } from "./worker.ts";

/** Flags, their environment variables and help text. */
export const FLAGS = {
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
  port: [
    "ORCHARD_NODE_PORT",
    "port to listen on (default: 8100, else the next free one)",
  ],
  host: ["ORCHARD_NODE_HOST", "address to listen on (0.0.0.0)"],
  advertise: [
    "ORCHARD_NODE_ADVERTISE_URL",
    "URL the gateway calls (when it reaches this machine at another address)",
  ],
  name: ["ORCHARD_NODE_NAME", "display name (the advertised URL)"],
  slots: [
    "ORCHARD_NODE_SLOTS",
    "parallel sequences (llama: 4; openai: what the engine reports, else 16)",
  ],
  threads: ["ORCHARD_NODE_THREADS", "CPU threads for llama"],
  context: [
    "ORCHARD_CONTEXT_SIZE",
    "llama context tokens per slot (default: the model's, as --kv-memory allows)",
  ],
  "max-output": [
    "ORCHARD_MAX_OUTPUT_TOKENS",
    "llama: most tokens a request generates, and its default when it names none (default: up to the context)",
  ],
  "kv-memory": [
    "ORCHARD_KV_MEMORY",
    "llama: memory for a model's KV caches, e.g. 50% (of what is free after its weights; default) or 8GiB",
  ],
  "prefix-cache": [
    "ORCHARD_PREFIX_CACHE_MEMORY",
    "llama: host memory keeping KV prefixes evicted from slots, per model, e.g. 4GiB or 10% (default 2GiB or 25% of available, the smaller; 0: none)",
  ],
  preload: ["ORCHARD_MODELS_PRELOAD", "llama: load every model at start"],
  "state-dir": [
    "ORCHARD_NODE_STATE_DIR",
    "identity directory (~/.orchard/node)",
  ],
  "heartbeat-ms": ["ORCHARD_NODE_HEARTBEAT_MS", "heartbeat interval (2000)"],
} as const;

/** A flag's name. */
export type Flag = keyof typeof FLAGS;
/** Flag values as given (flag, else environment variable). */
export type NodeFlags = Partial<Record<Flag, string>>;

/** The default node port; when it is taken, the next free one up to +9. */
export const DEFAULT_PORT = 8100;

/** The help text. */
export function usage(): string {
  const lines = Object.entries(FLAGS).map(([f, [env, help]]) =>
    `  --${f.padEnd(14)} ${env.padEnd(28)} ${help}`
  );
  return [
    "Usage: deno task node --gateway URL --join TOKEN [options]   run the node here",
    "       deno task node join --gateway URL --join TOKEN [options]",
    "                      enroll, check the gateway reaches this node, save the settings, exit",
    "       deno task node service install|uninstall|status [options]",
    "                      run the node as a launchd (macOS) or systemd (Linux) service",
    "       deno task node probe | linktest …",
    "",
    "Options (flag, environment variable, meaning); a start saves them (not the",
    "join token) in the state directory, and later starts reuse them:",
    ...lines,
  ].join("\n");
}

/**
 * Reads node flags, each falling back to its environment variable; `extra`
 * declares more flags the caller reads itself. Unknown flags throw.
 */
export function readNodeFlags(
  args: string[],
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
  extra: Record<string, { type: "string" | "boolean" }> = {},
): { flags: NodeFlags; extra: Record<string, string | boolean | undefined> } {
  const options = {
    ...Object.fromEntries(
      Object.keys(FLAGS).map((f) => [f, { type: "string" as const }]),
    ),
    ...extra,
  };
  const { values } = parseArgs({ args, options, strict: true });
  const flags: NodeFlags = {};
  for (const f of Object.keys(FLAGS) as Flag[]) {
    const v = (values[f] as string | undefined) ??
      (env(FLAGS[f][0]) || undefined);
    if (v !== undefined) flags[f] = v;
  }
  const more: Record<string, string | boolean | undefined> = {};
  for (const name of Object.keys(extra)) {
    more[name] = values[name] as string | boolean | undefined;
  }
  return { flags, extra: more };
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

function bool(name: Flag, raw: string | undefined): boolean {
  if (raw === undefined || raw === "" || raw === "false" || raw === "0") {
    return false;
  }
  if (raw === "true" || raw === "1") return true;
  throw new Error(
    `Cannot start the node: --${name} must be true or false: current value is ${raw}`,
  );
}

function memory(name: Flag, raw: string | undefined): MemorySpec | undefined {
  if (raw === undefined || raw === "") return undefined;
  const spec = parseMemorySpec(raw);
  if (!spec) {
    throw new Error(
      `Cannot start the node: --${name} must be a share such as 50% or a size such as 8GiB: current value is ${raw}`,
    );
  }
  return spec;
}

/** The path separator of --tokenizers on this OS. */
const LIST_SEP = Deno.build.os === "windows" ? ";" : ":";

/** Turns flag values into worker options; throws on a bad value. */
export function nodeOptions(flags: NodeFlags): NodeWorkerOptions {
  const get = (f: Flag) => flags[f] || undefined;
  const gateway = get("gateway");
  if (!gateway) {
    throw new Error("Cannot start the node: --gateway URL is required");
  }
  const engine = get("engine") ?? "llama";
  if (!isEngineKind(engine)) {
    const kinds = ENGINE_KINDS.join(" or ");
    throw new Error(
      `Cannot start the node: --engine must be ${kinds}: current value is ${engine}`,
    );
  }
  return {
    gatewayUrl: gateway,
    joinToken: get("join") ?? null,
    engine,
    modelsDir: get("models") ?? "./models",
    upstreamUrl: get("upstream") ?? null,
    upstreamApiKey: get("upstream-key") ?? null,
    tokenizerDirs: (get("tokenizers") ?? "").split(LIST_SEP).filter(Boolean),
    port: int("port", get("port"), 0, 65535),
    host: get("host") ?? "0.0.0.0",
    advertiseUrl: get("advertise") ?? null,
    name: get("name") ?? null,
    slots: int("slots", get("slots"), 1, 256) ?? undefined,
    threads: int("threads", get("threads"), 1, 1024) ?? null,
    contextSize: int("context", get("context"), 64, 1 << 20) ?? null,
    maxOutputTokens: int("max-output", get("max-output"), 1, 1 << 20) ?? null,
    kvMemory: memory("kv-memory", get("kv-memory")),
    prefixCacheMemory: memory("prefix-cache", get("prefix-cache")),
    preload: bool("preload", get("preload")),
    stateDir: get("state-dir") ?? defaultStateDir(),
    heartbeatMs: int("heartbeat-ms", get("heartbeat-ms"), 50, 600_000) ?? 2000,
  };
}

/** Parses flags (falling back to environment variables) into worker options. */
export function parseNodeArgs(
  args: string[],
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): NodeWorkerOptions {
  return nodeOptions(readNodeFlags(args, env).flags);
}

/**
 * The options of `deno task start`'s in-process node: every node flag's
 * environment variable applies as it does to `deno task node`; the
 * gateway, join token, models folder and state directory come from the
 * gateway process, and it listens on loopback (any free port, name
 * "local") unless told otherwise.
 */
export function localNodeOptions(
  fixed: {
    gatewayUrl: string;
    joinToken: string | null;
    modelsDir: string;
    stateDir: string;
  },
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): NodeWorkerOptions {
  const { flags } = readNodeFlags([], env);
  const opts = nodeOptions({
    ...flags,
    gateway: fixed.gatewayUrl,
    host: flags.host ?? "127.0.0.1",
    port: flags.port ?? "0",
    name: flags.name ?? "local",
  });
  return {
    ...opts,
    joinToken: fixed.joinToken,
    modelsDir: fixed.modelsDir,
    stateDir: fixed.stateDir,
  };
}

/**
 * The flags worth keeping: all but the join token, with relative paths
 * made absolute (a service does not start in the folder you typed in).
 */
export function persistableFlags(
  flags: NodeFlags,
  cwd: string = Deno.cwd(),
): NodeFlags {
  const out: NodeFlags = {};
  for (const [f, v] of Object.entries(flags) as [Flag, string][]) {
    if (f === "join" || v === undefined || v === "") continue;
    if (f === "models" || f === "state-dir") out[f] = resolve(cwd, v);
    else if (f === "tokenizers") {
      out[f] = v.split(LIST_SEP).filter(Boolean).map((d) => resolve(cwd, d))
        .join(LIST_SEP);
    } else out[f] = v;
  }
  return out;
}

function savedFile(stateDir: string): string {
  return `${stateDir.replace(/\/+$/, "")}/options.json`;
}

/** The flags saved in `stateDir` ({} when none). */
export async function loadSavedFlags(stateDir: string): Promise<NodeFlags> {
  let raw: unknown;
  try {
    raw = JSON.parse(await Deno.readTextFile(savedFile(stateDir)));
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return {};
    throw new Error(
      `Cannot read the node's saved settings in ${savedFile(stateDir)}`,
      {
        cause: err,
      },
    );
  }
  const saved = (raw as { flags?: Record<string, unknown> })?.flags ?? {};
  const out: NodeFlags = {};
  for (const f of Object.keys(FLAGS) as Flag[]) {
    if (f !== "join" && typeof saved[f] === "string") out[f] = saved[f];
  }
  return out;
}

/** Saves `flags` (persistable ones) in `stateDir`, readable by the owner only. */
export async function saveFlags(
  stateDir: string,
  flags: NodeFlags,
): Promise<void> {
  await Deno.mkdir(stateDir, { recursive: true, mode: 0o700 });
  const { "state-dir": _dir, ...rest } = persistableFlags(flags);
  const file = savedFile(stateDir);
  const tmp = `${file}.${crypto.randomUUID()}.tmp`;
  const body = {
    note:
      "Settings this node last started with (deno task node reuses them; flags override). No join token.",
    savedAt: new Date().toISOString(),
    flags: rest,
  };
  await Deno.writeTextFile(tmp, JSON.stringify(body, null, 2) + "\n", {
    mode: 0o600,
  });
  await Deno.chmod(tmp, 0o600).catch(() => {});
  await Deno.rename(tmp, file);
}
