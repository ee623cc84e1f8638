/**
 * `deno task node service install|uninstall|status`: runs the node as an OS
 * service, with the flags and environment it was installed with, and never
 * a join token (the identity in the state directory is all it needs; a node
 * not yet enrolled is refused).
 *
 * - macOS: a launchd LaunchAgent, `~/Library/LaunchAgents/dev.orchard.node.plist`
 *   (RunAtLoad, KeepAlive {SuccessfulExit: false}, logs in
 *   `~/Library/Logs/Orchard/node.log`), loaded with `launchctl bootstrap
 *   gui/UID`. `--system`: a LaunchDaemon in /Library/LaunchDaemons (sudo),
 *   run as the installing user, from boot.
 * - Linux: a systemd user unit, `~/.config/systemd/user/orchard-node.service`
 *   (Restart=always, logs in the journal), enabled with `systemctl --user`.
 *   `--system`: /etc/systemd/system/orchard-node.service (sudo).
 *
 * A node the gateway removed must not restart forever: it exits 3 (2 for
 * bad flags), which the unit's RestartPreventExitStatus leaves stopped.
 * launchd's KeepAlive only tells a zero exit from a non-zero one, so the
 * plist sets ORCHARD_NODE_SERVICE=launchd and the node then exits 0 in
 * those cases (node/main.ts): SuccessfulExit=false restarts it after a
 * crash or an error, never after that.
 *
 * The target OS and home directory are injectable (`--os`, or
 * ORCHARD_SERVICE_OS, and HOME), so both files can be generated and checked
 * anywhere. `launchctl` or `systemctl` runs only when the target OS is this
 * machine's, the tool is on PATH and `--no-start` is absent; otherwise the
 * commands are printed.
 */
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { shellQuote } from "../fleet/join_command.ts";
import {
  type Flag,
  FLAGS,
  loadSavedFlags,
  type NodeFlags,
  nodeOptions,
  persistableFlags,
  readNodeFlags,
} from "./flags.ts";
import { readIdentity } from "./identity.ts";

/** Operating systems with a service manager this supports. */
export type ServiceOS = "darwin" | "linux";

/** The launchd label, and the systemd unit name. */
export const LAUNCHD_LABEL = "dev.orchard.node";
export const SYSTEMD_UNIT = "orchard-node.service";

/** Exit statuses after which a service must not restart the node (node/main.ts). */
export const NO_RESTART_EXIT = [2, 3];

/** Environment variables passed on to the service when set at install. */
const PASS_ENV = [
  "DENO_DIR",
  "DENO_CERT",
  "DENO_TLS_CA_STORE",
  "HTTPS_PROXY",
  "HTTP_PROXY",
  "NO_PROXY",
  "ORCHARD_LOG_LEVEL",
];

/** Everything the commands read from the machine (injectable for tests). */
export interface ServiceContext {
  /** This machine's OS (`Deno.build.os`). */
  hostOs: string;
  env(name: string): string | undefined;
  cwd: string;
  /** The user id (launchctl's gui/UID domain), null when unknown. */
  uid: number | null;
  /** The deno the service runs (default: `deno` on PATH, else this one). */
  denoPath: string;
  /** The checkout the service runs node/main.ts from. */
  root: string;
  out(line: string): void;
  err(line: string): void;
  /** Runs a command, returns its exit code and output (stdout + stderr). */
  exec(argv: string[]): Promise<{ code: number; output: string }>;
  /** Whether `name` is an executable on PATH. */
  which(name: string): string | null;
}

/** Finds an executable on `path` (colon-separated). */
export function which(name: string, path: string | undefined): string | null {
  for (const dir of (path ?? "").split(":").filter(Boolean)) {
    const p = `${dir}/${name}`;
    try {
      const st = Deno.statSync(p);
      if (st.isFile && ((st.mode ?? 0o111) & 0o111)) return p;
    } catch { /* not here */ }
  }
  return null;
}

