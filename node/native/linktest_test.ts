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

Deno.test("with the fake verbs provider (no queue pairs) the link test falls back to TCP and says why", async () => {
  const prior = Deno.env.get("ORCHARD_VERBS_LIB");
  Deno.env.set("ORCHARD_VERBS_LIB", paths.fakeVerbs); // inherited by both children
  try {
    const listener = await startLinktestListener({
      port: 0,
      host: "127.0.0.1",
      token: TOKEN,
      timeoutMs: 10000,
    });
    const conn = await runLinktestConnect({
      host: "127.0.0.1",
      port: listener.port,
      token: TOKEN,
      timeoutMs: 10000,
      ...SMALL,
    });
    await listener.result;
    assertMeasured(conn);
    assert.match(conn.fallback_reason ?? "", /queue-pair symbols/);
  } finally {
    if (prior === undefined) Deno.env.delete("ORCHARD_VERBS_LIB");
    else Deno.env.set("ORCHARD_VERBS_LIB", prior);
  }
});
