// deno-lint-ignore-file no-console
/**
 * `deno task bench:link`: the link test's TCP path on loopback next to a plain
 * C TCP ping-pong/stream built for this benchmark, run in the same session,
 * as ratios (target: within 10%). With `--connect HOST:PORT --token T` it
 * measures a real peer instead and reports against Thunderbolt 5 RDMA
 * (~5 µs one-way, 9 GB/s raw; target ≤ 10 µs, ≥ 7 GB/s).
 *
 * @module
 */
import { ensureNativeBuilt } from "../node/native/build.ts";
import {
  type LinkTestResult,
  runLinktestConnect,
  startLinktestListener,
} from "../node/native/linktest.ts";

const ROUNDS = 5;
const P = {
  iterations: 5000,
  warmup: 500,
  msgBytes: 64,
  bwBytes: 256 << 20,
  bwMsgBytes: 256 << 10,
};

interface Figures {
  p50: number;
  min: number;
  p99: number;
  bw: number;
}

const median = (xs: number[]) =>
  [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

function figures(r: LinkTestResult): Figures {
  if (r.status !== "ok" || !r.latency || !r.bandwidth) {
    throw new Error(`link test failed: ${r.error ?? r.status}`);
  }
  return {
    p50: r.latency.rtt_us.p50,
    min: r.latency.rtt_us.min,
    p99: r.latency.rtt_us.p99,
    bw: r.bandwidth.bytes_per_sec,
  };
}

async function ours(): Promise<Figures> {
  const token = crypto.randomUUID();
  const listener = await startLinktestListener({
    port: 0,
    host: "127.0.0.1",
    token,
    transport: "tcp",
  });
  const r = await runLinktestConnect({
    host: "127.0.0.1",
    port: listener.port,
    token,
    transport: "tcp",
    ...P,
  });
  await listener.result;
  return figures(r);
}

async function baseline(bin: string): Promise<Figures> {
  const server = new Deno.Command(bin, { args: ["server"], stdout: "piped" })
    .spawn();
  const reader = server.stdout.getReader();
  const { value } = await reader.read();
  const port = new TextDecoder().decode(value).trim();
  const { stdout, code } = await new Deno.Command(bin, {
    args: [
      "client",
      port,
      String(P.iterations),
      String(P.warmup),
      String(P.msgBytes),
      String(P.bwBytes),
      String(P.bwMsgBytes),
    ],
    stdout: "piped",
  }).output();
  reader.releaseLock();
  await server.stdout.cancel();
  await server.status;
  if (code !== 0) throw new Error(`tcp_baseline client exited with ${code}`);
  const j = JSON.parse(new TextDecoder().decode(stdout));
  return {
    p50: j.rtt_p50_us,
    min: j.rtt_min_us,
    p99: j.rtt_p99_us,
    bw: j.bytes_per_sec,
  };
}

const fmt = (n: number, d = 2) => n.toFixed(d).padStart(9);

async function remote(target: string, token: string): Promise<void> {
  const colon = target.lastIndexOf(":");
  const r = await runLinktestConnect({
    host: target.slice(0, colon),
    port: Number(target.slice(colon + 1)),
    token,
  });
  const f = figures(r);
  console.log(
    `transport ${r.transport}${
      r.fallback_reason ? ` (fallback: ${r.fallback_reason})` : ""
    }`,
  );
  console.log(
    `one-way p50 ${fmt(f.p50 / 2)} µs  (reference ~5 µs, target ≤ 10 µs: ${
      f.p50 / 2 <= 10 ? "met" : "missed"
    })`,
  );
  console.log(
    `bandwidth   ${fmt(f.bw / 1e9)} GB/s (reference 9 GB/s, target ≥ 7 GB/s: ${
      f.bw >= 7e9 ? "met" : "missed"
    })`,
  );
  console.log(`lost ${r.messages.lost}, corrupt ${r.messages.corrupt}`);
}

const args = Deno.args;
const connectAt = args.indexOf("--connect");
if (connectAt >= 0) {
  const token = args[args.indexOf("--token") + 1] ??
    Deno.env.get("ORCHARD_LINKTEST_TOKEN") ?? "";
  await remote(args[connectAt + 1] ?? "", token);
} else {
  const paths = await ensureNativeBuilt({ bench: true });
  const a: Figures[] = [], b: Figures[] = [];
  for (let i = 0; i < ROUNDS; i++) { // interleaved, order alternating, so drift hits both alike
    if (i % 2 === 0) {
      a.push(await ours());
      b.push(await baseline(paths.tcpBaseline));
    } else {
      b.push(await baseline(paths.tcpBaseline));
      a.push(await ours());
    }
  }
  const m = (xs: Figures[], k: keyof Figures) => median(xs.map((x) => x[k]));
  console.log(
    `loopback TCP, ${ROUNDS} interleaved rounds, medians; ${P.iterations} x ${P.msgBytes} B ping-pong, ${
      P.bwBytes >> 20
    } MiB in ${P.bwMsgBytes >> 10} KiB messages`,
  );
  console.log(`                      liborchard    plain TCP    ratio`);
  console.log(
    `RTT p50 (µs)         ${fmt(m(a, "p50"))}    ${fmt(m(b, "p50"))}  ${
      fmt(m(a, "p50") / m(b, "p50"), 3)
    }`,
  );
  console.log(
    `RTT min (µs)         ${fmt(m(a, "min"))}    ${fmt(m(b, "min"))}  ${
      fmt(m(a, "min") / m(b, "min"), 3)
    }`,
  );
  console.log(
    `RTT p99 (µs)         ${fmt(m(a, "p99"))}    ${fmt(m(b, "p99"))}  ${
      fmt(m(a, "p99") / m(b, "p99"), 3)
    }`,
  );
  console.log(
    `one-way p50 (µs)     ${fmt(m(a, "p50") / 2)}    ${fmt(m(b, "p50") / 2)}`,
  );
  console.log(
    `bandwidth (GB/s)     ${fmt(m(a, "bw") / 1e9)}    ${
      fmt(m(b, "bw") / 1e9)
    }  ${fmt(m(a, "bw") / m(b, "bw"), 3)}`,
  );
  const latOk = m(a, "p50") <= m(b, "p50") * 1.1,
    bwOk = m(a, "bw") >= m(b, "bw") * 0.9;
  console.log(
    `target (within 10% of plain TCP): latency ${
      latOk ? "met" : "missed"
    }, bandwidth ${bwOk ? "met" : "missed"}`,
  );
}
