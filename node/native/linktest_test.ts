import assert from "node:assert/strict";
import { ensureNativeBuilt } from "./build.ts";
import {
  type LinkTestResult,
  runLinktestConnect,
  startLinktestListener,
} from "./linktest.ts";

const paths = await ensureNativeBuilt({ tests: true });
const TOKEN = "s3cret-token";
const SMALL = { iterations: 300, warmup: 30, bwBytes: 16 << 20 } as const;

function assertMeasured(r: LinkTestResult): void {
  assert.equal(r.status, "ok", r.error ?? "");
  assert.equal(r.transport, "tcp");
  assert.ok(r.fallback_reason, "a TCP run records why RDMA was not used");
  const lat = r.latency!;
  assert.equal(lat.samples, SMALL.iterations);
  assert.ok(lat.rtt_us.min > 0 && lat.rtt_us.min <= lat.rtt_us.p50);
  assert.ok(
    lat.rtt_us.p50 <= lat.rtt_us.p99 && lat.rtt_us.p99 <= lat.rtt_us.max,
  );
  assert.ok(lat.rtt_us.p50 < 5000, `loopback p50 RTT ${lat.rtt_us.p50} µs`);
  // The JSON carries 3 decimals: one-way is half the RTT up to that rounding.
  assert.ok(
    Math.abs(lat.one_way_us.p50 - lat.rtt_us.p50 / 2) <= 0.001,
    `one-way ${lat.one_way_us.p50} µs, RTT ${lat.rtt_us.p50} µs`,
  );
  const bw = r.bandwidth!;
  assert.equal(bw.measured_by, "receiver");
  assert.ok(bw.bytes > 0 && bw.seconds > 0);
  assert.ok(
    bw.bytes_per_sec > 50e6,
    `loopback bandwidth ${bw.bytes_per_sec} B/s`,
  );
  assert.equal(r.messages.lost, 0);
  assert.equal(r.messages.corrupt, 0);
  assert.ok(r.messages.sent > SMALL.iterations);
}

Deno.test("link test over loopback falls back to TCP and measures latency and bandwidth on both sides", async () => {
  const listener = await startLinktestListener({
    port: 0,
    host: "127.0.0.1",
    token: TOKEN,
    timeoutMs: 10000,
  });
  assert.ok(listener.port > 0);
  const conn = await runLinktestConnect({
    host: "127.0.0.1",
    port: listener.port,
    token: TOKEN,
    timeoutMs: 10000,
    ...SMALL,
  });
  const lis = await listener.result;
  assertMeasured(conn);
  assertMeasured(lis);
  assert.equal(conn.role, "connector");
  assert.equal(lis.role, "listener");
  assert.deepEqual(lis.latency, conn.latency);
  assert.deepEqual(lis.bandwidth, conn.bandwidth);
  assert.equal(conn.peer?.port, listener.port);
  assert.equal(conn.peer?.rdma_available, false);
});

Deno.test("link test refuses a wrong control token and still serves the right peer", async () => {
  const listener = await startLinktestListener({
    port: 0,
    host: "127.0.0.1",
    token: TOKEN,
    timeoutMs: 10000,
  });
  const bad = await runLinktestConnect({
    host: "127.0.0.1",
    port: listener.port,
    token: "wrong-token",
    timeoutMs: 5000,
  });
  assert.equal(bad.status, "auth_failed");
  assert.match(bad.error ?? "", /refused the control token/);
  assert.equal(bad.latency, null);
  const good = await runLinktestConnect({
    host: "127.0.0.1",
    port: listener.port,
    token: TOKEN,
    timeoutMs: 10000,
    ...SMALL,
  });
  assert.equal(good.status, "ok");
  const lis = await listener.result;
  assert.equal(lis.status, "ok");
  assert.equal(lis.refused_connections, 1);
});

Deno.test("startLinktestListener().cancel() ends a waiting listener with status cancelled", async () => {
  const listener = await startLinktestListener({
    port: 0,
    host: "127.0.0.1",
    token: TOKEN,
    timeoutMs: 20000,
  });
  const t0 = performance.now();
  listener.cancel();
  const r = await listener.result;
  assert.equal(r.status, "cancelled");
  assert.ok(performance.now() - t0 < 3000);
});

Deno.test("an aborted signal cancels a connector waiting on a silent peer", async () => {
  // A TCP server that accepts and never speaks: the connector waits in the handshake.
  const silent = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const accepted = silent.accept();
  const ac = new AbortController();
  const run = runLinktestConnect({
    host: "127.0.0.1",
    port: silent.addr.port,
    token: TOKEN,
    timeoutMs: 20000,
    signal: ac.signal,
  });
  const conn = await accepted;
  ac.abort();
  const r = await run;
  assert.equal(r.status, "cancelled");
  conn.close();
  silent.close();
});

Deno.test("a listener with no peer times out with status timeout", async () => {
  const listener = await startLinktestListener({
    port: 0,
    host: "127.0.0.1",
    token: TOKEN,
    timeoutMs: 300,
  });
  const r = await listener.result;
  assert.equal(r.status, "timeout");
  assert.match(r.error ?? "", /no authenticated peer within 300 ms/);
});

Deno.test("a second listener on the same device is refused while one runs", async () => {
  const first = await startLinktestListener({
    port: 0,
    host: "127.0.0.1",
    token: TOKEN,
    timeoutMs: 5000,
  });
  await assert.rejects(
    () => startLinktestListener({ port: 0, host: "127.0.0.1", token: TOKEN }),
    /another test is running on listener:default/,
  );
  first.cancel();
  assert.equal((await first.result).status, "cancelled");
});

