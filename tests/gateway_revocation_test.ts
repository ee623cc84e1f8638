/**
 * Revocation at once: once the admin call that revokes a key, suspends its
 * tenant or lowers a limit below what was already used has answered, no
 * request sent after it succeeds. The admin API and the gateway share one
 * process and store, as orchard.ts composes them, over a fast scripted node.
 */
import assert from "node:assert/strict";
import { testConfig } from "../config.ts";
import {
  awayFromMinuteEdge,
  MODELS,
  scriptedUpstream,
  StaticFleet,
} from "../gateway/_testing.ts";
import { silentLogger } from "../lib/log.ts";
import { createGateway } from "../gateway/mod.ts";
import { createOrchardApp } from "../server.tsx";
import { createAdminToken } from "../store/admin_tokens.ts";
import { createApiKey } from "../store/api_keys.ts";
import { setTenantLimits } from "../store/limits.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore } from "../store/store.ts";
import { createTenant } from "../store/tenants.ts";
import { TEST_ISLANDS } from "./_helpers.ts";

/** Portal + admin API + gateway served on loopback, one tenant and key, a fast node. */
async function world(limits: { rpm?: number } = {}) {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const config = testConfig();
  const tenant = await createTenant(store, SYSTEM, { name: "Acme" });
  if (limits.rpm) await setTenantLimits(store, SYSTEM, tenant.id, limits);
  const { key, apiKey } = await createApiKey(store, SYSTEM, tenant.id, {
    name: "busy",
  });
  const admin = (await createAdminToken(store, SYSTEM, {
    name: "ops",
    role: "platform_admin",
    tenantId: null,
  })).token;
  const up = scriptedUpstream({ words: ["ok"] });
  const fleet = new StaticFleet();
  fleet.add("node-a", up.url, MODELS, 64);
  const gw = createGateway({ store, config, fleet }, { logger: silentLogger });
  const app = createOrchardApp({ store, config }, TEST_ISLANDS, {
    gateway: gw.app,
  });
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    app.fetch,
  );
  const url = `http://127.0.0.1:${server.addr.port}`;
  return {
    url,
    tenantId: tenant.id,
    keyId: apiKey.id,
    /** Calls the admin API as a platform admin. */
    admin: (method: string, path: string, body?: unknown) =>
      fetch(`${url}/api/admin/v1${path}`, {
        method,
        headers: {
          authorization: `Bearer ${admin}`,
          "content-type": "application/json",
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      }),
    /** One chat request with the key; resolves with its status. */
    async chat(): Promise<number> {
      const res = await fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${key}`,
          "content-type": "application/json",
        },
        body: JSON.stringify({
          model: "tiny-chat",
          messages: [{ role: "user", content: "Hi" }],
          max_tokens: 8,
        }),
      });
      await res.arrayBuffer();
      return res.status;
    },
    async close() {
      await server.shutdown();
      await gw.close();
      await up.close();
      kv.close();
    },
  };
}

type World = Awaited<ReturnType<typeof world>>;

/**
 * Four clients send back-to-back requests; once 20 have succeeded, `change`
 * runs. Returns the statuses of the requests sent before it returned and
 * of those sent after, over 700 ms after it (longer than the key cache's
 * epoch re-read, 500 ms, which alone used to end what the change started).
 */
async function sendWhile(
  w: World,
  change: () => Promise<Response>,
): Promise<{ before: number[]; after: number[] }> {
  const before: number[] = [];
  const after: number[] = [];
  let changed = false;
  let stop = false;
  let ok = 0;
  let warm = () => {};
  const warmed = new Promise<void>((r) => warm = r);
  const client = async () => {
    while (!stop) {
      const sentAfter = changed;
      const status = await w.chat();
      (sentAfter ? after : before).push(status);
      if (status === 200 && ++ok === 20) warm();
    }
  };
  const clients = Array.from({ length: 4 }, client);
  try {
    await warmed;
    const res = await change();
    assert.equal(res.status, 200, await res.text());
    changed = true;
    await new Promise((r) => setTimeout(r, 700));
  } finally {
    stop = true;
    await Promise.all(clients);
  }
  return { before, after };
}

/** Every request sent after the change got `status`, and there were such requests. */
function assertRefusedAfter(
  r: { before: number[]; after: number[] },
  status: number,
) {
  assert.ok(r.before.includes(200), "served before the change");
  assert.ok(r.after.length >= 8, `${r.after.length} requests after`);
  const served = r.after.filter((s) => s !== status);
  assert.deepEqual(served, [], `${served.length} of ${r.after.length}`);
}

Deno.test("no request sent after the admin API revoked its key succeeds", async () => {
  const w = await world();
  try {
    const r = await sendWhile(w, () => w.admin("DELETE", `/keys/${w.keyId}`));
    assertRefusedAfter(r, 401);
  } finally {
    await w.close();
  }
});

Deno.test("no request sent after the admin API suspended its tenant succeeds", async () => {
  const w = await world();
  try {
    const r = await sendWhile(
      w,
      () => w.admin("PATCH", `/tenants/${w.tenantId}`, { status: "suspended" }),
    );
    assertRefusedAfter(r, 403);
  } finally {
    await w.close();
  }
});

Deno.test("no request sent after the admin API lowered rpm below this minute's count succeeds", async () => {
  await awayFromMinuteEdge(10_000);
  const w = await world({ rpm: 100_000 });
  try {
    const r = await sendWhile(
      w,
      () => w.admin("PUT", `/tenants/${w.tenantId}/limits`, { rpm: 5 }),
    );
    assertRefusedAfter(r, 429);
  } finally {
    await w.close();
  }
});
