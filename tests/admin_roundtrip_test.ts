/**
 * One money format in the admin API: every resource with money or limits
 * survives a GET → PUT → GET round trip unchanged, money is a decimal
 * string in major units beside its currency, a plain JSON number for
 * money is refused with why, and every request body in the OpenAPI
 * document is generated from the zod schema that parses it.
 */
// deno-lint-ignore-file no-explicit-any -- JSON answers read field by field
import assert from "node:assert/strict";
import { createApiKey } from "../store/api_keys.ts";
import { SYSTEM } from "../store/principal.ts";
import type { UsageRecord } from "../store/usage.ts";
import { writeUsage } from "../store/usage_rollups.ts";
import { api, createWorld, type TestWorld } from "./_helpers.ts";

/** Fields a write stamps (when and by whom), left out of the comparison. */
function content(v: Record<string, unknown>): Record<string, unknown> {
  const { updatedAt: _a, updatedBy: _b, ...rest } = v;
  return rest;
}

async function json(res: Response, what: string): Promise<any> {
  const body = await res.json();
  assert.equal(res.status, 200, `${what}: ${JSON.stringify(body)}`);
  return body;
}

/** GET `path`, send what it gave back with `method`, GET again: the same. */
async function roundTrip(
  w: TestWorld,
  path: string,
  token: string,
  opts: { method?: string; path?: string; pick?: (v: any) => unknown } = {},
): Promise<any> {
  const before = await json(await api(w, "GET", path, token), `GET ${path}`);
  const sent = opts.pick ? opts.pick(before) : before;
  const put = await json(
    await api(w, opts.method ?? "PUT", opts.path ?? path, token, sent),
    `${opts.method ?? "PUT"} ${path}`,
  );
  const after = await json(await api(w, "GET", path, token), `GET ${path}`);
  assert.deepEqual(content(after), content(before), `${path} changed`);
  return { before, put, after };
}

function usage(tenantId: string, keyId: string): UsageRecord {
  return {
    id: crypto.randomUUID(),
    at: new Date().toISOString(),
    requestId: "req",
    tenantId,
    keyId,
    model: "tiny",
    nodeId: null,
    endpoint: "chat",
    promptTokens: 123_456,
    completionTokens: 7_890,
    latencyMs: 10,
    ttftMs: null,
    status: 200,
    outcome: "ok",
  };
}

