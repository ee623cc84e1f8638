/** Process configuration from the environment, validated once at start. */

/** Everything `main.ts` needs to know. */
export interface Config {
  port: number;
  hostname: string;
  dataDir: string;
  kvUrl: string | null;
  /** Public base URL of this gateway/portal (for links printed and sent to nodes). */
  publicUrl: string;
  adminEmail: string | null;
  adminPassword: string | null;
  adminToken: string | null;
  /** Start a local node worker in-process (`deno task start`). */
  localNode: boolean;
  modelsDir: string;
  /** Max request body on /v1/* in bytes. */
  maxBodyBytes: number;
  /** CIDRs/IPs allowed to read /metrics without a token. */
  metricsAllow: string[];
  /** Allow node URLs on link-local / private addresses that are normally refused. */
  allowPrivateNodeUrls: boolean;
  /** Allow webhook URLs on loopback / private addresses (refused by default: SSRF). */
  allowPrivateWebhookUrls: boolean;
  /** On SIGTERM, how long requests in flight may take before they are ended (their node work cancelled). */
  drainTimeoutMs: number;
  /** How long a stored response (`/v1/responses` with `store`) is kept, in days. */
  /** How long a request may wait for a node slot before 503, ms (default 120 s). */
  queueTimeoutMs: number;
  /** The same per model id (`ORCHARD_QUEUE_TIMEOUT_MODELS=big=300000,small=30000`). */
  queueTimeoutByModel: Record<string, number>;
}

function int(env: string, fallback: number, min: number, max: number): number {
  const raw = Deno.env.get(env);
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new Error(
      `Cannot start: ${env} must be an integer in ${min}..${max}: current value is ${raw}`,
    );
  }
  return n;
}

function bool(env: string, fallback: boolean): boolean {
  const raw = Deno.env.get(env)?.toLowerCase();
  if (raw === undefined || raw === "") return fallback;
  if (["1", "true", "yes", "on"].includes(raw)) return true;
  if (["0", "false", "no", "off"].includes(raw)) return false;
  throw new Error(
    `Cannot start: ${env} must be true or false: current value is ${raw}`,
  );
}

/** Parses `model=ms,model2=ms` (model ids hold neither `=` nor `,`). */
export function parseModelTimeouts(
  env: string,
  raw: string | undefined,
): Record<string, number> {
  const out: Record<string, number> = {};
  for (const part of (raw ?? "").split(",").map((s) => s.trim())) {
    if (!part) continue;
    const at = part.lastIndexOf("=");
    const model = part.slice(0, at).trim();
    const ms = Number(part.slice(at + 1));
    if (at <= 0 || !Number.isInteger(ms) || ms < 0 || ms > 3_600_000) {
      throw new Error(
        `Cannot start: ${env} must be model=ms pairs (ms 0..3600000) separated by commas: current value is ${raw}`,
      );
    }
    out[model] = ms;
  }
  return out;
}

/** Reads the configuration from environment variables. */
export function loadConfig(): Config {
  const port = int("PORT", 8000, 0, 65535);
  const hostname = Deno.env.get("HOST") || "0.0.0.0";
  return {
    port,
    hostname,
    dataDir: Deno.env.get("ORCHARD_DATA_DIR") || "./data",
    kvUrl: Deno.env.get("ORCHARD_KV_URL") || null,
    publicUrl:
      (Deno.env.get("ORCHARD_PUBLIC_URL") || `http://localhost:${port}`)
        .replace(/\/+$/, ""),
    adminEmail: Deno.env.get("ORCHARD_ADMIN_EMAIL") || null,
    adminPassword: Deno.env.get("ORCHARD_ADMIN_PASSWORD") || null,
    adminToken: Deno.env.get("ORCHARD_ADMIN_TOKEN") || null,
    localNode: bool("ORCHARD_LOCAL_NODE", true),
    modelsDir: Deno.env.get("ORCHARD_MODELS_DIR") || "./models",
    maxBodyBytes: int("ORCHARD_MAX_BODY_BYTES", 4 * 1024 * 1024, 1024, 1 << 30),
    metricsAllow: (Deno.env.get("ORCHARD_METRICS_ALLOW") || "127.0.0.1,::1")
      .split(",").map((s) => s.trim()).filter(Boolean),
    allowPrivateNodeUrls: bool("ORCHARD_ALLOW_PRIVATE_NODE_URLS", false),
    allowPrivateWebhookUrls: bool("ORCHARD_ALLOW_PRIVATE_WEBHOOK_URLS", false),
    drainTimeoutMs: int("ORCHARD_DRAIN_TIMEOUT_MS", 20_000, 0, 600_000),
    queueTimeoutMs: int("ORCHARD_QUEUE_TIMEOUT_MS", 120_000, 0, 3_600_000),
    queueTimeoutByModel: parseModelTimeouts(
      "ORCHARD_QUEUE_TIMEOUT_MODELS",
      Deno.env.get("ORCHARD_QUEUE_TIMEOUT_MODELS"),
    ),
  };
}

/** A configuration for tests: defaults, overridden by `over`. */
export function testConfig(over: Partial<Config> = {}): Config {
  return {
    port: 0,
    hostname: "127.0.0.1",
    dataDir: ":memory:",
    kvUrl: null,
    publicUrl: "http://localhost:8000",
    adminEmail: null,
    adminPassword: null,
    adminToken: null,
    localNode: false,
    modelsDir: "./models",
    maxBodyBytes: 4 * 1024 * 1024,
    metricsAllow: ["127.0.0.1", "::1"],
    allowPrivateNodeUrls: true,
    allowPrivateWebhookUrls: true,
    drainTimeoutMs: 20_000,
    queueTimeoutMs: 120_000,
    queueTimeoutByModel: {},
    ...over,
  };
}