Deno.test("link test options are validated before a process starts", async () => {
  await assert.rejects(
    () => runLinktestConnect({ host: "127.0.0.1", port: 70000, token: TOKEN }),
    RangeError,
  );
  await assert.rejects(
    () => startLinktestListener({ port: 0, token: "" }),
    TypeError,
  );
});

/**
 * Runs one link test through the fake verbs provider (a test double: an
 * Apple-like UC device emulated between the two orchard-linktest processes
 * over a shared state directory). `listenerEnv` / `connectorEnv` inject
 * faults into one side only (each child takes the environment at spawn).
 */
async function viaDouble(
  opts: {
    listenerEnv?: Record<string, string>;
    connectorEnv?: Record<string, string>;
    transport?: "auto" | "rdma";
  } = {},
): Promise<{ conn: LinkTestResult; lis: LinkTestResult }> {
  const dir = await Deno.makeTempDir({ prefix: "orchard-fake-verbs-" });
  const base = {
    ORCHARD_VERBS_LIB: paths.fakeVerbs,
    ORCHARD_FAKE_VERBS_DIR: dir,
  };
  const saved = new Map<string, string | undefined>();
  const apply = (env: Record<string, string>) => {
    for (const [k, v] of Object.entries(env)) {
      if (!saved.has(k)) saved.set(k, Deno.env.get(k));
      Deno.env.set(k, v);
    }
  };
  const clear = (env: Record<string, string> = {}) => {
    for (const k of Object.keys(env)) {
      const prior = saved.get(k);
      if (prior === undefined) Deno.env.delete(k);
      else Deno.env.set(k, prior);
    }
  };
  try {
    apply({ ...base, ...opts.listenerEnv });
    const listener = await startLinktestListener({
      port: 0,
      host: "127.0.0.1",
      token: TOKEN,
      timeoutMs: 20000,
      transport: opts.transport,
    });
    clear(opts.listenerEnv);
    apply({ ...base, ...opts.connectorEnv });
    const conn = await runLinktestConnect({
      host: "127.0.0.1",
      port: listener.port,
      token: TOKEN,
      timeoutMs: 20000,
      transport: opts.transport,
      ...SMALL,
    });
    return { conn, lis: await listener.result };
  } finally {
    for (const [k, prior] of saved) {
      if (prior === undefined) Deno.env.delete(k);
      else Deno.env.set(k, prior);
    }
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

const hasDouble = await Deno.stat(paths.fakeVerbs).then(
  () => true,
  () => false,
);

Deno.test({
  name:
    "through the verbs double the link test runs the RDMA data path (UC, mmap'ed and registered buffers, SEND/RECV, CQ polling) on both sides",
  ignore: !hasDouble,
}, async () => {
  const { conn, lis } = await viaDouble({ transport: "rdma" });
  for (const r of [conn, lis]) {
    assert.equal(r.status, "ok", r.error ?? "");
    assert.equal(r.transport, "rdma-uc");
    assert.equal(r.fallback_reason, null);
    assert.deepEqual(r.rdma, { device: "rdma_en3", gid_index: 1 });
    assert.equal(r.messages.corrupt, 0);
  }
  assert.equal(conn.latency!.samples, SMALL.iterations - conn.messages.lost);
  assert.ok(conn.latency!.one_way_us.p50 > 0);
  assert.ok(lis.bandwidth!.bytes_per_sec > 0);
  assert.equal(lis.bandwidth!.measured_by, "receiver");
});

Deno.test({
  name:
    "through the verbs double, the RC profile runs the data path over RC queue pairs",
  ignore: !hasDouble,
}, async () => {
  const rc = { ORCHARD_FAKE_VERBS_PROFILE: "rc" };
  const { conn } = await viaDouble({
    transport: "rdma",
    listenerEnv: rc,
    connectorEnv: rc,
  });
  assert.equal(conn.status, "ok", conn.error ?? "");
  assert.equal(conn.transport, "rdma-rc");
  assert.equal(conn.messages.lost, 0);
});

Deno.test({
  name:
    "the queue-pair ceiling (EBUSY, shared with Exo/MLX) falls back to TCP and says so",
  ignore: !hasDouble,
}, async () => {
  // Exo/MLX hold 9 of rdma_en3's 10 QPs: one side takes the last one, the
  // other's is the 11th on the device (which one is a race).
  const held = { ORCHARD_FAKE_VERBS_HELD_QPS: "9" };
  const { conn } = await viaDouble({ listenerEnv: held, connectorEnv: held });
  assertMeasured(conn);
  assert.match(
    conn.fallback_reason ?? "",
    /RDMA setup failed: (this node|peer): RDMA unusable on rdma_en3: queue-pair limit reached \(EBUSY\); Exo\/MLX on this port share its ~10 QPs/,
  );
});

Deno.test({
  name:
    "an RTR transition failing with errno 22 falls back to TCP with the known macOS issue named",
  ignore: !hasDouble,
}, async () => {
  const { conn } = await viaDouble({
    listenerEnv: { ORCHARD_FAKE_VERBS_RTR_ERRNO: "22" },
  });
  assertMeasured(conn);
  assert.match(
    conn.fallback_reason ?? "",
    /RTR transition failed \(errno 22\): known macOS issue until reboot/,
  );
});

Deno.test({
  name: "a peer that disappears mid-test is reported as such",
  ignore: !hasDouble,
}, async () => {
  const { conn, lis } = await viaDouble({
    transport: "rdma",
    listenerEnv: { ORCHARD_FAKE_VERBS_EXIT_AFTER_SENDS: "50" },
  });
  assert.equal(conn.status, "failed");
  assert.match(conn.error ?? "", /peer disappeared mid-test/);
  assert.equal(lis.status, "failed"); // its process vanished (exit 137)
});