/** The real machine. */
export function defaultServiceContext(): ServiceContext {
  const env = (n: string) => Deno.env.get(n);
  return {
    hostOs: Deno.build.os,
    env,
    cwd: Deno.cwd(),
    uid: Deno.uid(),
    denoPath: which("deno", env("PATH")) ?? Deno.execPath(),
    root: fileURLToPath(new URL("../", import.meta.url)).replace(/\/+$/, ""),
    // deno-lint-ignore no-console
    out: (l) => console.log(l),
    // deno-lint-ignore no-console
    err: (l) => console.error(l),
    async exec(argv) {
      const out = await new Deno.Command(argv[0]!, {
        args: argv.slice(1),
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
      const dec = new TextDecoder();
      return {
        code: out.code,
        output: (dec.decode(out.stdout) + dec.decode(out.stderr)).trim(),
      };
    },
    which: (name) => which(name, env("PATH")),
  };
}

/** A service manager command; `mayFail`: its failure is expected (nothing to stop). */
export interface ManagerCommand {
  argv: string[];
  mayFail?: boolean;
  /** Retried a few times, a second apart (launchd may still be unloading). */
  retry?: boolean;
}

/** Where a service lives and how its manager handles it. */
export interface ServiceLocation {
  os: ServiceOS;
  system: boolean;
  /** The plist or unit file. */
  path: string;
  /** launchd: the log file; systemd: null (the journal). */
  logFile: string | null;
  /** How to read the logs. */
  logsHint: string;
  /** Load or reload and start it (after the file is written). */
  start: ManagerCommand[];
  /** Stop and unload it (before the file is removed). */
  stop: ManagerCommand[];
  /** After the file is removed. */
  afterRemove: ManagerCommand[];
  /** Report on it. */
  status: ManagerCommand[];
}

/** Where the service of `os` lives for `home` (or the whole machine). */
export function serviceLocation(
  os: ServiceOS,
  home: string,
  opts: { system?: boolean; uid?: number | null } = {},
): ServiceLocation {
  const system = opts.system ?? false;
  if (os === "darwin") {
    const domain = system ? "system" : `gui/${opts.uid ?? "$(id -u)"}`;
    const target = `${domain}/${LAUNCHD_LABEL}`;
    const path = system
      ? `/Library/LaunchDaemons/${LAUNCHD_LABEL}.plist`
      : `${home}/Library/LaunchAgents/${LAUNCHD_LABEL}.plist`;
    const logFile = system
      ? "/Library/Logs/Orchard/node.log"
      : `${home}/Library/Logs/Orchard/node.log`;
    return {
      os,
      system,
      path,
      logFile,
      logsHint: `tail -f ${shellQuote(logFile)}`,
      start: [
        { argv: ["launchctl", "bootout", target], mayFail: true },
        { argv: ["launchctl", "enable", target] },
        { argv: ["launchctl", "bootstrap", domain, path], retry: true },
      ],
      stop: [{ argv: ["launchctl", "bootout", target], mayFail: true }],
      afterRemove: [],
      status: [{ argv: ["launchctl", "print", target], mayFail: true }],
    };
  }
  const ctl = system ? ["systemctl"] : ["systemctl", "--user"];
  return {
    os,
    system,
    path: system
      ? `/etc/systemd/system/${SYSTEMD_UNIT}`
      : `${home}/.config/systemd/user/${SYSTEMD_UNIT}`,
    logFile: null,
    logsHint: `journalctl ${system ? "" : "--user "}-u ${SYSTEMD_UNIT} -f`,
    start: [
      { argv: [...ctl, "daemon-reload"] },
      { argv: [...ctl, "enable", SYSTEMD_UNIT] },
      { argv: [...ctl, "restart", SYSTEMD_UNIT] },
    ],
    stop: [{ argv: [...ctl, "disable", "--now", SYSTEMD_UNIT], mayFail: true }],
    afterRemove: [{ argv: [...ctl, "daemon-reload"], mayFail: true }],
    status: [
      { argv: [...ctl, "is-enabled", SYSTEMD_UNIT], mayFail: true },
      { argv: [...ctl, "is-active", SYSTEMD_UNIT], mayFail: true },
    ],
  };
}

/** What a service runs. */
export interface ServiceSpec {
  os: ServiceOS;
  system: boolean;
  home: string;
  /** The user a system service runs as. */
  user: string;
  /** The gateway, for the description. */
  gatewayUrl: string;
  stateDir: string;
  /** The program and its arguments (an absolute path first). */
  program: string[];
  workingDirectory: string;
  env: Record<string, string>;
}

function checkValue(v: string): string {
  if (/[\n\r\0]/.test(v)) {
    throw new Error(
      `Cannot write the service: a value contains a line break: ${
        JSON.stringify(v)
      }`,
    );
  }
  return v;
}

/** A word of a systemd ExecStart= line: specifiers (%) and variables ($) kept literal. */
function execWord(w: string): string {
  const v = checkValue(w).replaceAll("%", "%%").replaceAll("$", "$$$$");
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(v) && !/^[@\-:+!|]/.test(v)) return v;
  return `"${v.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}"`;
}

/** One `Environment=` assignment, quoted. */
function envWord(name: string, value: string): string {
  const v = `${name}=${checkValue(value)}`.replaceAll("%", "%%");
  return `"${v.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}"`;
}

/** The systemd unit for `spec`. */
export function systemdUnit(spec: ServiceSpec): string {
  const lines = [
    "# Written by `deno task node service install`; remove it with",
    "# `deno task node service uninstall`. No join token here: the node's",
    `# identity is in ${checkValue(spec.stateDir)}.`,
    "[Unit]",
    `Description=Orchard node for ${
      checkValue(spec.gatewayUrl).replaceAll("%", "%%")
    }`,
    // Never give up restarting (a gateway down for long is no reason to stop).
    "StartLimitIntervalSec=0",
    ...(spec.system
      ? ["Wants=network-online.target", "After=network-online.target"]
      : []),
    "",
    "[Service]",
    "Type=simple",
    ...(spec.system ? [`User=${checkValue(spec.user)}`] : []),
    `WorkingDirectory=${execWord(spec.workingDirectory)}`,
    ...Object.entries(spec.env).map(([k, v]) => `Environment=${envWord(k, v)}`),
    `ExecStart=${spec.program.map(execWord).join(" ")}`,
    "Restart=always",
    "RestartSec=5",
    "# 2: bad flags; 3: removed by the gateway, or not enrolled. A restart",
    "# cannot fix either: the node waits stopped for a person.",
    `RestartPreventExitStatus=${NO_RESTART_EXIT.join(" ")}`,
    "StandardOutput=journal",
    "StandardError=journal",
    "SyslogIdentifier=orchard-node",
    "",
    "[Install]",
    `WantedBy=${spec.system ? "multi-user.target" : "default.target"}`,
    "",
  ];
  return lines.join("\n");
}

function xml(s: string): string {
  return checkValue(s).replaceAll("&", "&amp;").replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;").replaceAll('"', "&quot;");
}

type PlistValue =
  | string
  | number
  | boolean
  | PlistValue[]
  | { [key: string]: PlistValue };

function plistValue(v: PlistValue, pad: string): string[] {
  if (typeof v === "string") return [`${pad}<string>${xml(v)}</string>`];
  if (typeof v === "number") return [`${pad}<integer>${v}</integer>`];
  if (typeof v === "boolean") return [`${pad}<${v}/>`];
  if (Array.isArray(v)) {
    return [
      `${pad}<array>`,
      ...v.flatMap((x) => plistValue(x, pad + "\t")),
      `${pad}</array>`,
    ];
  }
  return [
    `${pad}<dict>`,
    ...Object.entries(v).flatMap(([k, x]) => [
      `${pad}\t<key>${xml(k)}</key>`,
      ...plistValue(x, pad + "\t"),
    ]),
    `${pad}</dict>`,
  ];
}

/** The launchd plist for `spec`. */
export function launchdPlist(spec: ServiceSpec, logFile: string): string {
  const dict: Record<string, PlistValue> = {
    Label: LAUNCHD_LABEL,
    ProgramArguments: spec.program,
    WorkingDirectory: spec.workingDirectory,
    EnvironmentVariables: spec.env,
    ...(spec.system ? { UserName: spec.user } : {}),
    RunAtLoad: true,
    // Restarted after a non-zero exit (a crash, the gateway unreachable at
    // boot), not after a zero one: a stop, or removal by the gateway.
    KeepAlive: { SuccessfulExit: false },
    ThrottleInterval: 10,
    // As an app's: launchd's default limits would slow inference.
    ProcessType: "Interactive",
    StandardOutPath: logFile,
    StandardErrorPath: logFile,
  };
  return [
    '<?xml version="1.0" encoding="UTF-8"?>',
    '<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">',
    "<!-- Written by `deno task node service install`; remove it with",
    "     `deno task node service uninstall`. No join token here: the node's",
    `     identity is in ${xml(spec.stateDir).replaceAll("--", "- -")}. -->`,
    '<plist version="1.0">',
    ...plistValue(dict, ""),
    "</plist>",
    "",
  ].join("\n");
}

/** The flags as ExecStart/ProgramArguments words (the key goes in the environment). */
function flagArgs(flags: NodeFlags): string[] {
  const out: string[] = [];
  for (const f of Object.keys(FLAGS) as Flag[]) {
    if (f === "join" || f === "upstream-key" || f === "state-dir") continue;
    const v = flags[f];
    if (v !== undefined && v !== "") out.push(`--${f}`, v);
  }
  return out;
}

const USAGE = [
  "Usage: deno task node service install [--system] [--no-start] [--os darwin|linux] [node options]",
  "       deno task node service uninstall [--system] [--no-start] [--os darwin|linux]",
  "       deno task node service status [--system] [--os darwin|linux]",
  "",
  "install: writes a launchd agent (macOS) or systemd user unit (Linux) that runs",
  "this node with its saved settings and the options given here (never a join",
  "token: run the join command first), then loads and starts it. --system: a",
  "LaunchDaemon or system unit (run with sudo). --no-start: write it, print the",
  "commands. --os: the target OS (ORCHARD_SERVICE_OS; default this machine's).",
].join("\n");

/** Runs a `service` subcommand; returns the exit code. */
export async function runServiceCommand(
  args: string[],
  ctx: ServiceContext = defaultServiceContext(),
): Promise<number> {
  const [action, ...rest] = args;
  if (action !== "install" && action !== "uninstall" && action !== "status") {
    ctx.err(USAGE);
    return 2;
  }
  if (rest.some((a) => a === "--join" || a.startsWith("--join="))) {
    ctx.err(
      "A service never stores a join token. Run the join command first:\n" +
        "  deno task node join --gateway URL --join TOKEN\n" +
        "then install the service without --join:\n" +
        "  deno task node service install",
    );
    return 2;
  }
  let given: NodeFlags;
  let extra: Record<string, string | boolean | undefined>;
  try {
    ({ flags: given, extra } = readNodeFlags(rest, ctx.env, {
      system: { type: "boolean" },
      "no-start": { type: "boolean" },
      os: { type: "string" },
    }));
  } catch (err) {
    ctx.err(`${(err as Error).message}\n\n${USAGE}`);
    return 2;
  }
  delete given.join; // from ORCHARD_JOIN_TOKEN: never stored
  const os = (extra.os as string | undefined) ??
    ctx.env("ORCHARD_SERVICE_OS") ??
    ctx.hostOs;
  if (os !== "darwin" && os !== "linux") {
    ctx.err(
      `Cannot manage a service on ${os}: only macOS (darwin, launchd) and Linux (systemd) are supported; run the node with deno task node instead`,
    );
    return 2;
  }
  const home = ctx.env("HOME");
  if (!home) {
    ctx.err("Cannot manage the service: HOME is not set");
    return 2;
  }
  const system = extra.system === true;
  const loc = serviceLocation(os, home, { system, uid: ctx.uid });
  const manager = os === "darwin" ? "launchctl" : "systemctl";
  const canRun = os === ctx.hostOs && extra["no-start"] !== true &&
    ctx.which(manager) !== null;
  const stateDir = resolve(
    ctx.cwd,
    given["state-dir"] ?? `${home}/.orchard/node`,
  );
  const run = (cmds: ManagerCommand[], what: string) =>
    runCommands(ctx, cmds, canRun, what, manager);

  if (action === "status") {
    return await status(ctx, loc, stateDir, canRun);
  }
  if (action === "uninstall") {
    if (!(await exists(loc.path))) {
      ctx.out(`No Orchard node service is installed (no ${loc.path}).`);
      return 0;
    }
    const stopped = await run(loc.stop, "stop and unload it");
    try {
      await Deno.remove(loc.path);
    } catch (err) {
      ctx.err(
        `Cannot remove ${loc.path}: ${(err as Error).message}${
          system ? " (run with sudo)" : ""
        }`,
      );
      return 1;
    }
    await run(loc.afterRemove, "forget it");
    ctx.out(
      `Removed ${loc.path}. The node's identity stays in ${stateDir}: ` +
        "`deno task node` runs it by hand, `deno task node service install` installs the service again.",
    );
    return stopped === "failed" ? 1 : 0;
  }

  // install
  const identity = await readIdentity(stateDir).catch(() => null);
  const enrollment = identity?.enrollment;
  if (!enrollment) {
    ctx.err(
      `This node is not enrolled yet (no enrolled identity in ${stateDir}), so a service could not start it.\n` +
        "Run the join command from the portal (Nodes → Add a node) first:\n" +
        "  deno task node join --gateway URL --join TOKEN\n" +
        "then: deno task node service install",
    );
    return 1;
  }
  let saved: NodeFlags;
  try {
    saved = await loadSavedFlags(stateDir);
  } catch (err) {
    ctx.err((err as Error).message);
    return 1;
  }
  const merged: NodeFlags = { ...saved, ...given };
  merged.gateway ??= enrollment.gatewayUrl;
  const gatewayUrl = merged.gateway.replace(/\/+$/, "");
  if (gatewayUrl !== enrollment.gatewayUrl) {
    ctx.err(
      `This node is enrolled with ${enrollment.gatewayUrl}, not ${gatewayUrl}. ` +
        `Join ${gatewayUrl} first (deno task node join --gateway ${gatewayUrl} --join TOKEN), or leave --gateway out.`,
    );
    return 1;
  }
  try {
    const opts = nodeOptions(merged);
    if (opts.engine === "openai" && !opts.upstreamUrl) {
      throw new Error(
        "Cannot install the service: --engine openai needs --upstream URL (ORCHARD_UPSTREAM_URL)",
      );
    }
  } catch (err) {
    ctx.err((err as Error).message);
    return 2;
  }
  const flags = persistableFlags(merged, ctx.cwd);
  const env: Record<string, string> = {
    ORCHARD_NODE_SERVICE: os === "darwin" ? "launchd" : "systemd",
    PATH: ctx.env("PATH") || "/usr/local/bin:/usr/bin:/bin",
  };
  if (system) env.HOME = home;
  for (const name of PASS_ENV) {
    const v = ctx.env(name);
    if (v) env[name] = v;
  }
  if (flags["upstream-key"]) {
    env.ORCHARD_UPSTREAM_API_KEY = flags["upstream-key"];
  }
  const spec: ServiceSpec = {
    os,
    system,
    home,
    user: ctx.env("SUDO_USER") || ctx.env("USER") || ctx.env("LOGNAME") ||
      "root",
    gatewayUrl,
    stateDir,
    program: [
      ctx.denoPath,
      "run",
      "-A",
      `${ctx.root}/node/main.ts`,
      ...flagArgs(flags),
      "--state-dir",
      stateDir,
    ],
    workingDirectory: ctx.root,
    env,
  };
  let content: string;
  try {
    content = os === "darwin"
      ? launchdPlist(spec, loc.logFile!)
      : systemdUnit(spec);
  } catch (err) {
    ctx.err((err as Error).message);
    return 2;
  }
  try {
    await Deno.mkdir(loc.path.slice(0, loc.path.lastIndexOf("/")), {
      recursive: true,
    });
    if (loc.logFile) {
      await Deno.mkdir(loc.logFile.slice(0, loc.logFile.lastIndexOf("/")), {
        recursive: true,
      });
    }
    // Readable by its owner only when it holds the upstream key.
    const mode = env.ORCHARD_UPSTREAM_API_KEY ? 0o600 : 0o644;
    await Deno.writeTextFile(loc.path, content, { mode });
    await Deno.chmod(loc.path, mode);
  } catch (err) {
    ctx.err(
      `Cannot write ${loc.path}: ${(err as Error).message}${
        system ? " (a system service needs sudo)" : ""
      }`,
    );
    return 1;
  }
  ctx.out(
    `Wrote ${loc.path}: node ${enrollment.nodeId} for ${gatewayUrl}, as ${
      spec.program.map(shellQuote).join(" ")
    }`,
  );
  const started = await run(loc.start, "load and start it");
  if (started !== "failed") {
    ctx.out(
      `${started === "ran" ? "The node now runs" : "Then the node runs"} as a ${
        os === "darwin" ? "launchd" : "systemd"
      } service: it starts at every ${
        system ? "boot" : "login"
      }, restarts if it stops, and stays stopped if the gateway removes it.`,
    );
  }
  if (os === "linux" && !system) {
    ctx.out(
      `A user service runs while you are logged in; to run it from boot without a login: loginctl enable-linger ${spec.user}`,
    );
  }
  ctx.out(`Logs: ${loc.logsHint}`);
  ctx.out(
    "Status: deno task node service status; remove: deno task node service uninstall",
  );
  return started === "failed" ? 1 : 0;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Runs `cmds` when it can, else prints them ("printed"); "failed" when one
 * that must succeed failed (the rest are then printed to run by hand).
 */
async function runCommands(
  ctx: ServiceContext,
  cmds: ManagerCommand[],
  canRun: boolean,
  what: string,
  manager: string,
): Promise<"ran" | "printed" | "failed"> {
  if (cmds.length === 0) return "ran";
  const show = (list: ManagerCommand[]) =>
    list.map((c) => `  ${c.argv.map(shellQuote).join(" ")}`).join("\n");
  if (!canRun) {
    ctx.out(
      `${manager} is not run here (another OS, not on PATH, or --no-start); to ${what}, run:\n${
        show(cmds)
      }`,
    );
    return "printed";
  }
  for (let i = 0; i < cmds.length; i++) {
    const c = cmds[i]!;
    let r = await ctx.exec(c.argv);
    for (let n = 0; c.retry && r.code !== 0 && n < 3; n++) {
      await new Promise((ok) => setTimeout(ok, 1000));
      r = await ctx.exec(c.argv);
    }
    if (r.code !== 0 && !c.mayFail) {
      ctx.err(
        `${c.argv.join(" ")} failed (exit ${r.code})${
          r.output ? `: ${r.output}` : ""
        }\nTo ${what}, run by hand:\n${show(cmds.slice(i))}`,
      );
      return "failed";
    }
  }
  return "ran";
}

async function status(
  ctx: ServiceContext,
  loc: ServiceLocation,
  stateDir: string,
  canRun: boolean,
): Promise<number> {
  const installed = await exists(loc.path);
  ctx.out(
    installed
      ? `Installed: ${loc.path}`
      : `Not installed (no ${loc.path}); install with: deno task node service install`,
  );
  const identity = await readIdentity(stateDir).catch(() => null);
  const e = identity?.enrollment;
  ctx.out(
    e
      ? `Node: ${e.nodeId}, enrolled with ${e.gatewayUrl} on ${e.enrolledAt} (identity in ${stateDir})`
      : `Node: not enrolled (no enrolled identity in ${stateDir}); run the join command from the portal first`,
  );
  if (installed && canRun) {
    for (const c of loc.status) {
      const r = await ctx.exec(c.argv);
      const lines = loc.os === "darwin"
        ? r.output.split("\n").filter((l) =>
          /^\s*(state|pid|last exit code|runs) =/.test(l)
        ).map((l) => l.trim())
        : [r.output];
      ctx.out(
        `${c.argv.join(" ")}: ${
          r.code === 0 || lines.join("") ? lines.join("; ") : `exit ${r.code}`
        }`,
      );
    }
  }
  if (installed) ctx.out(`Logs: ${loc.logsHint}`);
  return installed ? 0 : 1;
}
