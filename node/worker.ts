/**
 * A node worker: loads its identity, starts its engine, serves the node
 * API, enrolls with a join token the first time (later restarts reuse the
 * identity, no token needed) and heartbeats until closed. Used by
 * `deno task node` and in-process by `deno task start`.
 */
import { importEd25519 } from "../lib/jwt.ts";
import { log } from "../lib/log.ts";
import {
  type EnrollRequest,
  type EnrollResponse,
  type HeartbeatRequest,
  type HeartbeatResponse,
  NODE_API_PATH,
  type Reachability,
} from "../protocol/node_messages.ts";
import { createGatewayVerifier } from "./auth.ts";
import { type PlacedModel, placementReport } from "../protocol/placement.ts";
import type { Engine } from "./engine.ts";
import type { EngineKind } from "../protocol/engine.ts";
import { createOpenAIEngine } from "./engines/openai.ts";
import { defaultTokenizerSearch } from "./engines/tokens.ts";
import { DEFAULT_PORT } from "./flags.ts";
import { sendHeartbeat, startHeartbeat } from "./heartbeat.ts";
import {
  defaultStateDir,
  loadIdentity,
  type NodeIdentity,
  saveIdentity,
} from "./identity.ts";
import { collectProbe, memoryNow } from "./probe.ts";
import type { MemorySpec } from "./memory_spec.ts";
import { createNodeApp, DrainState, type LinkTester } from "./server.ts";

/** Options of `startNodeWorker` (each has a CLI flag and env var in node/main.ts). */
export interface NodeWorkerOptions {
  /** Base URL of the gateway, e.g. `http://gateway:8000`. */
  gatewayUrl: string;
  /** Join token; needed only until the node is enrolled with this gateway. */
  joinToken?: string | null;
  /** Engine kind (default llama). */
  engine?: EngineKind;
  /** A ready engine to use instead of building one from `engine`. */
  engineInstance?: Engine;
  /** GGUF directory for the llama engine. */
  modelsDir?: string;
  /** OpenAI-compatible server for the openai engine. */
  upstreamUrl?: string | null;
  upstreamApiKey?: string | null;
  /**
   * openai: folders of model folders to look for tokenizers in, before the
   * usual places (node/engines/tokens.ts), for usage the upstream does not
   * report.
   */
  tokenizerDirs?: string[];
  /**
   * Port to listen on; 0 picks a free one. Default: 8100, or when that is
   * taken the next free one up to 8109, else any free port.
   */
  port?: number;
  /** Address to listen on (default 0.0.0.0). */
  host?: string;
  /** URL the gateway should call (default derived from host and port). */
  advertiseUrl?: string | null;
  name?: string | null;
  slots?: number;
  threads?: number | null;
  /** llama: context tokens per slot (default: the model's, as `kvMemory` allows). */
  contextSize?: number | null;
  /** llama: most tokens a request generates (its default when it names none). */
  maxOutputTokens?: number | null;
  /** llama: memory for a model's KV caches (node/llama/kv_budget.ts). */
  kvMemory?: MemorySpec;
  /** llama: host memory for prefixes evicted from slots, per model. */
  prefixCacheMemory?: MemorySpec;
  /** llama: load every model at start instead of on first use. */
  preload?: boolean;
  /** Where the identity is kept (default ~/.orchard/node). */
  stateDir?: string;
  /** Heartbeat interval (default 2000 ms). */
  heartbeatMs?: number;
  maxBodyBytes?: number;
  /** Link test implementation (default: node/native/linktest.ts when it loads). */
  linktest?: LinkTester | null;
  /**
   * Called once when the gateway refuses this node (removed by an admin,
   * or unknown to it), after the worker has stopped. Default: nothing more.
   */
  onRemoved?: (message: string) => void;
  /**
   * Called with each heartbeat answer's reachability: whether the gateway
   * reaches this node at the URL it advertises (fleet/reachability.ts),
   * and the port this node listens on.
   */
  onReachability?: (r: Reachability, port: number) => void;
}

/**
 * Thrown by `startNodeWorker` when the node cannot run without a person:
 * it is not enrolled with the gateway (never was, or the gateway removed
 * it) and no join token was given. Restarting does not help.
 */
