// deno-lint-ignore-file no-console -- benchmark entry point prints its results.
/**
 * `deno task bench:portal`: seeds 10,000 tenants and 100,000 keys in a KV
 * file, then prints the median time to render the tenants page, a tenant
 * page, and one key verification, against a bare KV `get` in the same run.
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
import { signHS256 } from "../lib/jwt.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");
const TENANTS = Number(Deno.env.get("BENCH_TENANTS") ?? 10_000);
const KEYS = Number(Deno.env.get("BENCH_KEYS") ?? 100_000);
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
const ratio = median(verify) / base;
console.log(
  `key verification   p50 ${fmt(median(verify))}  = ${
    ratio.toFixed(2)
  }× bare get  target < 3×  ${ratio < 3 ? "PASS" : "FAIL"}`,
);
kv.close();
await Deno.remove(dir, { recursive: true });
