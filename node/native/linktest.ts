/**
 * Link test between two nodes (orchard.linktest/1), run in the
 * orchard-linktest child process so a hung verbs call can be killed.
 *
 * @module
 */
import { ensureNativeBuilt, nativePaths } from "./build.ts";

/** Latency figures in microseconds. */
export interface LinkLatency {
  samples: number;
  rtt_us: { min: number; p50: number; p99: number; max: number; mean: number };
  one_way_us: { min: number; p50: number; p99: number; max: number };
}

/** orchard.linktest/1, as printed by either side. */
export interface LinkTestResult {
  schema: "orchard.linktest/1";
  role: "listener" | "connector";
  status: "ok" | "failed" | "cancelled" | "timeout" | "auth_failed";
  error: string | null;
  transport: "rdma-uc" | "rdma-rc" | "tcp" | null;
  fallback_reason: string | null;
  rdma: { device: string; gid_index: number } | null;
  local: {
    hostname: string;
    address: string | null;
    port: number | null;
    liborchard: string;
  };
  peer: {
    hostname: string | null;
    address: string | null;
    port: number | null;
    liborchard: string | null;
    rdma_available: boolean | null;
    rdma_reason: string | null;
  } | null;
  params: {
    iterations: number;
    warmup: number;
    msg_bytes: number;
    bw_bytes: number;
    bw_msg_bytes: number;
    timeout_ms: number;
  };
  latency: LinkLatency | null;
  bandwidth: {
    bytes: number;
    seconds: number;
    bytes_per_sec: number;
    gbit_per_sec: number;
    measured_by: "receiver";
  } | null;
  messages: { sent: number; received: number; lost: number; corrupt: number };
  refused_connections: number;
  started_at_ms: number;
  duration_ms: number;
}

/** What both sides accept. */
export interface LinktestCommonOptions {
  /** Shared control token (HMAC challenge; never sent in clear, passed to the child by env). */
  token: string;
  /** Bound for the whole test in ms (default 30000); the child is killed 2 s after. */
  timeoutMs?: number;
  /** Aborting cancels the test (SIGTERM, then SIGKILL after 1 s). */
  signal?: AbortSignal;
  /** auto (default): RDMA when both sides can, else TCP with the reason; tcp; rdma (required). */
  transport?: "auto" | "tcp" | "rdma";
  /** RDMA device (rdma_en2, mlx5_0); default the first usable one. Also the exclusivity key. */
  device?: string;
  iterations?: number;
  warmup?: number;
  msgBytes?: number;
  bwBytes?: number;
  bwMsgBytes?: number;
}

/** Options of startLinktestListener(). */
export interface LinktestListenOptions extends LinktestCommonOptions {
  /** TCP port of the control connection; 0 picks a free one. */
  port: number;
  /** Address to bind (default 0.0.0.0). */
  host?: string;
}

/** Options of runLinktestConnect(). */
export interface LinktestConnectOptions extends LinktestCommonOptions {
  host: string;
  port: number;
}

/** A listening link test. */
export interface LinktestListener {
  /** The bound port (useful with port 0). */
  port: number;
  /** Settles when the test ends, is cancelled or times out. */
  result: Promise<LinkTestResult>;
  /** Cancels the test; `result` then settles with status "cancelled". */
  cancel(): void;
}

const active = new Set<string>();

function validate(o: LinktestCommonOptions, port: number, what: string): void {
  if (
    typeof o.token !== "string" || o.token.length === 0 || o.token.length > 255
  ) {
    throw new TypeError(`Cannot ${what}: token must be 1 to 255 characters`);
  }
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new RangeError(
      `Cannot ${what}: port must be 0..65535, current value is ${port}`,
    );
  }
  const t = o.timeoutMs ?? 30000;
  if (!Number.isInteger(t) || t <= 0) {
    throw new RangeError(
      `Cannot ${what}: timeoutMs must be a positive integer, current value is ${t}`,
    );
  }
}

function cliArgs(o: LinktestCommonOptions): string[] {
  const args = ["--timeout-ms", String(o.timeoutMs ?? 30000)];
  const add = (flag: string, v: string | number | undefined) => {
    if (v !== undefined) args.push(flag, String(v));
  };
  add("--transport", o.transport);
  add("--device", o.device);
  add("--iterations", o.iterations);
  add("--warmup", o.warmup);
  add("--msg-bytes", o.msgBytes);
  add("--bw-bytes", o.bwBytes);
  add("--bw-msg-bytes", o.bwMsgBytes);
  return args;
}

async function* lines(
  stream: ReadableStream<Uint8Array>,
): AsyncGenerator<string> {
  let buf = "";
  const decoder = new TextDecoder();
  for await (const chunk of stream) {
    buf += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      yield buf.slice(0, nl);
      buf = buf.slice(nl + 1);
    }
  }
  if (buf.trim()) yield buf;
}