export class NotEnrolledError extends Error {
  /** True when it was enrolled and the gateway no longer knows it. */
  readonly removed: boolean;
  constructor(message: string, removed: boolean) {
    super(message);
    this.name = "NotEnrolledError";
    this.removed = removed;
  }
}

/** A running node worker. */
export interface NodeWorker {
  nodeId: string;
  /** The URL the gateway calls. */
  url: string;
  /** The port it listens on. */
  port: number;
  /** Default ports found taken before `port` (empty with an explicit port). */
  skippedPorts: number[];
  /** Stops heartbeats, the server and the engine; idempotent. */
  close(): Promise<void>;
}

const VERSION = "0.1.0";

/** Builds the engine named by `kind` (llama is imported lazily so openai works without it). */
export async function createEngine(opts: NodeWorkerOptions): Promise<Engine> {
  if (opts.engineInstance) return opts.engineInstance;
  const kind = opts.engine ?? "llama";
  if (kind === "openai") {
    if (!opts.upstreamUrl) {
      throw new Error(
        "Cannot start the openai engine: --upstream URL (ORCHARD_UPSTREAM_URL) is required",
      );
    }
    const search = defaultTokenizerSearch();
    return createOpenAIEngine({
      upstreamUrl: opts.upstreamUrl,
      apiKey: opts.upstreamApiKey ?? undefined,
      slots: opts.slots,
      tokenizerSearch: {
        ...search,
        dirs: [...new Set([...opts.tokenizerDirs ?? [], ...search.dirs])],
      },
    });
  }
  let mod: { createLlamaEngine?: (o: Record<string, unknown>) => Engine };
  try {
    mod = await import(new URL("./llama/mod.ts", import.meta.url).href);
  } catch (err) {
    throw new Error(
      "Cannot load the llama engine; use --engine openai --upstream URL to front another server",
      { cause: err },
    );
  }
  if (typeof mod.createLlamaEngine !== "function") {
    throw new Error("Cannot load the llama engine: createLlamaEngine missing");
  }
  return mod.createLlamaEngine({
    modelsDir: opts.modelsDir ?? "./models",
    slots: opts.slots,
    threads: opts.threads ?? undefined,
    contextSize: opts.contextSize ?? undefined,
    maxOutputTokens: opts.maxOutputTokens ?? null,
    kvMemory: opts.kvMemory,
    prefixCacheMemory: opts.prefixCacheMemory,
    preload: opts.preload ?? false,
  });
}

/** The link test from node/native when it loads, else null (the API answers 501). */
async function loadLinkTester(): Promise<LinkTester | null> {
  try {
    const spec = new URL("./linktest.ts", import.meta.url).href;
    const mod = await import(spec) as {
      createLinkTester?: () => LinkTester | Promise<LinkTester>;
    };
    return mod.createLinkTester ? await mod.createLinkTester() : null;
  } catch (err) {
    log.debug("link test unavailable", { error: String(err) });
    return null;
  }
}

function advertised(host: string, port: number): string {
  let h = host;
  if (h === "0.0.0.0" || h === "::") {
    const lan = Deno.networkInterfaces().find((i) =>
      i.family === "IPv4" && !i.address.startsWith("127.") &&
      !i.address.startsWith("169.254.")
    );
    h = lan?.address ?? "127.0.0.1";
  }
  return `http://${h.includes(":") ? `[${h}]` : h}:${port}`;
}

async function enroll(
  gatewayUrl: string,
  token: string,
  body: Omit<EnrollRequest, "token">,
): Promise<EnrollResponse> {
  const res = await fetch(`${gatewayUrl}${NODE_API_PATH}/enroll`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...body, token }),
    redirect: "manual",
    signal: AbortSignal.timeout(30_000),
  });
  const json = await res.json().catch(() => null);
  if (res.status !== 201) {
    const msg = json?.error?.message ?? `status ${res.status}`;
    throw new Error(`Cannot enroll with ${gatewayUrl}: ${msg}`);
  }
  return json as EnrollResponse;
}

