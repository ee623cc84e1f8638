/**
 * Whether the gateway reaches each node at the URL it advertises. A node
 * only knows the addresses it sees itself; behind NAT, in Docker, or with
 * several networks (a Thunderbolt bridge and Wi-Fi) the gateway may reach
 * it at none of them, and then every request routed to it fails. So the
 * gateway checks, cheaply: a gateway-signed `GET {url}/health` when the node
 * enrolls, on its first heartbeat with a new URL, then every `everyMs` (every
 * `retryMs` while it fails). The heartbeat answer carries the last result
 * (the node warns), and KV keeps it for the admin API and the nodes page.
 */
import { signEdDSA } from "../lib/jwt.ts";
import { log } from "../lib/log.ts";
import { k } from "../store/kv_keys.ts";
import type { Store } from "../store/store.ts";
import {
  GATEWAY_AUDIENCE,
  NODE_JWT_TTL_SECONDS,
  type Reachability,
} from "../protocol/node_messages.ts";

/** Options of `createReachability`. */
export interface ReachabilityOptions {
  store: Store;
  /** Time between checks of a reachable node (default 5 min). */
  everyMs?: number;
  /** Time between checks while a node is unreachable (default 30 s). */
  retryMs?: number;
  /** How long a check waits for an answer (default 5 s). */
  timeoutMs?: number;
}

/** The reachability checks of one gateway instance. */
export interface ReachabilityChecker {
  /**
   * The last result for the node at `url` (null before the first check of
   * that URL ends); starts a check in the background when one is due.
   */
  observe(nodeId: string, url: string): Reachability | null;
  /** Aborts checks in progress and waits for them; idempotent. */
  close(): Promise<void>;
}

interface Entry {
  url: string;
  result: Reachability | null;
  running: Promise<Reachability> | null;
  /** When the last check started (ms). */
  startedAt: number;
  seenAt: number;
}

/** Says why a fetch failed, in words an operator can act on. */
export function describeFetchError(err: unknown, timeoutMs: number): string {
  const e = err as Error;
  if (e?.name === "TimeoutError") {
    return `no answer within ${
      Math.round(timeoutMs / 1000)
    } s (a wrong address, or a firewall dropping the connection)`;
  }
  // fetch's own message is "fetch failed"; the reason is in the causes.
  const parts: string[] = [];
  for (let x: unknown = err; x && parts.length < 4; x = (x as Error).cause) {
    parts.push(String((x as Error).message ?? x));
  }
  const msg = parts.filter((p) => p !== "fetch failed").join(": ") ||
    String(e?.message ?? err);
  if (/refused/i.test(msg)) {
    return "connection refused (nothing listens at that address and port)";
  }
  if (/dns|lookup|resolve|not known/i.test(msg)) {
    return `the gateway cannot resolve the host name (${msg.slice(0, 200)})`;
  }
  if (/unreachable|no route/i.test(msg)) {
    return `no route to the host (${msg.slice(0, 200)})`;
  }
  return msg.slice(0, 300);
}

/** Creates the checker (one per gateway instance). */
export function createReachability(
  opts: ReachabilityOptions,
): ReachabilityChecker {
  const { store } = opts;
  const everyMs = opts.everyMs ?? 5 * 60_000;
  const retryMs = opts.retryMs ?? 30_000;
  const timeoutMs = opts.timeoutMs ?? 5_000;
  const entries = new Map<string, Entry>();
  const life = new AbortController();
  let lastPrune = Date.now();

  async function probe(nodeId: string, url: string): Promise<Reachability> {
    const checkedAt = () => new Date().toISOString();
    try {
      const jwt = await signEdDSA(store.secrets.gatewayPrivateKey, {}, {
        iss: GATEWAY_AUDIENCE,
        aud: nodeId,
        sub: "gateway",
        ttlSeconds: NODE_JWT_TTL_SECONDS,
      });
      const res = await fetch(`${url}/health`, {
        headers: { authorization: `Bearer ${jwt}` },
        redirect: "manual",
        signal: AbortSignal.any([
          life.signal,
          AbortSignal.timeout(timeoutMs),
        ]),
      });
      await res.body?.cancel();
      // 503: the node answers while it starts, or its engine is unwell;
      // either way the gateway reaches it.
      if (res.status === 200 || res.status === 503) {
        return { url, ok: true, checkedAt: checkedAt() };
      }
      return {
        url,
        ok: false,
        error: res.status === 401
          ? "something answers there but does not accept this gateway's signature (another node or program at that address and port?)"
          : `${url}/health answered ${res.status}: not an Orchard node (another program at that address and port?)`,
        checkedAt: checkedAt(),
      };
    } catch (err) {
      return {
        url,
        ok: false,
        error: describeFetchError(err, timeoutMs),
        checkedAt: checkedAt(),
      };
    }
  }

  /** Keeps the result in KV while the node exists (a removal wins). */
  async function save(nodeId: string, r: Reachability): Promise<void> {
    const node = await store.kv.get(k.node(nodeId));
    if (!node.value) return;
    await store.kv.atomic().check(node).set(k.nodeReach(nodeId), r).commit();
  }

  function start(nodeId: string, e: Entry): Promise<Reachability> {
    const url = e.url;
    e.startedAt = Date.now();
    const run = probe(nodeId, url).then(async (r) => {
      if (life.signal.aborted) return r;
      const cur = entries.get(nodeId);
      if (cur?.url === url) cur.result = r;
      if (!r.ok) {
        log.warn("node unreachable at its advertised URL", {
          nodeId,
          url,
          error: r.error,
        });
      }
      await save(nodeId, r).catch((err) =>
        log.warn("cannot save node reachability", { error: String(err) })
      );
      return r;
    }).finally(() => {
      if (e.running === run) e.running = null;
    });
    e.running = run;
    return run;
  }

  function entry(nodeId: string, url: string): Entry {
    const now = Date.now();
    if (now - lastPrune > 10 * 60_000) {
      lastPrune = now;
      for (const [id, x] of entries) {
        if (now - x.seenAt > 10 * 60_000 && !x.running) entries.delete(id);
      }
    }
    let e = entries.get(nodeId);
    if (!e || e.url !== url) {
      e = { url, result: null, running: null, startedAt: 0, seenAt: now };
      entries.set(nodeId, e);
    }
    e.seenAt = now;
    return e;
  }

  return {
    observe(nodeId, url) {
      const e = entry(nodeId, url);
      const wait = e.result && !e.result.ok ? retryMs : everyMs;
      if (
        !life.signal.aborted && !e.running &&
        (!e.result || Date.now() - e.startedAt >= wait)
      ) {
        void start(nodeId, e);
      }
      return e.result;
    },
    async close() {
      life.abort();
      await Promise.all(
        [...entries.values()].map((e) => e.running?.catch(() => {})),
      );
    },
  };
}
