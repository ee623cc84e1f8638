// deno-lint-ignore-file no-console -- a benchmark entry point prints its report
/**
 * `deno task bench:gateway`: the gateway's overhead against a fixed fast
 * upstream, in one invocation. Separate processes: the upstream (JSON and
 * SSE), a bare ~30-line Deno pass-through proxy (the floor), and the gateway
 * with auth, exact limits and metering on; this process generates load.
 * Prints CPU per request (from /proc), max throughput, added p50/p99 at a
 * fixed rate and added time to first byte for streams, as ratios to direct
 * and to the floor; then again with 10,000 keys and 1,000 tenants in KV,
 * on new children (each scenario's three targets start fresh together).
 * Each number is the median of 3 rounds in which the targets take turns
 * (5 for the latencies at a fixed rate, after 15 s at that rate each: see
 * `scenario`).
 * The load generator and the upstream start with a larger heap (see
 * LOAD_V8_FLAGS); the floor and the gateway run with the V8 flags of
 * `deno task start` (SERVER_V8_FLAGS), and the gateway on an embedded KV
 * store in a file, as `deno task start` runs it. A seed child writes the
 * tenants and keys into that file first, so the gateway starts on a store
 * that already holds them, as after a restart (its heap holds nothing of
 * the seeding).
 * Two gateways take turns with the others: `gateway` as `deno task start`
 * runs it (an instance identity with its liveness record, and the usage
 * journal in its data directory) and `gateway, no journal` (neither, as
 * before usage survived a crash), each on its own copy of the seeded
 * store: the difference is what crash safety costs.
 * `--scenario 1|10k` runs one; `BENCH_PROF=gateway` writes the gateway's
 * V8 tick log (isolate-*.log, read with `node --prof-process`).
 */
import { parseArgs } from "node:util";
import { testConfig } from "../config.ts";
import type { Fleet, NodeView } from "../fleet/types.ts";
import { createApiKey } from "../store/api_keys.ts";
import { setTenantLimits } from "../store/limits.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { silentLogger } from "../lib/log.ts";
import { createGateway } from "../gateway/mod.ts";
import { localInstanceId } from "../store/instances.ts";
import {
  type Child,
  f2,
  fixedRate,
  LATENCY_ROUNDS,
  listen,
  once,
  rounds,
  SBODY,
  serveFloor,
  serveUpstream,
  spawn,
  STEADY_S,
  type Target,
  throughput,
} from "./_load.ts";

/** This script (children run it in another role). */
const SELF = new URL(import.meta.url).pathname;

/** The gateway without crash safety (no instance record, no usage journal): the baseline of its cost. */
const NO_JOURNAL = "gateway, no journal";

