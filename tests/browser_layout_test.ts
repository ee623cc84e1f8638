/**
 * Every portal page in Chromium at a laptop (1366 × 900) and a phone
 * (390 × 844) width, as the platform admin and as a tenant admin, with
 * realistic data: long tenant, key, node, model and user names, numbers in
 * the billions, a busy audit log. On each page:
 *
 * - no horizontal page scroll (`scrollWidth <= innerWidth`);
 * - at 1366 px no table hides columns behind its own scroll bar;
 * - every number cell (`.num`) is on one line;
 * - every truncated name (`.trunc`) that is cut off has a `title` tooltip.
 *
 * Full-page screenshots go to test-artifacts/screenshots/<page>-<width>.png.
 */
import assert from "node:assert/strict";
import type { Page } from "playwright-core";
import { buildIslands } from "../lib/islands_build.ts";
import { createApiKey } from "../store/api_keys.ts";
import { setTenantBudget } from "../store/budgets.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import { setTenantLimits } from "../store/limits.ts";
import { enrollNode, recordHeartbeat } from "../store/nodes.ts";
import { setPricing } from "../store/pricing.ts";
import { SYSTEM } from "../store/principal.ts";
import { createTenant } from "../store/tenants.ts";
import type { UsageRecord } from "../store/usage.ts";
import { writeUsage } from "../store/usage_rollups.ts";
import { createInvite } from "../store/users.ts";
import { monthOf } from "../store/usage_month.ts";
import { ARTIFACTS, launchBrowser } from "./_browser.ts";
import { createWorld, type TestWorld } from "./_helpers.ts";

const SHOTS = `${ARTIFACTS}screenshots/`;
const WIDTHS = [{ width: 1366, height: 900 }, { width: 390, height: 844 }];
const LONG_TENANT =
  "Consolidated Interplanetary Logistics and Robotics Manufacturing Holdings GmbH & Co. KG";
const LONG_KEY =
  "production-eu-central-frankfurt-primary-inference-gateway-key-2026-rotation-b";
const LONG_NODE =
  "mac-studio-m3-ultra-rack07-slot3-frankfurt-datacenter-eu-central-1";
const LONG_MODEL = "mlx-community/Qwen2.5-Coder-32B-Instruct-4bit-dwq-v2";