interface Running {
  /** First line when it is a listening event, else null. */
  listening: Promise<number | null>;
  result: Promise<LinkTestResult>;
  cancel(): void;
}

function spawn(
  cliArgsList: string[],
  o: LinktestCommonOptions,
  role: "listener" | "connector",
): Running {
  const key = `${role}:${o.device ?? "default"}`;
  if (active.has(key)) {
    throw new Error(
      `Cannot start link test: another test is running on ${key}`,
    );
  }
  active.add(key);
  const child = new Deno.Command(nativePaths.cli, {
    args: cliArgsList,
    env: { ORCHARD_LINKTEST_TOKEN: o.token },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let why: "cancelled" | "timeout" | null = null;
  let killTimer: ReturnType<typeof setTimeout> | undefined;
  const stop = (reason: "cancelled" | "timeout") => {
    why ??= reason;
    try {
      child.kill("SIGTERM");
    } catch { /* already exited */ }
    killTimer ??= setTimeout(() => {
      try {
        child.kill("SIGKILL"); // a verbs call that ignores cancellation
      } catch { /* already exited */ }
    }, 1000);
  };
  const timer = setTimeout(
    () => stop("timeout"),
    (o.timeoutMs ?? 30000) + 2000,
  );
  const onAbort = () => stop("cancelled");
  o.signal?.addEventListener("abort", onAbort, { once: true });
  if (o.signal?.aborted) onAbort();

  let resolveListening!: (port: number | null) => void;
  const listening = new Promise<number | null>((r) => (resolveListening = r));
  const stderr = new Response(child.stderr).text();
  const result = (async () => {
    let last: string | undefined;
    try {
      for await (const line of lines(child.stdout)) {
        if (!line.trim()) continue;
        const msg = JSON.parse(line) as { event?: string; port?: number };
        if (msg.event === "listening") resolveListening(msg.port ?? null);
        else last = line;
      }
      const status = await child.status;
      resolveListening(null);
      if (last) return JSON.parse(last) as LinkTestResult;
      const detail = (await stderr).trim();
      return synthetic(
        role,
        why ?? "failed",
        `orchard-linktest exited with ${status.signal ?? status.code}${
          detail ? `: ${detail}` : ""
        }`,
      );
    } finally {
      clearTimeout(timer);
      clearTimeout(killTimer);
      o.signal?.removeEventListener("abort", onAbort);
      active.delete(key);
      resolveListening(null);
    }
  })();
  return { listening, result, cancel: () => stop("cancelled") };
}

function synthetic(
  role: "listener" | "connector",
  status: LinkTestResult["status"],
  error: string,
): LinkTestResult {
  return {
    schema: "orchard.linktest/1",
    role,
    status,
    error,
    transport: null,
    fallback_reason: null,
    rdma: null,
    local: {
      hostname: Deno.hostname(),
      address: null,
      port: null,
      liborchard: "",
    },
    peer: null,
    params: {
      iterations: 0,
      warmup: 0,
      msg_bytes: 0,
      bw_bytes: 0,
      bw_msg_bytes: 0,
      timeout_ms: 0,
    },
    latency: null,
    bandwidth: null,
    messages: { sent: 0, received: 0, lost: 0, corrupt: 0 },
    refused_connections: 0,
    started_at_ms: Date.now(),
    duration_ms: 0,
  };
}

/**
 * Starts the listening side of a link test; resolves once the port is bound.
 * Wrong-token connections are refused and the wait goes on for the real peer.
 */
export async function startLinktestListener(
  options: LinktestListenOptions,
): Promise<LinktestListener> {
  validate(options, options.port, "start link test listener");
  await ensureNativeBuilt();
  const args = ["listen", "--port", String(options.port), ...cliArgs(options)];
  if (options.host) args.push("--host", options.host);
  const run = spawn(args, options, "listener");
  const port = await run.listening;
  if (port === null) {
    const r = await run.result;
    throw new Error(`Cannot start link test listener: ${r.error ?? r.status}`);
  }
  return { port, result: run.result, cancel: run.cancel };
}

/** Connects to a listening peer and runs the link test as the connector. */
export async function runLinktestConnect(
  options: LinktestConnectOptions,
): Promise<LinkTestResult> {
  validate(options, options.port, "run link test");
  if (!options.host) {
    throw new TypeError("Cannot run link test: host is required");
  }
  await ensureNativeBuilt();
  const args = [
    "connect",
    "--host",
    options.host,
    "--port",
    String(options.port),
    ...cliArgs(options),
  ];
  return await spawn(args, options, "connector").result;
}