const { values, positionals } = parseArgs({
  args: Deno.args,
  allowPositionals: true,
  options: { scenario: { type: "string" } },
});
/** A child's role (`upstream`, `floor`, `gateway` + its arguments), else the main run. */
const role = positionals[0] ?? "main";
/** `--scenario 1` or `--scenario 10k` runs one of the two (default both). */
const only = values.scenario ?? null;
async function scenario(label: string, targets: Target[]) {
  console.log(`\n## ${label}`);
  // Warm-up: every key once (steady state: keys are verified once a minute).
  for (const t of targets) {
    for (let i = 0; i < Math.max(200, t.keys.length); i++) await once(t);
  }
  // Then a steady state: every key busy for 15 s (rates known, leases
  // sized from them, JIT warm), as in a gateway that has been up for minutes.
  for (const t of targets) await throughput(t, 15, 32);
  const tp = await rounds(targets, (t) => throughput(t, 2, 32));
  // Then 15 s at 500 req/s each before the fixed-rate rounds, which measure
  // a steady 500 req/s: what the gateway defers from the max-load rounds
  // (their usage records, written within seconds, ~2.5 µs a record; their
  // leases, sized for max load, settling) lands here, and its 1,000 keys,
  // idle while the other targets ran (their leases ended meanwhile), each
  // commit once and get leases for this pace.
  for (const t of targets) await fixedRate(t, 500, STEADY_S);
  const fr = await rounds(targets, (t) => fixedRate(t, 500, 3), LATENCY_ROUNDS);
  const st = await rounds(targets, (t) => fixedRate(t, 200, 2, SBODY));
  const d = "direct";
  const fl = "floor";
  const g = "gateway";
  console.log(
    "| target | max req/s | CPU µs/req (max load) | CPU µs/req (500/s) | p50 ms | p99 ms | stream TTFB p50 ms | failed |",
  );
  console.log("| --- | --- | --- | --- | --- | --- | --- | --- |");
  for (const t of targets) {
    const n = t.name;
    console.log(
      `| ${n} | ${tp[n]!.rps.toFixed(0)} | ${tp[n]!.cpuPerReqUs.toFixed(0)} | ${
        fr[n]!.cpuPerReqUs.toFixed(0)
      } | ${f2(fr[n]!.p50)} | ${f2(fr[n]!.p99)} | ${f2(st[n]!.ttfb50)} | ${
        tp[n]!.failed
      } |`,
    );
  }
  const added = (a: string, k: "p50" | "p99" | "ttfb50") =>
    fr[a]![k] - fr[d]![k];
  const addedT = (a: string) => st[a]!.ttfb50 - st[d]!.ttfb50;
  console.log(
    `gateway CPU/req vs floor: ${
      f2(tp[g]!.cpuPerReqUs / tp[fl]!.cpuPerReqUs)
    }× at max load, ${
      f2(fr[g]!.cpuPerReqUs / fr[fl]!.cpuPerReqUs)
    }× at 500 req/s (target ≤ 2×)`,
  );
  console.log(
    `gateway CPU/req vs direct (upstream's own CPU/req): ${
      f2(tp[g]!.cpuPerReqUs / tp[d]!.cpuPerReqUs)
    }×`,
  );
  console.log(
    `max throughput: gateway/direct ${
      f2(tp[g]!.rps / tp[d]!.rps)
    }, gateway/floor ${f2(tp[g]!.rps / tp[fl]!.rps)}`,
  );
  console.log(
    `added at 500 req/s: p50 ${f2(added(g, "p50"))} ms (floor ${
      f2(added(fl, "p50"))
    } ms; target ≤ 1), p99 ${f2(added(g, "p99"))} ms (floor ${
      f2(added(fl, "p99"))
    } ms; target ≤ 3)`,
  );
  console.log(
    `latency ratio at 500 req/s: p50 gateway/direct ${
      f2(fr[g]!.p50 / fr[d]!.p50)
    }, gateway/floor ${f2(fr[g]!.p50 / fr[fl]!.p50)}`,
  );
  console.log(
    `added stream TTFB p50: ${f2(addedT(g))} ms (floor ${
      f2(addedT(fl))
    } ms; target ≤ 1.5); ratio gateway/direct ${
      f2(st[g]!.ttfb50 / st[d]!.ttfb50)
    }, gateway/floor ${f2(st[g]!.ttfb50 / st[fl]!.ttfb50)}`,
  );
  const b = NO_JOURNAL;
  if (tp[b]) {
    console.log(
      `crash safety's cost (usage journal, instance record): CPU/req gateway ÷ ${b} ${
        f2(tp[g]!.cpuPerReqUs / tp[b]!.cpuPerReqUs)
      }× at max load, ${
        f2(fr[g]!.cpuPerReqUs / fr[b]!.cpuPerReqUs)
      }× at 500 req/s; p50 at 500 req/s ${f2(fr[g]!.p50)} vs ${
        f2(fr[b]!.p50)
      } ms`,
    );
  }
}

/**
 * Runs one scenario on children of its own: an upstream, the floor and two
 * gateways with `tenants` × `keysPerTenant` keys, all started fresh, so the
 * targets compared have the same history and a scenario's numbers do not
 * depend on what ran before it.
 */
async function fresh(
  label: string,
  tenants: number,
  keysPerTenant: number,
  note?: (seedMs: number) => string,
) {
  const up = await spawn(SELF, "upstream");
  const children = [up];
  const kvDir = await Deno.makeTempDir({ prefix: "orchard-bench-" });
  try {
    const floor = await spawn(SELF, "floor", String(up.info.port));
    children.push(floor);
    const t0 = performance.now();
    const seed = await spawn(
      SELF,
      "seed",
      String(tenants),
      String(keysPerTenant),
      kvDir,
    );
    await seed.proc.status;
    const bareDir = `${kvDir}/bare`;
    await Deno.mkdir(bareDir);
    await Deno.copyFile(`${kvDir}/orchard.kv`, `${bareDir}/orchard.kv`);
    const gw = await spawn(
      SELF,
      "gateway",
      String(up.info.port),
      kvDir,
      "deployed",
    );
    children.push(gw);
    const bare = await spawn(
      SELF,
      "gateway",
      String(up.info.port),
      bareDir,
      "bare",
    );
    children.push(bare);
    if (note) console.log(`\n${note(performance.now() - t0)}`);
    const target = (name: string, c: Child, keys: string[] = []): Target => ({
      name,
      url: `http://127.0.0.1:${c.info.port}`,
      pids: [c.pid],
      keys,
    });
    await scenario(label, [
      target("direct", up),
      target("floor", floor),
      target("gateway", gw, seed.info.keys!),
      target(NO_JOURNAL, bare, seed.info.keys!),
    ]);
  } finally {
    for (const c of children) {
      try {
        c.proc.kill();
        await c.proc.status;
      } catch { /* already gone */ }
    }
    await Deno.remove(kvDir, { recursive: true });
  }
}