async function seed(w: TestWorld) {
  const big = await createTenant(w.store, SYSTEM, {
    name: LONG_TENANT,
    slug: "consolidated-interplanetary-logistics-robotics",
  });
  for (let i = 0; i < 8; i++) {
    await createTenant(w.store, SYSTEM, { name: `Client ${i + 1} AG` });
  }
  const keys = [];
  for (
    const [t, name] of [[w.tenantA, LONG_KEY], [w.tenantA, "ci"], [
      big,
      LONG_KEY,
    ]] as const
  ) {
    keys.push(
      (await createApiKey(w.store, SYSTEM, t.id, {
        name,
        scopes: ["chat", "embeddings", "models"],
        models: [LONG_MODEL, "tiny"],
        limits: { rpm: 1_000_000, tokensPerDay: 9_000_000_000 },
      })).apiKey,
    );
  }
  await setTenantLimits(w.store, SYSTEM, w.tenantA.id, {
    rpm: 600_000,
    tpm: 90_000_000,
    concurrency: 512,
    tokensPerDay: 9_000_000_000,
    tokensPerMonth: 250_000_000_000,
  });
  await setPricing(w.store, SYSTEM, {
    currency: "EUR",
    models: [
      {
        model: LONG_MODEL,
        promptPerMillion: "0.85",
        completionPerMillion: "2.4",
      },
      { model: "tiny", promptPerMillion: "0.05", completionPerMillion: "0.1" },
    ],
    cluster: {
      hardwarePricePerNode: "14999",
      amortisationMonths: 36,
      idleWatts: 12,
      busyWatts: 270,
      tariffPerKwh: "0.3125",
    },
  });
  await setTenantBudget(w.store, SYSTEM, w.tenantA.id, "money", {
    amount: "250000",
    hard: true,
    thresholds: [50, 80, 100],
  });
  await createInvite(w.store, SYSTEM, {
    email:
      "a-very-long-mailbox-name.for-procurement@consolidated-logistics.example",
    role: "tenant_admin",
    tenantId: w.tenantA.id,
  });
  const nodeIds = [];
  for (const [i, name] of [LONG_NODE, "mac-mini-02"].entries()) {
    const { token } = await createJoinToken(w.store, SYSTEM, {});
    const n = await enrollNode(w.store, {
      token,
      publicJwk: { kty: "OKP", crv: "Ed25519", x: `n${i}`.padEnd(43, "A") },
      url: `http://10.20.30.${40 + i}:8100`,
      name,
      engine: "openai",
      models: [{ id: LONG_MODEL, loaded: true, kind: "chat", aliases: [] }],
      probe: {
        native: {
          os: { pretty_name: "macOS 26.2 (25C56)" },
          cpu: { brand: "Apple M3 Ultra" },
          gpu: {
            name: "Apple M3 Ultra",
            core_count: 80,
            recommended_max_working_set_bytes: 400 * 2 ** 30,
          },
          memory: { pressure: "normal" },
          thermal: { state: "nominal" },
          rdma: {
            available: true,
            devices: [{
              name: "rdma_en3",
              ports: [{ port: 1, usable: true }, {
                port: 2,
                usable: false,
                reason: "link down: no Thunderbolt 5 cable on this port",
              }],
            }],
          },
        },
      },
      version: "2026.11.3",
    });
    nodeIds.push(n.id);
    await recordHeartbeat(w.store, n.id, {
      intervalMs: 60_000,
      inFlight: 123,
      queued: 4567,
      slots: 256,
      tokensPerSecond: 123456.7,
      healthy: true,
      memory: { totalBytes: 512 * 2 ** 30, freeBytes: 123 * 2 ** 30 },
      models: [{
        id: LONG_MODEL,
        loaded: true,
        kind: "chat",
        aliases: [],
        // an Exo instance on both Macs and one no node runs on: the instances card
        instance: {
          id: `exo:${"9f1c2d3e-".repeat(4)}`,
          kind: "exo",
          serves: true,
          state: "ready",
          members: [0, 1, 2].map((j) => ({
            exoNodeId: `12D3KooW${"x".repeat(40)}${j}`,
            hostname: `mac-studio-with-a-very-long-friendly-name-${j}`,
            memoryBytes: 123.4 * 2 ** 30,
            transport: "rdma" as const,
            ...(j === i ? { self: true } : {}),
          })),
        },
      }],
      drainState: "none",
    });
  }
  await w.orchard.fleet.refresh();
  // Usage in the billions over this month, per tenant, key, model and node.
  const now = Date.now();
  const records: UsageRecord[] = [];
  for (let i = 0; i < 60; i++) {
    const key = keys[i % keys.length]!;
    records.push({
      id: crypto.randomUUID(),
      at: new Date(now - i * 3_600_000).toISOString(),
      requestId: `req-${i}`,
      tenantId: key.tenantId,
      keyId: key.id,
      model: i % 2 ? LONG_MODEL : "tiny",
      nodeId: nodeIds[i % 2]!,
      endpoint: "chat",
      promptTokens: 987_654_321,
      completionTokens: 123_456_789,
      latencyMs: 1_234_567,
      ttftMs: 4_321,
      status: i % 7 ? 200 : 429,
      outcome: i % 7 ? "ok" : "error",
    });
  }
  await writeUsage(w.store, records);
  return { big };
}

/** Layout facts of the page in the browser. */
interface Facts {
  scrollWidth: number;
  innerWidth: number;
  wideTables: string[];
  wrappedNumbers: string[];
  untitled: string[];
}

