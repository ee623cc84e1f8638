/** Shared set-up for tests: a real app over an in-memory KV. */
import { testConfig } from "../config.ts";
import type { Config } from "../config.ts";
import type { GatewayOptions } from "../gateway/mod.ts";
import type { IslandManifest } from "../lib/islands_build.ts";
import { log } from "../lib/log.ts";
import { createOrchard } from "../orchard.ts";
import type { OrchardExtras } from "../server.tsx";
import { createAdminToken } from "../store/admin_tokens.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore, type Store } from "../store/store.ts";
import { createTenant, type Tenant } from "../store/tenants.ts";
import { createUser } from "../store/users.ts";
import { setPricing } from "../store/pricing.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");
log.reload();

/** Island scripts as URLs (pages render tags for them; tests that run JS build them for real). */
export const TEST_ISLANDS: IslandManifest = {
  CopyButton: "/static/build/CopyButton-test.js",
  ConfirmSubmit: "/static/build/ConfirmSubmit-test.js",
  FormGuard: "/static/build/FormGuard-test.js",
  UsageChart: "/static/build/UsageChart-test.js",
  CapacityHeatmap: "/static/build/CapacityHeatmap-test.js",
  NodesLive: "/static/build/NodesLive-test.js",
  MeshRunner: "/static/build/MeshRunner-test.js",
  Playground: "/static/build/Playground-test.js",
};

/** A running test world: store, app and credentials for each role. */
export interface TestWorld {
  kv: Deno.Kv;
  store: Store;
  app: ReturnType<typeof createOrchard>["app"];
  orchard: ReturnType<typeof createOrchard>;
  config: Config;
  tokens: { platform: string; adminA: string; viewerA: string };
  tenantA: Tenant;
  tenantB: Tenant;
  password: string;
  close(): Promise<void>;
}

/** Builds a world with two tenants and an admin token per role. */
export async function createWorld(
  opts: {
    extras?: OrchardExtras;
    islands?: IslandManifest;
    config?: Partial<Config>;
    gateway?: GatewayOptions;
    fleetRefreshMs?: number;
  } = {},
): Promise<TestWorld> {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const config = testConfig(opts.config);
  const orchard = createOrchard({
    store,
    config,
    islands: opts.islands ?? TEST_ISLANDS,
    gateway: opts.gateway,
    fleetRefreshMs: opts.fleetRefreshMs,
    portalParts: opts.extras?.portalParts,
    adminParts: opts.extras?.adminParts,
  });
  const app = orchard.app;
  const tenantA = await createTenant(store, SYSTEM, {
    name: "Acme",
    slug: "acme",
  });
  const tenantB = await createTenant(store, SYSTEM, {
    name: "Globex",
    slug: "globex",
  });
  const platform = (await createAdminToken(store, SYSTEM, {
    name: "ci",
    role: "platform_admin",
    tenantId: null,
  })).token;
  const adminA = (await createAdminToken(store, SYSTEM, {
    name: "a-admin",
    role: "tenant_admin",
    tenantId: tenantA.id,
  })).token;
  const viewerA = (await createAdminToken(store, SYSTEM, {
    name: "a-viewer",
    role: "tenant_viewer",
    tenantId: tenantA.id,
  })).token;
  const password = "correct horse battery staple";
  await createUser(store, SYSTEM, {
    email: "root@example.com",
    password,
    role: "platform_admin",
    tenantId: null,
  });
  await createUser(store, SYSTEM, {
    email: "a-admin@example.com",
    password,
    role: "tenant_admin",
    tenantId: tenantA.id,
  });
  await createUser(store, SYSTEM, {
    email: "a-viewer@example.com",
    password,
    role: "tenant_viewer",
    tenantId: tenantA.id,
  });
  return {
    kv,
    store,
    app,
    orchard,
    config,
    tokens: { platform, adminA, viewerA },
    tenantA,
    tenantB,
    password,
    close: async () => {
      await orchard.close();
      kv.close();
    },
  };
}

/** Calls the app's admin API with a bearer token. */
export function api(
  w: TestWorld,
  method: string,
  path: string,
  token: string | null,
  body?: unknown,
): Promise<Response> {
  const headers: Record<string, string> = {};
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  return Promise.resolve(w.app.request(`/api/admin/v1${path}`, {
    method,
    headers,
    body: body === undefined
      ? undefined
      : typeof body === "string"
      ? body
      : JSON.stringify(body),
  }));
}

/** Signs in through the portal form and returns the cookie and CSRF token. */
export async function portalLogin(
  w: TestWorld,
  email: string,
): Promise<{ cookie: string; csrf: string }> {
  const res = await w.app.request("/login", {
    method: "POST",
    headers: {
      "content-type": "application/x-www-form-urlencoded",
      origin: "http://localhost",
      host: "localhost",
    },
    body: new URLSearchParams({ email, password: w.password }),
  });
  if (res.status !== 303) throw new Error(`login failed: ${res.status}`);
  const cookie = res.headers.get("set-cookie")!.split(";")[0]!;
  const page = await w.app.request("/audit", { headers: { cookie } });
  const html = await page.text();
  const csrf = /name="_csrf" value="([^"]+)"/.exec(html)?.[1] ?? "";
  return { cookie, csrf };
}

/**
 * Prices `tiny-chat` at 1000 EUR per 1M prompt tokens and 2000 per 1M
 * completion tokens (1000 and 2000 micro-units a token), the cluster free:
 * the money tests' one price list.
 */
export async function priceTinyChat(store: Store): Promise<void> {
  await setPricing(store, SYSTEM, {
    currency: "EUR",
    models: [{
      model: "tiny-chat",
      promptPerMillion: "1000",
      completionPerMillion: "2000",
    }],
    cluster: {
      hardwarePricePerNode: "0",
      amortisationMonths: 36,
      idleWatts: 0,
      busyWatts: 0,
      tariffPerKwh: "0",
    },
  });
}
