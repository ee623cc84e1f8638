/**
 * Retention per tenant, the export of a tenant's records and deleting a
 * tenant, on a real app over an in-memory KV; the sweeper's clock is moved
 * instead of waiting days.
 */
import assert from "node:assert/strict";
import { createApiKey } from "../store/api_keys.ts";
import { listAudit } from "../store/audit.ts";
import { SYSTEM } from "../store/principal.ts";
import { loadResponse, saveResponse } from "../store/responses.ts";
import {
  DAY_MS,
  retentionMs,
  setTenantRetention,
  tenantRetention,
} from "../store/retention.ts";
import { sweepRetention } from "../store/retention_sweep.ts";
import { setTenantLimits } from "../store/limits.ts";
import { listUsageRecords, type UsageRecord } from "../store/usage.ts";
import { writeUsage } from "../store/usage_rollups.ts";
import { api, createWorld, type TestWorld } from "./_helpers.ts";

function usage(tenantId: string, keyId: string, id: string): UsageRecord {
  return {
    id,
    at: new Date().toISOString(),
    requestId: `req-${id}`,
    tenantId,
    keyId,
    model: "m",
    nodeId: null,
    endpoint: "chat",
    promptTokens: 3,
    completionTokens: 4,
    latencyMs: 5,
    ttftMs: 2,
    status: 200,
    outcome: "ok",
  };
}

/** Usage, audit entries, a stored response and a key for each tenant. */
async function seed(w: TestWorld) {
  const out: Record<"a" | "b", { keyId: string; key: string }> = {} as never;
  for (const [name, t] of [["a", w.tenantA], ["b", w.tenantB]] as const) {
    const { key, apiKey } = await createApiKey(w.store, SYSTEM, t.id, {
      name: `${name}-key`,
    });
    await setTenantLimits(w.store, SYSTEM, t.id, { rpm: 1000 });
    await writeUsage(w.store, [
      usage(t.id, apiKey.id, `${name}-u1`),
      usage(t.id, apiKey.id, `${name}-u2`),
    ]);
    await saveResponse(w.store, t.id, `resp_${name}`, {
      response: { id: `resp_${name}`, output_text: `${name} answer` },
      input: [{ role: "user", content: `${name} question` }],
    }, 30 * DAY_MS);
    out[name] = { keyId: apiKey.id, key };
  }
  return out;
}

const count = async (w: TestWorld, tenantId: string) => ({
  usage: (await listUsageRecords(w.store, tenantId, { limit: 100 })).items
    .length,
  audit: (await listAudit(w.kv, SYSTEM, { tenantId, limit: 100 })).items
    .length,
});

Deno.test("retention: each kind of a tenant's records is swept on its own schedule as the clock moves, another tenant's defaults untouched", async () => {
  const w = await createWorld();
  try {
    await seed(w);
    const a = w.tenantA.id, b = w.tenantB.id;
    await setTenantRetention(w.store, SYSTEM, a, {
      usage: 7,
      audit: 30,
      responses: 2,
    });
    assert.deepEqual(await tenantRetention(w.store, a), {
      usage: 7,
      audit: 30,
      responses: 2,
    });
    // what the writers use as expireIn now
    assert.equal(retentionMs(a, "usage"), 7 * DAY_MS);
    // a tenant this process has not read yet: the maximum, never too short
    assert.equal(retentionMs("never-read", "responses"), 365 * DAY_MS);
    await tenantRetention(w.store, b);
    assert.equal(retentionMs(b, "responses"), 30 * DAY_MS);
    const now = Date.now();
    const has = async (t: string, name: string) =>
      (await loadResponse(w.store, t, `resp_${name}`)) !== null;
    const before = { a: await count(w, a), b: await count(w, b) };
    assert.equal(before.a.usage, 2);
    assert.ok(before.a.audit >= 2);

    let r = await sweepRetention(w.store, now + 1 * DAY_MS);
    assert.deepEqual([r.usage, r.audit, r.responses], [0, 0, 0]);
    r = await sweepRetention(w.store, now + 3 * DAY_MS);
    assert.equal(r.responses, 1);
    assert.equal(await has(a, "a"), false);
    assert.equal(await has(b, "b"), true);
    r = await sweepRetention(w.store, now + 8 * DAY_MS);
    assert.equal(r.usage, 2);
    assert.equal((await count(w, a)).usage, 0);
    assert.equal((await count(w, b)).usage, 2);
    assert.equal((await count(w, a)).audit, before.a.audit);
    r = await sweepRetention(w.store, now + 31 * DAY_MS);
    assert.equal((await count(w, a)).audit, 0);
    assert.equal(await has(b, "b"), false); // B's default: 30 days
    assert.equal((await count(w, b)).usage, 2); // B's default: 90 days
    assert.equal((await count(w, b)).audit, before.b.audit);
    await sweepRetention(w.store, now + 91 * DAY_MS);
    assert.equal((await count(w, b)).usage, 0);
  } finally {
    await w.close();
  }
});

