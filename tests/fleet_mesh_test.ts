/**
 * The mesh test between real nodes: a gateway process and three node
 * processes on loopback; "test all pairs" through the admin API measures
 * every pair over liborchard's link test (TCP here: no RDMA hardware) and
 * stores three results with figures.
 */
import assert from "node:assert/strict";
import { startCluster } from "./fixtures/cluster.ts";

Deno.test({
  name:
    "test all pairs measures every pair of three real nodes and stores the results",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using c = await startCluster({ nodes: 3, threads: 1 });
  const until = Date.now() + 20_000;
  while (true) {
    const { items } = await c.admin("GET", "/nodes") as {
      items: { state: string }[];
    };
    if (items.filter((n) => n.state === "healthy").length === 3) break;
    assert.ok(Date.now() < until, JSON.stringify(items.map((n) => n.state)));
    await new Promise((r) => setTimeout(r, 100));
  }
  const started = await c.admin("POST", "/links/test-all", {}) as {
    total: number;
  };
  assert.equal(started.total, 3);
  const deadline = Date.now() + 60_000;
  let progress: { running: boolean; done: number; failed: number };
  do {
    await new Promise((r) => setTimeout(r, 200));
    progress = await c.admin("GET", "/links/progress") as typeof progress;
    assert.ok(Date.now() < deadline, JSON.stringify(progress));
  } while (progress.running);
  const { items } = await c.admin("GET", "/links") as {
    items: {
      a: string;
      b: string;
      ok: boolean;
      error: string | null;
      result: Record<string, unknown> | null;
    }[];
  };
  assert.equal(items.length, 3, JSON.stringify(items));
  const pairs = new Set(items.map((r) => [r.a, r.b].sort().join("|")));
  assert.equal(pairs.size, 3);
  for (const r of items) {
    assert.ok(r.ok, `${r.a} ↔ ${r.b}: ${r.error}`);
    assert.ok(r.result, "a stored measurement");
    assert.match(JSON.stringify(r.result), /"transport":"tcp"/);
  }
  assert.equal(progress.failed, 0);
});
