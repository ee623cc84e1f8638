// deno-lint-ignore-file no-console -- benchmark entry point prints its results.
/**
 * `deno task bench:dashboard`: seeds a month (720 hours) of per-hour usage
 * rollups for 1,000 tenants (as `writeUsage` writes them: one packed value
 * per group with requests, tokens, latency sum and histogram bucket per
 * tenant per hour, plus the cluster-wide series and the month index) into a
 * KV file, then prints the
 * median time to render the usage page (one tenant, and the whole cluster
 * with top tenants) and to answer the usage API, each against a bare KV
 * list of the same rollup keys in the same run. Then it seeds 4 weeks of
 * capacity rollups for 20 nodes (BENCH_NODES) and prints the capacity
 * page's server time against a bare list of its keys, and its time in
 * Chromium: from navigation start until every heatmap and chart has drawn.
 * Target: < 200 ms each.
 */
import { testConfig } from "../config.ts";
import { buildIslands } from "../lib/islands_build.ts";
import { launchBrowser } from "../tests/fixtures/browser.ts";
import { seedCapacity } from "../tests/fixtures/capacity_seed.ts";
import { signHS256 } from "../lib/jwt.ts";
import { createOrchardApp } from "../server.tsx";
import { createAdminToken } from "../store/admin_tokens.ts";
import { k } from "../store/kv_keys.ts";
import { SYSTEM } from "../store/principal.ts";
import { login } from "../store/sessions.ts";
import { createStore } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { bucketOf, timeBucket } from "../store/usage.ts";
import { createUser } from "../store/users.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");
const TENANTS = Number(Deno.env.get("BENCH_TENANTS") ?? 1000);
const NODES = Number(Deno.env.get("BENCH_NODES") ?? 20);
const HOURS = 720;
const RUNS = 9;
const TARGET_MS = 200;
const dir = await Deno.makeTempDir({ prefix: "orchard-bench-dash-" });
const kv = await Deno.openKv(`${dir}/bench.kv`);
const store = await createStore(kv);

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

async function time(fn: () => Promise<unknown>): Promise<number> {
  await fn(); // warm-up
  const out: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    const t = performance.now();
    await fn();
    out.push(performance.now() - t);
  }
  return median(out);
}

