/**
 * Gateway-driven link tests: node A opens a one-shot listener, node B
 * connects to it and measures (RDMA where present, else TCP), and the
 * `orchard.linktest/1` result is stored for the pair. "Test all" runs the
 * pairs one at a time in the background, with progress kept per instance.
 */
import { log } from "../lib/log.ts";
import {
  getNodeRecord,
  type LinkTestRecord,
  saveLinkTest,
} from "../store/nodes.ts";
import type { Principal } from "../store/principal.ts";
import type { Store } from "../store/store.ts";
import type { Fleet } from "./types.ts";

/** Progress of the current or last "test all" run. */
export interface LinkTestProgress {
  running: boolean;
  total: number;
  done: number;
  failed: number;
  current: { a: string; b: string } | null;
  startedAt: string | null;
  finishedAt: string | null;
}

/** Link-test runner for one gateway instance. */
export interface LinkTests {
  /** Tests one pair now and stores the result. */
  testPair(p: Principal, a: string, b: string): Promise<LinkTestRecord>;
  /** Starts testing every pair of `ids` in the background; false if a run is in progress. */
  startAll(p: Principal, ids: string[]): boolean;
  /** The current or last run's progress. */
  progress(): LinkTestProgress;
}

const STEP_TIMEOUT_MS = 60_000;

/** Creates the link-test runner. */
export function createLinkTests(
  deps: { store: Store; fleet: Pick<Fleet, "fetchNode"> },
): LinkTests {
  const { store, fleet } = deps;
  let state: LinkTestProgress = {
    running: false,
    total: 0,
    done: 0,
    failed: 0,
    current: null,
    startedAt: null,
    finishedAt: null,
  };

  async function call(nodeId: string, path: string, body: unknown) {
    const res = await fleet.fetchNode(nodeId, path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(STEP_TIMEOUT_MS),
    });
    const json = await res.json().catch(() => null);
    if (!res.ok) {
      const msg = json?.error?.message ?? `status ${res.status}`;
      throw new Error(`node ${nodeId} ${path}: ${msg}`);
    }
    return json as Record<string, unknown>;
  }

  async function testPair(
    p: Principal,
    a: string,
    b: string,
  ): Promise<LinkTestRecord> {
    let rec: LinkTestRecord;
    try {
      const nodeA = await getNodeRecord(store, a);
      if (!nodeA) throw new Error(`node ${a} is not enrolled`);
      // a fresh token per test: both nodes prove it to each other (HMAC
      // challenge), so nobody else on the LAN can join the measurement
      const token = crypto.randomUUID();
      const listen = await call(a, "/orchard/linktest/listen", { token });
      const host = typeof listen.host === "string" && listen.host &&
          listen.host !== "0.0.0.0" && listen.host !== "::"
        ? listen.host
        : new URL(nodeA.url).hostname.replace(/^\[|\]$/g, "");
      const result = await call(b, "/orchard/linktest/connect", {
        ...listen,
        host,
        token,
      });
      // The measurement ran but may have failed (a peer that vanished, an
      // RDMA test that could not fall back): keep the result, name the error.
      const status = typeof result.status === "string" ? result.status : "ok";
      const failure = status === "ok" ? null : String(
        typeof result.error === "string" && result.error
          ? result.error
          : `link test ${status}`,
      ).slice(0, 500);
      rec = {
        a,
        b,
        at: new Date().toISOString(),
        ok: failure === null,
        result,
        error: failure,
      };
    } catch (err) {
      rec = {
        a,
        b,
        at: new Date().toISOString(),
        ok: false,
        result: null,
        error: (err as Error).message.slice(0, 500),
      };
    }
    await saveLinkTest(store, p, rec);
    return rec;
  }

  async function runAll(p: Principal, pairs: [string, string][]) {
    for (const [a, b] of pairs) {
      state.current = { a, b };
      const rec = await testPair(p, a, b).catch((err) => {
        log.warn("link test failed", { a, b, error: String(err) });
        return null;
      });
      state.done++;
      if (!rec?.ok) state.failed++;
    }
    state.current = null;
    state.running = false;
    state.finishedAt = new Date().toISOString();
  }

  return {
    testPair,
    startAll(p, ids) {
      if (state.running) return false;
      const pairs: [string, string][] = [];
      for (let i = 0; i < ids.length; i++) {
        for (let j = i + 1; j < ids.length; j++) pairs.push([ids[i]!, ids[j]!]);
      }
      state = {
        running: pairs.length > 0,
        total: pairs.length,
        done: 0,
        failed: 0,
        current: null,
        startedAt: new Date().toISOString(),
        finishedAt: pairs.length > 0 ? null : new Date().toISOString(),
      };
      if (pairs.length > 0) void runAll(p, pairs);
      return true;
    },
    progress: () => ({ ...state }),
  };
}
