// deno-lint-ignore-file no-console -- benchmark entry point prints its results.
/**
 * `deno task bench:portal`: seeds 10,000 tenants and 100,000 keys in a KV
 * file, then prints the median time to render the tenants page, a tenant
 * page, and one key verification, against a bare KV `get` in the same run;
 * then 1,000,000 requests in one tenant's request log (the gateway's packed
 * usage values and their index) and usage with money for 1,000 tenants, and
 * the median time to render the request log (unfiltered, by key, by 5xx, by
 * key and 4xx, its second page) and the usage pages (all tenants, one).
 * Targets: page p50 < 30 ms; key verification < 3× a bare get.
 */
import { testConfig } from "../config.ts";
import { checksum6, hmac, randomBase62 } from "../lib/crypto.ts";
import { createOrchardApp } from "../server.tsx";
import type { ApiKey } from "../store/api_keys.ts";
import { verifyApiKey } from "../store/api_keys.ts";
import { newId } from "../store/ids.ts";
import { k } from "../store/kv_keys.ts";
import { SYSTEM } from "../store/principal.ts";
import { login } from "../store/sessions.ts";
import { createStore } from "../store/store.ts";
import type { Tenant } from "../store/tenants.ts";
import { createUser } from "../store/users.ts";
import { csrfToken } from "../routes/_middleware.ts";
import { newIdAt } from "../store/ids.ts";
import { setPricing } from "../store/pricing.ts";
import { requestLogIndexSets } from "../store/request_log.ts";
import { RECORDS_PER_VALUE, type UsageRecord } from "../store/usage.ts";
import { UsageRollups } from "../store/usage_rollups.ts";
import { signHS256 } from "../lib/jwt.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");
const TENANTS = Number(Deno.env.get("BENCH_TENANTS") ?? 10_000);
const KEYS = Number(Deno.env.get("BENCH_KEYS") ?? 100_000);
const LOG_RECORDS = Number(Deno.env.get("BENCH_LOG_RECORDS") ?? 1_000_000);
const USAGE_TENANTS = Number(Deno.env.get("BENCH_USAGE_TENANTS") ?? 1_000);
const dir = await Deno.makeTempDir({ prefix: "orchard-bench-" });
const kv = await Deno.openKv(`${dir}/bench.kv`);
const store = await createStore(kv);

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}
function p(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(s.length * q))]!;
}

console.log(`seeding ${TENANTS} tenants and ${KEYS} keys into ${dir} …`);
const t0 = performance.now();
// Seeding writes the same records the service layer writes, in batches, so
// the benchmark spends its time measuring rather than seeding.
const tenants: Tenant[] = [];
let op = kv.atomic();
let n = 0;
const flush = async () => {
  if (n) await op.commit();
  op = kv.atomic();
  n = 0;
};
for (let i = 0; i < TENANTS; i++) {
  const now = new Date().toISOString();
  const t: Tenant = {
    id: newId(),
    name: `Tenant ${String(i).padStart(5, "0")}`,
    slug: `tenant-${i}`,
    status: "active",
    createdAt: now,
    updatedAt: now,
  };
  tenants.push(t);
  op.set(k.tenant(t.id), t).set(k.tenantBySlug(t.slug), t.id).set(
    k.tenantByName(t.name.toLowerCase(), t.id),
    t.id,
  );
  if ((n += 3) >= 900) await flush();
}
await flush();
const sampleKeys: string[] = [];
for (let i = 0; i < KEYS; i++) {
  const tenant = tenants[i % tenants.length]!;
  const id = newId();
  const secret = randomBase62(32);
  const body = `orch_${id}_${secret}`;
  const rec: ApiKey = {
    id,
    tenantId: tenant.id,
    name: `key ${i}`,
    prefix: `orch_${id.slice(0, 8)}`,
    last4: "xxxx",
    hash: await hmac(store.secrets.pepper, secret),
    scopes: ["chat", "embeddings", "models"],
    models: null,
    limits: null,
    expiresAt: null,
    revokedAt: null,
    createdAt: new Date().toISOString(),
  };
  op.set(k.apiKey(id), rec).set(k.tenantApiKey(tenant.id, id), id);
  if (i % 1000 === 0) sampleKeys.push(body + checksum6(body));
  if ((n += 2) >= 900) await flush();
}
await flush();
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
await csrfToken(store, session.sid);
const app = createOrchardApp({ store, config: testConfig() }, {
  CopyButton: "/x.js",
  ConfirmSubmit: "/y.js",
  FormGuard: "/f.js",
  UsageChart: "/u.js",
});