async function main() {
  const deadline = setTimeout(() => {
    console.error("bench:gateway: giving up after 12 minutes");
    Deno.exit(1);
  }, 720_000);
  try {
    console.log(
      `# bench:gateway (Deno ${Deno.version.deno}, ${navigator.hardwareConcurrency} cores)`,
    );
    console.log(
      "CPU per request is the target process's own CPU (/proc utime+stime); latencies measured by this client process. Each scenario starts its own upstream, floor and gateway.",
    );
    if (only !== "10k") {
      await fresh(
        "1 tenant, 1 key (auth, exact limits on tenant and key, metering)",
        1,
        1,
      );
    }
    if (only === "1") return;
    await fresh(
      "1,000 tenants, 10,000 keys",
      1000,
      10,
      (ms) =>
        `(seeded 1,000 tenants and 10,000 keys in ${
          (ms / 1000).toFixed(1)
        } s; load rotates over 1,000 of the keys)`,
    );
  } finally {
    clearTimeout(deadline);
  }
}

if (role === "upstream") {
  console.log(JSON.stringify({ port: serveUpstream() }));
} else if (role === "floor") {
  console.log(
    JSON.stringify({ port: serveFloor(`http://127.0.0.1:${Deno.args[1]}`) }),
  );
} else if (role === "seed") {
  // Writes the tenants and keys into the KV file the gateway will open,
  // and prints a sample of the keys: the gateway then starts on a store
  // that already holds them, as after a restart, and its heap holds none of
  // the seeding's garbage or caches.
  const tenants = Number(Deno.args[1]);
  const keysPerTenant = Number(Deno.args[2]);
  const kv = await Deno.openKv(`${Deno.args[3]}/orchard.kv`);
  const store = await createStore(kv);
  const keys: string[] = [];
  for (let t = 0; t < tenants; t++) {
    const tenant = await createTenant(store, SYSTEM, { name: `Tenant ${t}` });
    await setTenantLimits(store, SYSTEM, tenant.id, {
      rpm: 1_000_000_000,
      tpm: 1_000_000_000_000,
      concurrency: 100_000,
      tokensPerDay: 1_000_000_000_000,
      tokensPerMonth: 1_000_000_000_000,
    });
    for (let i = 0; i < keysPerTenant; i++) {
      keys.push(
        (await createApiKey(store, SYSTEM, tenant.id, {
          name: `k${i}`,
          limits: { rpm: 1_000_000_000 },
        })).key,
      );
    }
  }
  kv.close();
  // Only a sample of keys is handed to the load generator (all are in KV).
  const sample = keys.length <= 1000
    ? keys
    : Array.from({ length: 1000 }, (_, i) => keys[(i * 7919) % keys.length]!);
  console.log(JSON.stringify({ port: 0, keys: sample }));
} else if (role === "gateway") {
  const upstream = `http://127.0.0.1:${Deno.args[1]}`;
  // The embedded store in a file, as `deno task start` keeps it (commits
  // reach the disk; an in-memory store would leave that out), seeded by
  // the seed child.
  const kv = await Deno.openKv(`${Deno.args[2]}/orchard.kv`);
  const store = await createStore(kv);
  const node: NodeView = {
    id: "bench-node",
    name: "bench",
    url: upstream,
    engine: "openai",
    state: "healthy",
    models: [{ id: "bench", loaded: true, kind: "chat", contextLength: 4096 }],
    stats: {
      inFlight: 0,
      queued: 0,
      slots: 100_000,
      tokensPerSecond: 0,
      healthy: true,
    },
    lastHeartbeatAt: null,
    enrolledAt: new Date().toISOString(),
    dedicatedTo: null,
  };
  const target = { url: upstream, headers: {} };
  const fleet: Fleet = {
    candidates: (m) => (m === "bench" ? [node] : []),
    servedModels: () => [{
      id: "bench",
      aliases: [],
      kind: "chat",
      contextLength: 4096,
      nodeIds: [node.id],
    }],
    resolveModel: (m) => m,
    knownModel: (m) => m === "bench",
    nodeTarget: () => Promise.resolve(target),
    fetchNode: (_id, path, init) => fetch(upstream + path, init),
  };
  const deployed = Deno.args[3] === "deployed";
  const gw = createGateway({ store, config: testConfig(), fleet }, {
    logger: silentLogger,
    ...(deployed
      ? {
        instanceId: await localInstanceId(Deno.args[2]!),
        usageJournalDir: `${Deno.args[2]}/usage-journal`,
      }
      : {}),
  });
  await gw.start();
  const port = listen(gw.app.fetch);
  console.log(JSON.stringify({ port }));
} else {
  await main();
}
