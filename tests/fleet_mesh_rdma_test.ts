/**
 * The mesh test over the emulated RDMA path: a gateway and real node
 * processes on loopback whose liborchard loads the fake verbs provider (a
 * test double; ORCHARD_VERBS_LIB) sharing one state directory, as Macs on
 * one host would share nothing but here share the emulated wire. "Test all
 * pairs" through the admin API stores `rdma-uc` results with latency
 * figures; injected faults give their stated messages.
 */
import assert from "node:assert/strict";
import { ensureNativeBuilt, hasVerbsHeader } from "../node/native/build.ts";
import { type Cluster, startCluster } from "./fixtures/cluster.ts";

const hasDouble = await hasVerbsHeader();
const paths = hasDouble ? await ensureNativeBuilt({ tests: true }) : null;

interface Stored {
  a: string;
  b: string;
  ok: boolean;
  error: string | null;
  result: {
    status: string;
    transport: string | null;
    fallback_reason: string | null;
    error: string | null;
    rdma: { device: string; gid_index: number } | null;
    latency: { samples: number; one_way_us: { p50: number } } | null;
  } | null;
}

async function healthy(c: Cluster, n: number) {
  const until = Date.now() + 30_000;
  while (true) {
    const { items } = await c.admin("GET", "/nodes") as {
      items: { state: string }[];
    };
    if (items.filter((x) => x.state === "healthy").length === n) return;
    assert.ok(Date.now() < until, JSON.stringify(items.map((x) => x.state)));
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function withDouble(
  each: Record<string, string>[],
  fn: (c: Cluster) => Promise<void>,
) {
  const dir = await Deno.makeTempDir({ prefix: "orchard-fake-verbs-" });
  try {
    await using c = await startCluster({
      nodes: each.length,
      threads: 1,
      nodeEnv: {
        ORCHARD_VERBS_LIB: paths!.fakeVerbs,
        ORCHARD_FAKE_VERBS_DIR: dir,
      },
      nodeEnvEach: each,
    });
    await healthy(c, each.length);
    await fn(c);
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

Deno.test({
  name:
    "test all pairs over the emulated RDMA path stores three rdma-uc results with latency figures",
  ignore: !hasDouble,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await withDouble([{}, {}, {}], async (c) => {
    const started = await c.admin("POST", "/links/test-all", {}) as {
      total: number;
    };
    assert.equal(started.total, 3);
    const deadline = Date.now() + 120_000;
    let progress: { running: boolean; failed: number };
    do {
      await new Promise((r) => setTimeout(r, 200));
      progress = await c.admin("GET", "/links/progress") as typeof progress;
      assert.ok(Date.now() < deadline, JSON.stringify(progress));
    } while (progress.running);
    const { items } = await c.admin("GET", "/links") as { items: Stored[] };
    assert.equal(items.length, 3, JSON.stringify(items));
    for (const r of items) {
      assert.ok(r.ok, `${r.a} ↔ ${r.b}: ${r.error}`);
      assert.equal(r.result?.transport, "rdma-uc", JSON.stringify(r.result));
      assert.equal(r.result?.fallback_reason, null);
      assert.deepEqual(r.result?.rdma, { device: "rdma_en3", gid_index: 1 });
      assert.ok(r.result!.latency!.samples > 0);
      assert.ok(r.result!.latency!.one_way_us.p50 > 0);
    }
    assert.equal(progress.failed, 0);
  });
});

Deno.test({
  name:
    "over the emulated RDMA path the QP ceiling, RTR errno 22 and a vanished peer give their stated messages",
  ignore: !hasDouble,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await withDouble([
    {},
    // Exo/MLX hold all 10 of this node's queue pairs on rdma_en3
    { ORCHARD_FAKE_VERBS_HELD_QPS: "10" },
    // this node's linktest process vanishes at its 50th send (kill -9)
    { ORCHARD_FAKE_VERBS_EXIT_AFTER_SENDS: "50" },
    // RTR fails with errno 22 (and stays failing: tested last)
    { ORCHARD_FAKE_VERBS_RTR_ERRNO: "22" },
  ], async (c) => {
    const [n0, busy, vanishing, rtr] = c.nodeIds as [
      string,
      string,
      string,
      string,
    ];
    const test = (a: string, b: string) =>
      c.admin("POST", "/links/test", { a, b }) as Promise<Stored>;

    const ebusy = await test(n0, busy);
    assert.ok(ebusy.ok, ebusy.error ?? "");
    assert.equal(ebusy.result?.transport, "tcp");
    assert.match(
      ebusy.result?.fallback_reason ?? "",
      /RDMA unusable on rdma_en3: queue-pair limit reached \(EBUSY\); Exo\/MLX on this port share its ~10 QPs/,
    );

    const gone = await test(vanishing, n0);
    assert.equal(gone.ok, false);
    assert.match(gone.error ?? "", /peer disappeared mid-test/);
    assert.equal(gone.result?.status, "failed");

    const einval = await test(rtr, n0);
    assert.ok(einval.ok, einval.error ?? "");
    assert.equal(einval.result?.transport, "tcp");
    assert.match(
      einval.result?.fallback_reason ?? "",
      /RTR transition failed \(errno 22\): known macOS issue until reboot/,
    );
  });
});