async function time(
  fn: () => Promise<unknown>,
  runs: number,
): Promise<number[]> {
  for (let i = 0; i < 5; i++) await fn();
  const out: number[] = [];
  for (let i = 0; i < runs; i++) {
    const s = performance.now();
    await fn();
    out.push(performance.now() - s);
  }
  return out;
}

const someTenant = tenants[1234 % tenants.length]!;
const bareGet = await time(
  () => kv.get(k.apiKey("01jzzzzzzzzzzzzzzzzzzzzzzz")),
  2000,
);
const bareGetHit = await time(async () => {
  const id = sampleKeys[Math.floor(Math.random() * sampleKeys.length)]!.slice(
    5,
    31,
  );
  await kv.get(k.apiKey(id));
}, 2000);
const verify = await time(async () => {
  const key = sampleKeys[Math.floor(Math.random() * sampleKeys.length)]!;
  const r = await verifyApiKey(store, key);
  if (!r.ok) throw new Error("verification failed");
}, 2000);
const tenantsPage = await time(async () => {
  const r = await app.request("/tenants", { headers: { cookie } });
  if (r.status !== 200) throw new Error(`tenants page: ${r.status}`);
  await r.text();
}, 200);
const tenantPage = await time(async () => {
  const r = await app.request(`/tenants/${someTenant.id}`, {
    headers: { cookie },
  });
  if (r.status !== 200) throw new Error(`tenant page: ${r.status}`);
  await r.text();
}, 200);

// The request log: LOG_RECORDS requests of one tenant over the last 13
// days, in the packed values (RECORDS_PER_VALUE each) and index entries the
// usage writer commits (store/usage_rollups.ts), written here directly.
const logTenant = tenants[7 % tenants.length]!;
const logKeys = Array.from({ length: 20 }, () => newId());
const t1 = performance.now();
{
  const span = 13 * 86_400_000;
  const start = Date.now() - span;
  let op = kv.atomic();
  let values = 0;
  for (let v = 0; v * RECORDS_PER_VALUE < LOG_RECORDS; v++) {
    const value: UsageRecord[] = [];
    for (let j = 0; j < RECORDS_PER_VALUE; j++) {
      const i = v * RECORDS_PER_VALUE + j;
      const at = start + Math.floor(i * span / LOG_RECORDS);
      const roll = i % 200;
      const status = roll === 0 ? 502 : roll < 5 ? 429 : 200;
      value.push({
        id: newIdAt(at),
        at: new Date(at).toISOString(),
        requestId: `req_${i}`,
        tenantId: logTenant.id,
        keyId: logKeys[i % logKeys.length]!,
        model: `model-${i % 4}`,
        nodeId: `node-${i % 8}`,
        endpoint: "chat",
        promptTokens: 100 + (i % 50),
        completionTokens: 20 + (i % 30),
        latencyMs: 300 + (i % 700),
        ttftMs: 50 + (i % 100),
        status,
        outcome: status === 200 ? "ok" : "error",
        ...(status === 200 ? {} : {
          errorCode: status === 429 ? "rate_limit_exceeded" : "upstream_error",
          errorType: status === 429 ? "rate_limit_error" : "server_error",
        }),
      });
    }
    op.set(k.usageRecord(logTenant.id, value[0]!.id), value);
    for (
      const [key, positions] of requestLogIndexSets(
        logTenant.id,
        value[0]!.id,
        value,
      )
    ) {
      op.set(key, positions);
    }
    if (++values >= 8) {
      await op.commit();
      op = kv.atomic();
      values = 0;
    }
  }
  await op.commit();
}
console.log(
  `seeded ${LOG_RECORDS} requests in a request log in ${
    ((performance.now() - t1) / 1000).toFixed(1)
  } s`,
);
// Usage with money: USAGE_TENANTS tenants' requests over 3 keys and 2
// priced models, through the usage writer (rollups, month and key × model).
await setPricing(store, SYSTEM, {
  currency: "EUR",
  models: [
    { model: "model-0", promptPerMillion: "1.5", completionPerMillion: "4" },
    { model: "model-1", promptPerMillion: "0.5", completionPerMillion: "1" },
  ],
  cluster: {
    hardwarePricePerNode: "4000",
    amortisationMonths: 36,
    idleWatts: 10,
    busyWatts: 120,
    tariffPerKwh: "0.3",
  },
});
{
  const acc = new UsageRollups();
  const now = Date.now();
  for (let t = 0; t < USAGE_TENANTS; t++) {
    const tenant = tenants[t]!;
    const records: UsageRecord[] = [];
    for (let i = 0; i < 12; i++) {
      const at = now - (i * 2 + 1) * 3_600_000;
      records.push({
        id: newIdAt(at),
        at: new Date(at).toISOString(),
        requestId: `u_${t}_${i}`,
        tenantId: tenant.id,
        keyId: `key-${t}-${i % 3}`,
        model: `model-${i % 2}`,
        nodeId: `node-${i % 4}`,
        endpoint: "chat",
        promptTokens: 1000 + i,
        completionTokens: 200 + i,
        latencyMs: 800,
        ttftMs: 100,
        status: 200,
        outcome: "ok",
      });
    }
    acc.add(records);
  }
  await acc.writeDue(store);
}
console.log(`seeded usage with money for ${USAGE_TENANTS} tenants`);