Deno.test("retention: a tenant's choice outside the provider's bounds is a 400 naming the bounds; the bounds are the platform's", async () => {
  const w = await createWorld();
  try {
    const a = w.tenantA.id;
    let res = await api(w, "PUT", `/tenants/${a}/retention`, w.tokens.adminA, {
      usage: 5000,
    });
    assert.equal(res.status, 400);
    assert.match(
      (await res.json()).error.message,
      /usage: must be between 1 and 730 days/,
    );
    res = await api(w, "PUT", `/tenants/${a}/retention`, w.tokens.adminA, {
      usage: 14,
    });
    assert.equal(res.status, 200);
    assert.equal((await res.json()).periods.usage, 14);
    const bounds = {
      defaults: { usage: 60, audit: 365, responses: 30 },
      min: { usage: 1, audit: 30, responses: 1 },
      max: { usage: 10, audit: 3650, responses: 365 },
      deletionGraceDays: 30,
    };
    res = await api(w, "PUT", "/settings/retention", w.tokens.platform, bounds);
    assert.equal(res.status, 400); // the default is above the maximum
    bounds.max.usage = 90;
    res = await api(w, "PUT", "/settings/retention", w.tokens.adminA, bounds);
    assert.equal(res.status, 403);
    res = await api(w, "PUT", "/settings/retention", w.tokens.platform, bounds);
    assert.equal(res.status, 200);
    // a lower maximum caps the tenant's period at once
    bounds.max.usage = 60;
    bounds.min.usage = 30;
    await api(w, "PUT", "/settings/retention", w.tokens.platform, bounds);
    res = await api(w, "GET", `/tenants/${a}/retention`, w.tokens.viewerA);
    assert.equal(res.status, 200);
    assert.equal((await res.json()).periods.usage, 30);
  } finally {
    await w.close();
  }
});

Deno.test("export: a tenant's JSON export holds exactly its records, never another tenant's, and no secret", async () => {
  const w = await createWorld();
  try {
    const s = await seed(w);
    const res = await api(
      w,
      "GET",
      `/tenants/${w.tenantA.id}/export`,
      w.tokens.adminA,
    );
    assert.equal(res.status, 200);
    assert.match(
      res.headers.get("content-disposition") ?? "",
      /attachment; filename="orchard-export-acme-\d{4}-\d\d-\d\d\.json"/,
    );
    const text = await res.text();
    const doc = JSON.parse(text);
    assert.equal(doc.schema, "orchard.tenant_export/1");
    assert.equal(doc.tenant.id, w.tenantA.id);
    assert.deepEqual(
      doc.usage.map((u: UsageRecord) => u.id).sort(),
      ["a-u1", "a-u2"],
    );
    assert.ok(doc.usage.every((u: UsageRecord) => u.tenantId === w.tenantA.id));
    assert.ok(doc.audit.length > 0);
    assert.ok(
      doc.audit.every((e: { tenantId: string }) => e.tenantId === w.tenantA.id),
    );
    assert.deepEqual(doc.responses.map((r: { id: string }) => r.id), [
      "resp_a",
    ]);
    assert.equal(doc.responses[0].response.output_text, "a answer");
    assert.deepEqual(doc.apiKeys.map((k: { id: string }) => k.id), [
      s.a.keyId,
    ]);
    assert.equal(doc.limits.rpm, 1000);
    assert.equal(doc.users.length, 2);
    for (
      const needle of [
        w.tenantB.id,
        "Globex",
        "globex",
        s.b.keyId,
        "b-u1",
        "resp_b",
        "b question",
        "passwordHash",
        '"hash"',
        s.a.key,
      ]
    ) {
      assert.ok(!text.includes(needle), `the export holds ${needle}`);
    }
    // the viewer may not export; another tenant's export is a 404
    assert.equal(
      (await api(w, "GET", `/tenants/${w.tenantA.id}/export`, w.tokens.viewerA))
        .status,
      403,
    );
    assert.equal(
      (await api(w, "GET", `/tenants/${w.tenantB.id}/export`, w.tokens.adminA))
        .status,
      404,
    );
    const all = await api(
      w,
      "GET",
      `/tenants/${w.tenantB.id}/export`,
      w.tokens.platform,
    );
    assert.equal(all.status, 200);
    assert.ok(!(await all.text()).includes(w.tenantA.id));
  } finally {
    await w.close();
  }
});