Deno.test("GET → PUT → GET is the identity on every admin resource with money or limits", async () => {
  const w = await createWorld();
  try {
    const { platform, adminA } = w.tokens;
    const { apiKey } = await createApiKey(w.store, SYSTEM, w.tenantA.id, {
      name: "prod",
      limits: { rpm: 60, tpm: 10_000, tokensPerMonth: 5_000_000 },
    });
    await writeUsage(w.store, [usage(w.tenantA.id, apiKey.id)]);
    const setUp: [string, unknown][] = [
      ["/settings/pricing", {
        currency: "USD",
        models: [{
          model: "tiny",
          promptPerMillion: "400.00",
          completionPerMillion: "0.123456",
        }],
        cluster: {
          hardwarePricePerNode: "3999.99",
          amortisationMonths: 36,
          idleWatts: 7,
          busyWatts: 60.5,
          tariffPerKwh: "0.2875",
          allocation: "tokens",
        },
      }],
      ["/tenants/acme/limits", {
        rpm: 600,
        tpm: 100_000,
        concurrency: 8,
        tokensPerDay: 2_000_000,
        tokensPerMonth: 40_000_000,
      }],
      ["/tenants/acme/budgets/money", {
        amount: "2000.00",
        hard: true,
        thresholds: [50, 80, 100],
      }],
      ["/tenants/acme/budgets/tokens", { amount: 30_000_000 }],
      [`/keys/${apiKey.id}/budgets/money`, {
        amount: "12.345678",
        thresholds: [90],
      }],
      [`/keys/${apiKey.id}/budgets/tokens`, { amount: 1_000, hard: true }],
    ];
    for (const [path, body] of setUp) {
      await json(await api(w, "PUT", path, platform, body), `set ${path}`);
    }
    const statement = async () =>
      await json(
        await api(
          w,
          "GET",
          `/statements?tenant=acme&month=${
            new Date().toISOString().slice(0, 7)
          }`,
          platform,
        ),
        "statement",
      );
    const billed = (await statement()).total;
    // 123,456 × 400.00 / 1M + 7,890 × 0.123456 / 1M = 49.38 + 0.00
    assert.equal(billed, "49.38");

    const pricing = await roundTrip(w, "/settings/pricing", platform);
    assert.deepEqual(pricing.before.models, [{
      model: "tiny",
      promptPerMillion: "400.00",
      completionPerMillion: "0.123456",
    }]);
    assert.equal(pricing.before.currency, "USD");
    assert.equal(pricing.before.cluster.hardwarePricePerNode, "3999.99");
    assert.equal(pricing.before.cluster.tariffPerKwh, "0.2875");
    assert.deepEqual(content(pricing.put), content(pricing.before));

    const limits = await roundTrip(w, "/tenants/acme/limits", platform);
    assert.equal(limits.before.tokensPerMonth, 40_000_000);

    for (const unit of ["money", "tokens"]) {
      const t = await roundTrip(w, `/tenants/acme/budgets/${unit}`, platform);
      const k = await roundTrip(
        w,
        `/keys/${apiKey.id}/budgets/${unit}`,
        adminA,
      );
      // a PUT answers what a GET reads
      assert.deepEqual(content(t.put), content(t.after));
      assert.deepEqual(content(k.put), content(k.after));
      if (unit === "money") {
        assert.equal(t.before.amount, "2000.00");
        assert.equal(t.before.currency, "USD");
        assert.equal(t.before.spent, "49.38");
        assert.deepEqual(t.before.thresholds, [50, 80, 100]);
        assert.equal(k.before.amount, "12.345678");
      } else {
        assert.equal(t.before.amount, 30_000_000);
        assert.equal(t.before.currency, null);
        assert.equal(k.before.spent, 131_346);
      }
    }
    // the list of budgets reads the same after the round trips
    const listed = await json(
      await api(w, "GET", "/tenants/acme/budgets", platform),
      "budgets",
    );
    assert.equal(listed.currency, "USD");
    assert.deepEqual(
      listed.budgets.map((b: any) => [b.keyId, b.unit, b.amount]).sort(),
      [
        [null, "money", "2000.00"],
        [null, "tokens", 30_000_000],
        [apiKey.id, "money", "12.345678"],
        [apiKey.id, "tokens", 1_000],
      ].sort(),
    );

    // a key's own limits (and what else PATCH edits) read back unchanged
    const key = await roundTrip(w, `/keys/${apiKey.id}`, adminA, {
      method: "PATCH",
      pick: ({ name, scopes, models, limits }) => ({
        name,
        scopes,
        models,
        limits,
      }),
    });
    assert.equal(key.before.limits.tokensPerMonth, 5_000_000);

    // retention limits: the provider's bounds, and a tenant's choice
    await json(
      await api(w, "PUT", "/tenants/acme/retention", adminA, { usage: 30 }),
      "retention",
    );
    await roundTrip(w, "/settings/retention", platform);
    const retention = await roundTrip(w, "/tenants/acme/retention", adminA, {
      pick: (v) => v.choice,
    });
    assert.deepEqual(retention.after.choice, { usage: 30 });

    // nothing was re-priced: the statement is what it was to the cent
    assert.equal((await statement()).total, billed);

    // the audit log and the tenant's export write money the same way
    const audit = await json(
      await api(w, "GET", "/audit?action=pricing.set", platform),
      "audit",
    );
    assert.equal(audit.items[0].after.models[0].promptPerMillion, "400.00");
    assert.equal(audit.items[0].before.cluster.tariffPerKwh, "0.2875");
    const budgetAudit = await json(
      await api(
        w,
        "GET",
        `/audit?action=budget.set&tenant=${w.tenantA.id}`,
        platform,
      ),
      "audit",
    );
    const moneySet = budgetAudit.items.find((e: any) =>
      e.after.unit === "money" && e.after.keyId === null
    );
    assert.equal(moneySet.after.amount, "2000.00");
    assert.equal(moneySet.after.currency, "USD");
    const exported = await json(
      await api(w, "GET", "/tenants/acme/export", platform),
      "export",
    );
    assert.deepEqual(
      exported.budgets.map((b: any) => b.amount).sort(),
      [...listed.budgets.map((b: any) => b.amount)].sort(),
    );
  } finally {
    await w.close();
  }
});