const get = (path: string) => async () => {
  const r = await app.request(path, { headers: { cookie } });
  if (r.status !== 200) throw new Error(`${path}: ${r.status}`);
  await r.text();
};
const logBase = `/tenants/${logTenant.id}/requests`;
const firstPage = await (await app.request(logBase, { headers: { cookie } }))
  .text();
const next = /href="([^"]*cursor=[^"]*)"/.exec(firstPage)?.[1]?.replaceAll(
  "&amp;",
  "&",
);
if (!next) throw new Error("the request log has no second page");
const logPages: [string, number[]][] = [
  ["request log", await time(get(logBase), 100)],
  ["request log, 2nd page", await time(get(next), 100)],
  ["request log by key", await time(get(`${logBase}?key=${logKeys[3]}`), 100)],
  ["request log, 5xx", await time(get(`${logBase}?status=5xx`), 100)],
  [
    "request log, key+4xx",
    await time(get(`${logBase}?key=${logKeys[3]}&status=4xx`), 100),
  ],
  [
    "request log, 1 day",
    await time(
      get(
        `${logBase}?from=${
          new Date(Date.now() - 5 * 86_400_000).toISOString().slice(0, 10)
        }&to=${
          new Date(Date.now() - 5 * 86_400_000).toISOString().slice(0, 10)
        }`,
      ),
      100,
    ),
  ],
  ["usage, 1000 tenants", await time(get("/usage?range=30d"), 50)],
  [
    "usage, one tenant",
    await time(get(`/usage?tenant=${tenants[1]!.id}&range=30d`), 100),
  ],
];

const fmt = (ms: number) => `${ms.toFixed(3)} ms`;
const base = median(bareGetHit);
console.log(
  `\nbaseline: bare KV get (hit) p50 ${fmt(base)}, (miss) p50 ${
    fmt(median(bareGet))
  }`,
);
console.log(
  `tenants page       p50 ${fmt(median(tenantsPage))}  p99 ${
    fmt(p(tenantsPage, 0.99))
  }  target < 30 ms  ${median(tenantsPage) < 30 ? "PASS" : "FAIL"}`,
);
console.log(
  `tenant page        p50 ${fmt(median(tenantPage))}  p99 ${
    fmt(p(tenantPage, 0.99))
  }  target < 30 ms  ${median(tenantPage) < 30 ? "PASS" : "FAIL"}`,
);
for (const [name, xs] of logPages) {
  console.log(
    `${name.padEnd(22)} p50 ${fmt(median(xs))}  p99 ${
      fmt(p(xs, 0.99))
    }  target < 30 ms  ${median(xs) < 30 ? "PASS" : "FAIL"}`,
  );
}
const ratio = median(verify) / base;
console.log(
  `key verification   p50 ${fmt(median(verify))}  = ${
    ratio.toFixed(2)
  }× bare get  target < 3×  ${ratio < 3 ? "PASS" : "FAIL"}`,
);
kv.close();
await Deno.remove(dir, { recursive: true });