function facts(page: Page): Promise<Facts> {
  return page.evaluate(() => {
    const lines = (el: Element) => {
      const range = document.createRange();
      range.selectNodeContents(el);
      const tops = new Set<number>();
      for (const r of range.getClientRects()) {
        if (r.width > 0) tops.add(Math.round(r.top / 4));
      }
      return tops.size;
    };
    const short = (el: Element) =>
      `${el.tagName.toLowerCase()}.${el.className}: ${
        (el.textContent ?? "").trim().slice(0, 60)
      }`;
    return {
      scrollWidth: document.documentElement.scrollWidth,
      innerWidth: globalThis.innerWidth,
      wideTables: [...document.querySelectorAll(".table-wrap")]
        .filter((t) => t.scrollWidth > t.clientWidth + 1)
        .map((t) => short(t.querySelector("th") ?? t)),
      wrappedNumbers: [...document.querySelectorAll(".num")]
        .filter((el) => (el as HTMLElement).offsetParent !== null)
        .filter((el) => lines(el) > 1).map(short),
      untitled: [...document.querySelectorAll(".trunc")]
        .filter((el) => el.scrollWidth > el.clientWidth + 1)
        .filter((el) => !el.getAttribute("title"))
        .map(short),
    };
  });
}

Deno.test({
  name:
    "every portal page at 1366 px and 390 px: no page scroll sideways, numbers on one line, long names cut with a tooltip",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    let handler: ((req: Request) => Response | Promise<Response>) | null = null;
    const server = Deno.serve(
      { port: 0, hostname: "127.0.0.1", onListen: () => {} },
      (req) => handler!(req),
    );
    const base = `http://127.0.0.1:${server.addr.port}`;
    const w = await createWorld({
      islands: await buildIslands(),
      config: { publicUrl: base },
    });
    handler = (req) => w.app.fetch(req);
    const browser = await launchBrowser();
    await Deno.mkdir(SHOTS, { recursive: true });
    const problems: string[] = [];
    try {
      const { big } = await seed(w);
      const month = monthOf(Date.now());
      const A = w.tenantA.id;
      const tenantPages = [
        ["tenant", `/tenants/${A}`],
        ["budgets", `/tenants/${A}/budgets`],
        ["statement", `/tenants/${A}/statements/${month}`],
        ["usage", "/usage"],
        ["audit", "/audit"],
        ["users", "/users"],
        ["admin-tokens", "/admin-tokens"],
      ];
      const platformPages = [
        ["home", "/"],
        ["tenants", "/tenants"],
        ["tenant-long", `/tenants/${big.id}`],
        ...tenantPages,
        ["chargeback", `/chargeback/${month}`],
        ["alerts", "/alerts"],
        ["nodes", "/nodes"],
        ["mesh", "/mesh"],
        ["models", "/models"],
        ["playground", "/playground"],
        ["settings", "/settings"],
      ];
      for (
        const [who, email, pages] of [
          ["platform", "root@example.com", platformPages],
          ["tenant-admin", "a-admin@example.com", tenantPages],
        ] as const
      ) {
        for (const size of WIDTHS) {
          const ctx = await browser.newContext({ viewport: size });
          const page = await ctx.newPage();
          await page.goto(`${base}/login`);
          await page.fill("input[name=email]", email);
          await page.fill("input[name=password]", w.password);
          await Promise.all([
            page.waitForURL((u) => !u.pathname.startsWith("/login")),
            page.click("button[type=submit]"),
          ]);
          for (const [name, path] of pages) {
            const res = await page.goto(`${base}${path}`);
            assert.equal(res?.status(), 200, `${who} ${path}`);
            await page.waitForLoadState("load");
            const f = await facts(page);
            const at = `${who} ${path} at ${size.width}px`;
            if (f.scrollWidth > f.innerWidth) {
              problems.push(
                `${at}: page scrolls sideways (${f.scrollWidth} > ${f.innerWidth})`,
              );
            }
            if (size.width >= 1366 && f.wideTables.length) {
              problems.push(`${at}: table behind a scroll: ${f.wideTables}`);
            }
            for (const n of f.wrappedNumbers) {
              problems.push(`${at}: number wraps: ${n}`);
            }
            for (const n of f.untitled) {
              problems.push(`${at}: cut-off name without a title: ${n}`);
            }
            const file = who === "platform" ? name : `${who}-${name}`;
            await page.screenshot({
              path: `${SHOTS}${file}-${size.width}.png`,
              fullPage: true,
            });
          }
          await ctx.close();
        }
      }
      assert.deepEqual(problems, []);
    } finally {
      await browser.close();
      await w.close();
      await server.shutdown();
    }
  },
});