console.log(
  `seeding ${HOURS} hours of rollups for ${TENANTS} tenants into ${dir} …`,
);
const t0 = performance.now();
const tenantIds: string[] = [];
for (let i = 0; i < TENANTS; i++) {
  tenantIds.push(
    (await createTenant(store, SYSTEM, {
      name: `Tenant ${String(i).padStart(4, "0")}`,
      slug: `tenant-${i}`,
    })).id,
  );
}
const now = Date.now();
const end = now - (now % 3_600_000);
const month = new Date(now).toISOString().slice(0, 7);
let op = kv.atomic();
let n = 0;
const add = async (key: Deno.KvKey, v: Record<string, number>) => {
  op.set(key, v);
  if (++n >= 1000) {
    await op.commit();
    op = kv.atomic();
    n = 0;
  }
};
// One packed value per rollup group, as the gateway's writer stores it.
const all = new Map<string, Record<string, number>>();
for (let ti = 0; ti < TENANTS; ti++) {
  const id = tenantIds[ti]!;
  let tokens = 0, requests = 0;
  for (let h = 0; h < HOURS; h++) {
    const b = timeBucket("hour", end - h * 3_600_000);
    const req = 1 + ((ti * 7 + h) % 40);
    const latency = 200 + ((ti + h) % 50) * 40;
    const fields: Record<string, number> = {
      requests: req,
      prompt: req * 300,
      completion: req * 120,
      latency_sum: req * latency,
      [`lat_${bucketOf(latency)}`]: req,
    };
    await add(k.usageRollup("hour", "tenant", id, b, "seed"), fields);
    const sum = all.get(b) ?? {};
    for (const [f, v] of Object.entries(fields)) sum[f] = (sum[f] ?? 0) + v;
    all.set(b, sum);
    tokens += req * 420;
    requests += req;
  }
  await add(k.usageMonth(month, "tenant", id, "seed"), { requests, tokens });
}
for (const [b, fields] of all) {
  await add(k.usageRollup("hour", "all", "*", b, "seed"), fields);
}
await op.commit();
await seedCapacity(store, NODES, now);
console.log(`seeded in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

await createUser(store, SYSTEM, {
  email: "bench@orchard.test",
  password: "bench password 123",
  role: "platform_admin",
  tenantId: null,
});
const { session } = await login(
  store,
  "bench@orchard.test",
  "bench password 123",
  null,
);
const jwt = await signHS256(store.secrets.sessionKey, { sid: session.sid }, {
  iss: "orchard-portal",
  aud: "orchard-portal",
  sub: session.userId,
  ttlSeconds: 3600,
});
const cookie = `orchard_session=${jwt}`;
const token = (await createAdminToken(store, SYSTEM, {
  name: "bench",
  role: "platform_admin",
  tenantId: null,
})).token;
// real island bundles: the capacity page is timed in Chromium too
const app = createOrchardApp(
  { store, config: testConfig() },
  await buildIslands(),
);

const tenant = tenantIds[Math.floor(TENANTS / 2)]!;
const from = new Date(end - (HOURS - 1) * 3_600_000).toISOString();
const to = new Date(now).toISOString();
const range = `from=${from}&to=${to}&granularity=hour`;

async function fetchOk(path: string, headers: Record<string, string>) {
  const res = await app.request(path, { headers });
  const body = await res.text();
  if (res.status !== 200) throw new Error(`${path}: ${res.status} ${body}`);
  return body;
}
async function bareList(
  prefix: readonly Deno.KvKeyPart[],
  startBucket?: string,
) {
  let c = 0;
  const sel = startBucket
    ? { start: [...prefix, startBucket], end: [...prefix, "\uffff"] }
    : { prefix: [...prefix] };
  for await (const _ of kv.list(sel, { batchSize: 1000 })) c++;
  return c;
}

const firstBucket = timeBucket("hour", Date.parse(from));
const tenantKeys = await bareList(
  k.usageRollupPrefix("hour", "tenant", tenant),
  firstBucket,
);
const clusterKeys = await bareList(
  k.usageRollupPrefix("hour", "all", "*"),
  firstBucket,
) + await bareList(k.usageMonthPrefix(month, "tenant"));
const page = await fetchOk(`/usage?tenant=${tenant}&${range}`, { cookie });
if (!page.includes("chart-tokens")) throw new Error("page has no chart");

const rows: [string, number, number, number][] = [];
const baseTenant = await time(() =>
  bareList(k.usageRollupPrefix("hour", "tenant", tenant), firstBucket)
);
const baseCluster = await time(async () => {
  await bareList(k.usageRollupPrefix("hour", "all", "*"), firstBucket);
  await bareList(k.usageMonthPrefix(month, "tenant"));
});
rows.push([
  "usage page, one tenant, 720 h",
  await time(() => fetchOk(`/usage?tenant=${tenant}&${range}`, { cookie })),
  baseTenant,
  tenantKeys,
]);
rows.push([
  "usage page, cluster + top tenants",
  await time(() => fetchOk(`/usage?${range}`, { cookie })),
  baseCluster,
  clusterKeys,
]);
rows.push([
  "usage API, one tenant, 720 h",
  await time(() =>
    fetchOk(`/api/admin/v1/usage?tenant=${tenant}&${range}`, {
      authorization: `Bearer ${token}`,
    })
  ),
  baseTenant,
  tenantKeys,
]);

const capacityKeys = await bareList(k.usageCapacityPrefix());
const baseCapacity = await time(() => bareList(k.usageCapacityPrefix()));
rows.push([
  `capacity page, ${NODES} nodes × 4 weeks`,
  await time(() => fetchOk("/capacity", { cookie })),
  baseCapacity,
  capacityKeys,
]);
const chromium = await chromiumRender([
  ["/capacity", 4],
  [`/usage?${range}`, 3],
]);

const [load1] = Deno.loadavg();
console.log(
  `\nload average ${
    load1!.toFixed(1)
  } on ${navigator.hardwareConcurrency} cores (a busy host slows every row, Chromium's most)`,
);
console.log(
  `\n${TENANTS} tenants × ${HOURS} hours, ${NODES} nodes × 4 weeks; median of ${RUNS} runs; baseline = bare KV list of the same rollup keys\n`,
);
let ok = true;
for (const [name, ms, base, keys] of rows) {
  const pass = ms < TARGET_MS;
  ok &&= pass;
  console.log(
    `${name.padEnd(36)} ${ms.toFixed(1).padStart(7)} ms  baseline ${
      base.toFixed(1).padStart(6)
    } ms (${keys} keys)  ratio ${(ms / base).toFixed(2)}×  ${
      pass ? "✓" : "✗"
    } < ${TARGET_MS} ms`,
  );
}
{
  const [capacity, usage] = chromium as [number, number];
  const pass = capacity < TARGET_MS;
  ok &&= pass;
  console.log(
    `${"capacity page in Chromium, drawn".padEnd(36)} ${
      capacity.toFixed(1).padStart(7)
    } ms  baseline ${
      usage.toFixed(1).padStart(6)
    } ms (the usage page's 3 charts)  ratio ${
      (capacity / usage).toFixed(2)
    }×  ${pass ? "✓" : "✗"} < ${TARGET_MS} ms`,
  );
  console.log(
    "  (Chromium: navigation start to every heatmap and chart drawn, by the page's clock)",
  );
}
kv.close();
await Deno.remove(dir, { recursive: true });
if (!ok) Deno.exit(1);

/**
 * Pages in Chromium, taking turns: for each, the median over RUNS loads of
 * the time from navigation start until its `charts` canvases have drawn
 * (the page's own clock, read when the last canvas says it drew).
 */
async function chromiumRender(
  pages: [path: string, charts: number][],
): Promise<number[]> {
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: () => {} },
    (req) => app.fetch(req),
  );
  const base = `http://127.0.0.1:${server.addr.port}`;
  const browser = await launchBrowser();
  try {
    const context = await browser.newContext({
      viewport: { width: 1366, height: 900 },
    });
    await context.addCookies([{
      name: "orchard_session",
      value: jwt,
      url: base,
    }]);
    const page = await context.newPage();
    const load = async ([path, charts]: [string, number]) => {
      await page.goto(`${base}${path}`);
      return await (await page.waitForFunction(
        (n) => {
          const drawn = document.querySelectorAll(
            "canvas[data-cells], canvas[data-points]",
          ).length;
          return drawn === document.querySelectorAll("canvas").length &&
            drawn >= n && performance.now();
        },
        charts,
        { polling: "raf", timeout: 30_000 },
      )).jsonValue() as number;
    };
    // warm-up: scripts cached, as a returning admin has them
    for (const p of pages) await load(p);
    const out: number[][] = pages.map(() => []);
    for (let i = 0; i < RUNS; i++) {
      for (const [j, p] of pages.entries()) out[j]!.push(await load(p));
    }
    return out.map(median);
  } finally {
    await browser.close();
    await server.shutdown();
  }
}