Deno.test("a plain JSON number for money is refused with a 400 that says why", async () => {
  const w = await createWorld();
  try {
    const { platform } = w.tokens;
    const ambiguous =
      /not a number: a number is ambiguous between units and micro-units/;
    const cases: [string, unknown, string][] = [
      ["/settings/pricing", {
        currency: "USD",
        models: [{
          model: "tiny",
          promptPerMillion: 400_000_000,
          completionPerMillion: "1",
        }],
        cluster: {
          hardwarePricePerNode: "0",
          amortisationMonths: 36,
          idleWatts: 0,
          busyWatts: 0,
          tariffPerKwh: "0",
        },
      }, "models.0.promptPerMillion"],
      ["/settings/pricing", {
        currency: "USD",
        models: [],
        cluster: {
          hardwarePricePerNode: 4000,
          amortisationMonths: 36,
          idleWatts: 0,
          busyWatts: 0,
          tariffPerKwh: "0",
        },
      }, "cluster.hardwarePricePerNode"],
      ["/tenants/acme/budgets/money", { amount: 2_000_000 }, "amount"],
    ];
    for (const [path, body, field] of cases) {
      const res = await api(w, "PUT", path, platform, body);
      assert.equal(res.status, 400, path);
      const { error } = await res.json();
      assert.equal(error.field, field);
      assert.match(error.message, ambiguous);
      assert.ok(error.message.startsWith(`${field}: must be a decimal string`));
    }
    // nothing was stored by the refused writes
    const budgets = await (await api(
      w,
      "GET",
      "/tenants/acme/budgets",
      platform,
    )).json();
    assert.deepEqual(budgets.budgets, []);
    const pricing = await (await api(w, "GET", "/settings/pricing", platform))
      .json();
    assert.deepEqual(pricing.models, []);
    // a token budget is a count, not money: a number is what it takes
    const tokens = await api(
      w,
      "PUT",
      "/tenants/acme/budgets/tokens",
      platform,
      {
        amount: 2_000_000,
      },
    );
    assert.equal(tokens.status, 200);
    assert.equal((await tokens.json()).amount, 2_000_000);
  } finally {
    await w.close();
  }
});

/** Admin routes that take no body (an action on the path's object). */
const NO_BODY = new Set([
  "POST /tenants/{id}/alerts/{alertId}/ack",
  "POST /tenants/{id}/deletion/cancel",
  "POST /users/{userId}/disable",
  "POST /users/{userId}/enable",
  "POST /users/{userId}/password-reset",
  "POST /nodes/{id}/drain",
  "POST /nodes/{id}/undrain",
  "POST /links/test-all",
]);

Deno.test("every admin request body in the OpenAPI document is generated from its zod schema", async () => {
  const w = await createWorld();
  try {
    const doc = await (await api(w, "GET", "/openapi.json", null)).json();
    const prefix = "/api/admin/v1";
    const writes = new Set<string>();
    for (const r of w.app.routes) {
      if (!["POST", "PUT", "PATCH"].includes(r.method)) continue;
      if (!r.path.startsWith(`${prefix}/`)) continue;
      const path = r.path.slice(prefix.length).replace(/:(\w+)/g, "{$1}");
      writes.add(`${r.method} ${path}`);
    }
    assert.ok(writes.size >= 20, `only ${writes.size} admin writes found`);
    for (const w of writes) {
      if (NO_BODY.has(w)) continue;
      const [method, path] = w.split(" ") as [string, string];
      const op = doc.paths[path]?.[method.toLowerCase()];
      assert.ok(op, `${w} is not in the document`);
      const schema = op.requestBody?.content?.["application/json"]?.schema;
      assert.ok(schema, `${w} has no request body schema`);
      const alternatives = schema.oneOf ?? [schema];
      for (const s of alternatives) {
        assert.equal(s.type, "object", w);
        assert.ok(
          Object.keys(s.properties ?? {}).length > 0,
          `${w}: ${JSON.stringify(s)}`,
        );
        assert.equal(s.additionalProperties, false, `${w}: not from zod`);
      }
    }
    // money fields are described as decimal strings, never numbers
    const pricing = doc.paths["/settings/pricing"].put.requestBody.content[
      "application/json"
    ].schema;
    const price = pricing.properties.models.items.properties.promptPerMillion;
    assert.equal(price.type, "string");
    assert.match(price.description, /decimal string/);
    assert.equal(pricing.properties.updatedAt.readOnly, true);
    const budget = doc.paths["/tenants/{id}/budgets/{unit}"].put.requestBody
      .content["application/json"].schema;
    const money = budget.oneOf.find((s: any) => s.title === "money");
    assert.equal(money.properties.amount.type, "string");
    assert.deepEqual(money.required, ["amount"]);
  } finally {
    await w.close();
  }
});
