/**
 * The heartbeat loop: every `intervalMs` the node posts its load, models,
 * health and drain state to the gateway, signed with its own key, and
 * learns from the answer whether to drain. The hardware probe rides along
 * now and then (`probeEveryMs`).
 */
import { signEdDSA } from "../lib/jwt.ts";
import { log } from "../lib/log.ts";
import {
  GATEWAY_AUDIENCE,
  type HeartbeatRequest,
  type HeartbeatResponse,
  NODE_API_PATH,
  NODE_JWT_TTL_SECONDS,
} from "../protocol/node_messages.ts";

/** Options of `startHeartbeat`. */
export interface HeartbeatOptions {
  gatewayUrl: string;
  nodeId: string;
  privateKey: CryptoKey;
  intervalMs: number;
  /** How often the hardware probe is included (default 5 min; first beat always). */
  probeEveryMs?: number;
  /** Builds the heartbeat body; `withProbe` asks for the hardware probe. */
  collect(withProbe: boolean): Promise<HeartbeatRequest>;
  /** Called with each accepted heartbeat's answer. */
  onResponse(res: HeartbeatResponse): void;
  /** Called when the gateway refuses the node (401: removed or unknown). */
  onRejected?(status: number, message: string): void;
}

/** A running heartbeat. */
export interface Heartbeat {
  /** Sends a heartbeat now (coalesced with one in progress). */
  beatNow(): Promise<void>;
  /** Stops the loop; idempotent. */
  stop(): Promise<void>;
}

/** Sends one heartbeat; returns the HTTP status and parsed answer. */
export async function sendHeartbeat(
  opts: Pick<HeartbeatOptions, "gatewayUrl" | "nodeId" | "privateKey">,
  body: HeartbeatRequest,
  signal?: AbortSignal,
): Promise<{ status: number; body: unknown }> {
  const jwt = await signEdDSA(opts.privateKey, {}, {
    iss: opts.nodeId,
    aud: GATEWAY_AUDIENCE,
    sub: opts.nodeId,
    ttlSeconds: NODE_JWT_TTL_SECONDS,
  });
  const res = await fetch(`${opts.gatewayUrl}${NODE_API_PATH}/heartbeat`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      authorization: `Bearer ${jwt}`,
    },
    body: JSON.stringify(body),
    redirect: "manual",
    signal: signal ?? AbortSignal.timeout(10_000),
  });
  const text = await res.text();
  let parsed: unknown = null;
  try {
    parsed = JSON.parse(text);
  } catch { /* not JSON */ }
  return { status: res.status, body: parsed };
}

/** Starts the heartbeat loop (the first beat is sent at once). */
export function startHeartbeat(opts: HeartbeatOptions): Heartbeat {
  const probeEveryMs = opts.probeEveryMs ?? 5 * 60_000;
  let lastProbe = -Infinity;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let running: Promise<void> | null = null;
  let again = false;
  let stopped = false;
  let failing = false;
  const life = new AbortController();

  async function beat(): Promise<void> {
    const withProbe = Date.now() - lastProbe >= probeEveryMs;
    try {
      const body = await opts.collect(withProbe);
      const signal = AbortSignal.any([
        life.signal,
        AbortSignal.timeout(Math.max(2_000, opts.intervalMs * 2)),
      ]);
      const res = await sendHeartbeat(opts, body, signal);
      if (res.status === 200) {
        if (withProbe) lastProbe = Date.now();
        if (failing) log.info("heartbeat accepted again");
        failing = false;
        opts.onResponse(res.body as HeartbeatResponse);
        return;
      }
      const msg = (res.body as { error?: { message?: string } } | null)?.error
        ?.message ?? `status ${res.status}`;
      if (res.status === 401) opts.onRejected?.(res.status, msg);
      if (!failing) log.warn("heartbeat refused", { status: res.status, msg });
      failing = true;
    } catch (err) {
      if (stopped) return;
      if (!failing) log.warn("heartbeat failed", { error: String(err) });
      failing = true;
    }
  }

  function run(): Promise<void> {
    if (running) {
      again = true;
      return running;
    }
    clearTimeout(timer);
    running = (async () => {
      do {
        again = false;
        await beat();
      } while (again && !stopped);
    })().finally(() => {
      running = null;
      if (!stopped) timer = setTimeout(run, opts.intervalMs);
    });
    return running;
  }
  run();

  return {
    beatNow: run,
    async stop() {
      stopped = true;
      clearTimeout(timer);
      life.abort();
      await running?.catch(() => {});
    },
  };
}