Deno.test("deletion: a deleted tenant is disabled at once and its data removed after the grace period, nothing of another tenant", async () => {
  const w = await createWorld();
  try {
    const s = await seed(w);
    const b = w.tenantB.id;
    const models = (key: string) =>
      w.app.request("/v1/models", {
        headers: { authorization: `Bearer ${key}` },
      });
    assert.notEqual((await models(s.b.key)).status, 403);
    // only platform admins delete
    assert.equal(
      (await api(w, "DELETE", `/tenants/${w.tenantA.id}`, w.tokens.adminA))
        .status,
      403,
    );
    const res = await api(w, "DELETE", `/tenants/${b}`, w.tokens.platform);
    assert.equal(res.status, 202);
    const t = await res.json();
    assert.equal(t.status, "suspended");
    const grace = Date.parse(t.deletion.purgeAt) -
      Date.parse(t.deletion.requestedAt);
    assert.equal(grace, 30 * DAY_MS);
    const refused = await models(s.b.key);
    assert.equal(refused.status, 403);
    assert.equal((await refused.json()).error.code, "account_suspended");
    // it cannot be resumed while its deletion is scheduled
    const resume = await api(w, "PATCH", `/tenants/${b}`, w.tokens.platform, {
      status: "active",
    });
    assert.equal(resume.status, 409);

    const now = Date.now();
    let r = await sweepRetention(w.store, now + 29 * DAY_MS);
    assert.deepEqual(r.purged, []);
    assert.ok((await w.kv.get(["tenant", b])).value);
    r = await sweepRetention(w.store, now + 31 * DAY_MS);
    assert.deepEqual(r.purged, [b]);
    const left: string[] = [];
    for await (const e of w.kv.list({ prefix: [] })) {
      const text = JSON.stringify([e.key, e.value]);
      if (
        (text.includes(b) || text.includes(s.b.keyId)) &&
        // node × tenant busy time: kept for other tenants' statements
        !(e.key[0] === "usage_month" && e.key[2] === "node_tenant")
      ) left.push(JSON.stringify(e.key));
    }
    // only the provider's trace of the purge names it
    assert.ok(
      left.every((key) =>
        key.startsWith('["audit"') || key.startsWith('["audit_by_actor"')
      ),
      left.join("\n"),
    );
    const trace = await listAudit(w.kv, SYSTEM, { limit: 5 });
    assert.equal(trace.items[0]!.action, "tenant.purge");
    assert.equal(trace.items[0]!.tenantId, null);
    // tenant A is whole
    assert.equal(
      (await listUsageRecords(w.store, w.tenantA.id)).items.length,
      2,
    );
    assert.ok((await w.kv.get(["tenant", w.tenantA.id])).value);
    assert.equal((await models(s.a.key)).status, 200);
    assert.equal(
      (await api(w, "GET", `/tenants/${b}`, w.tokens.platform)).status,
      404,
    );
  } finally {
    await w.close();
  }
});