/** Starts a node worker; resolves once it is enrolled, serving and heartbeating. */
export async function startNodeWorker(
  opts: NodeWorkerOptions,
): Promise<NodeWorker> {
  const gatewayUrl = opts.gatewayUrl.replace(/\/+$/, "");
  const stateDir = opts.stateDir ?? defaultStateDir();
  const heartbeatMs = opts.heartbeatMs ?? 2000;
  const identity = await loadIdentity(stateDir);
  const privateKey = await importEd25519(identity.privateJwk);
  const engine = await createEngine(opts);
  await engine.start();

  // Serve first (enrollment needs the port); until enrolled, answer 503.
  let handler: (req: Request) => Response | Promise<Response> = () =>
    new Response("starting", { status: 503 });
  const hostname = opts.host ?? "0.0.0.0";
  let server: Deno.HttpServer<Deno.NetAddr>;
  const skippedPorts: number[] = [];
  try {
    server = listen(opts.port, hostname, (req) => handler(req), skippedPorts);
  } catch (err) {
    await engine.close();
    throw err;
  }
  let heartbeat: ReturnType<typeof startHeartbeat> | null = null;
  let closed = false;
  let stopWatchdog = () => {};
  const close = async () => {
    if (closed) return;
    closed = true;
    stopWatchdog();
    await heartbeat?.stop();
    await server.shutdown();
    await engine.close();
  };

  try {
    const url = opts.advertiseUrl?.replace(/\/+$/, "") ??
      advertised(opts.host ?? "0.0.0.0", server.addr.port);
    const drain = new DrainState(() => void heartbeat?.beatNow());
    /** The placement the gateway last answered (null: none applies). */
    let desired: PlacedModel[] | null = null;
    const collect = async (withProbe: boolean): Promise<HeartbeatRequest> => {
      const models = await engine.models();
      return {
        intervalMs: heartbeatMs,
        ...engine.stats(),
        memory: memoryNow(),
        models,
        drainState: drain.state,
        url,
        placement: desired
          ? placementReport(desired, models, {
            canUnload: !!engine.place,
            errors: engine.placementErrors?.(),
          })
          : null,
        ...(withProbe
          ? { probe: { ...await collectProbe(), ...engine.facts?.() } }
          : {}),
      };
    };
    const placed = (r: HeartbeatResponse | null) => {
      const next = Array.isArray(r?.placement) ? r.placement : null;
      if (JSON.stringify(next) !== JSON.stringify(desired)) {
        log.info("model placement", {
          models: next?.map((m) => `${m.id}${m.pinned ? " (pinned)" : ""}`) ??
            "none",
        });
      }
      desired = next;
      engine.place?.(desired);
    };

    /** Whether the node is a span's worker now (its RPC server runs). */
    let lending = false;
    let lastAnswer = Date.now();
    const spanned = (r: HeartbeatResponse | null, id: string) => {
      lastAnswer = Date.now();
      const a = r?.span ?? null;
      lending = a?.role === "worker";
      engine.span?.(a, id);
    };
    // a worker whose gateway stops answering stops lending its memory: the
    // head may be gone, and nobody could tell it to stop
    const lostAfter = Math.max(10_000, heartbeatMs * 5);
    const watchdog = setInterval(() => {
      if (!lending || Date.now() - lastAnswer < lostAfter) return;
      log.warn("no answer from the gateway; stopping the RPC server", {
        ms: Date.now() - lastAnswer,
      });
      lending = false;
      engine.span?.(null, enrollment?.nodeId ?? "");
    }, Math.min(lostAfter, 2_000));
    Deno.unrefTimer(watchdog);
    stopWatchdog = () => clearInterval(watchdog);

    const reached = (r: HeartbeatResponse | null) => {
      if (r?.reachability) {
        opts.onReachability?.(r.reachability, server.addr.port);
      }
    };
    let enrollment = identity.enrollment?.gatewayUrl === gatewayUrl
      ? identity.enrollment
      : null;
    let removed = false;
    if (enrollment) {
      // Check the gateway still knows us (it may have removed the node).
      const res = await sendHeartbeat(
        { gatewayUrl, nodeId: enrollment.nodeId, privateKey },
        await collect(true),
      );
      if (res.status === 401) {
        log.warn("gateway no longer knows this node", {
          nodeId: enrollment.nodeId,
        });
        enrollment = null;
        removed = true;
      } else if (res.status !== 200) {
        throw new Error(`Cannot reach ${gatewayUrl}: status ${res.status}`);
      } else {
        reached(res.body as HeartbeatResponse | null);
        placed(res.body as HeartbeatResponse | null);
        spanned(res.body as HeartbeatResponse | null, enrollment.nodeId);
      }
    }
    if (!enrollment) {
      if (!opts.joinToken) {
        throw new NotEnrolledError(
          removed
            ? `Cannot start the node: ${gatewayUrl} removed it (or no longer knows it); it needs a new join token: pass --join TOKEN (ORCHARD_JOIN_TOKEN)`
            : `Cannot start the node: it is not enrolled with ${gatewayUrl}; pass --join TOKEN (ORCHARD_JOIN_TOKEN)`,
          removed,
        );
      }
      const got = await enroll(gatewayUrl, opts.joinToken, {
        publicJwk: identity.publicJwk,
        url,
        ...(opts.name ? { name: opts.name } : {}),
        engine: engine.kind,
        models: await engine.models(),
        probe: { ...await collectProbe(), ...engine.facts?.() },
        version: VERSION,
      });
      enrollment = {
        nodeId: got.nodeId,
        gatewayUrl,
        gatewayJwks: got.gatewayJwks,
        enrolledAt: new Date().toISOString(),
      };
      const next: NodeIdentity = { ...identity, enrollment };
      await saveIdentity(stateDir, next);
      log.info("node enrolled", { nodeId: got.nodeId, url });
    }
    const nodeId = enrollment.nodeId;
    const verifier = await createGatewayVerifier(
      enrollment.gatewayJwks,
      nodeId,
    );
    const app = createNodeApp({
      engine,
      verifier,
      drain,
      maxBodyBytes: opts.maxBodyBytes,
      linktest: opts.linktest !== undefined
        ? opts.linktest
        : await loadLinkTester(),
    });
    handler = app.fetch;
    heartbeat = startHeartbeat({
      gatewayUrl,
      nodeId,
      privateKey,
      intervalMs: heartbeatMs,
      collect,
      onResponse: (r) => {
        drain.set(r?.drain === true);
        reached(r);
        placed(r);
        spanned(r, nodeId);
      },
      // removed (or unknown): stop at once rather than knock every beat
      onRejected: (_s, msg) => {
        if (closed) return;
        log.error("the gateway refused this node; stopping", { nodeId, msg });
        void close().then(() => opts.onRemoved?.(msg));
      },
    });
    return { nodeId, url, port: server.addr.port, skippedPorts, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/**
 * Serves on `port`, or with none given on the first free default port
 * (8100…8109, then any); records the taken defaults in `skipped`. An
 * explicit port in use, or not allowed, is an error naming it.
 */
function listen(
  port: number | undefined,
  hostname: string,
  handler: (req: Request) => Response | Promise<Response>,
  skipped: number[],
): Deno.HttpServer<Deno.NetAddr> {
  const serve = (p: number) =>
    Deno.serve({ port: p, hostname, onListen: () => {} }, handler);
  if (port === undefined) {
    for (let p = DEFAULT_PORT; p < DEFAULT_PORT + 10; p++) {
      try {
        return serve(p);
      } catch (err) {
        if (!(err instanceof Deno.errors.AddrInUse)) throw err;
        skipped.push(p);
      }
    }
    return serve(0);
  }
  try {
    return serve(port);
  } catch (err) {
    if (err instanceof Deno.errors.AddrInUse) {
      throw new Error(
        `Cannot start the node: port ${port} on ${hostname} is already in use by another program; choose another with --port (ORCHARD_NODE_PORT), or leave --port out to take a free one`,
        { cause: err },
      );
    }
    if (err instanceof Deno.errors.PermissionDenied) {
      throw new Error(
        `Cannot start the node: listening on port ${port} on ${hostname} is not allowed (ports below 1024 need privileges); choose another with --port (ORCHARD_NODE_PORT)`,
        { cause: err },
      );
    }
    throw err;
  }
}
