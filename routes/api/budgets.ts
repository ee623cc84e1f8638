/**
 * Budgets, alerts and webhooks in the admin API (`/api/admin/v1`):
 * tenants' budgets (platform admins), keys' budgets (the tenant's admins,
 * within the tenant's), alerts and their acknowledgement, webhook
 * endpoints (a tenant's, or the provider's own) and their delivery logs.
 * Authorization is in the service functions: another tenant's objects are
 * 404.
 */
import type { Context, Hono } from "hono";
import {
  acknowledgeAlert,
  alertJson,
  listAlerts,
  listAllAlerts,
} from "../../store/budget_alerts.ts";
import {
  budgetBodySchema,
  budgetJson,
  budgetStatus,
  deleteKeyBudget,
  deleteTenantBudget,
  parseUnit,
  setKeyBudget,
  setTenantBudget,
} from "../../store/budgets.ts";
import { getApiKey } from "../../store/api_keys.ts";
import { NotFoundError } from "../../store/errors.ts";
import type { Principal } from "../../store/principal.ts";
import type { Store } from "../../store/store.ts";
import { findTenant } from "../../store/tenants.ts";
import {
  createWebhook,
  deleteWebhook,
  listDeliveries,
  listWebhooks,
  webhookCreateSchema,
} from "../../store/webhooks.ts";
import type { AdminEnv } from "../_env.ts";
import { limitParam, readJson } from "./_json.ts";
import { documentPaths, jsonSchemaOf, requestBody } from "./openapi.ts";

type C = Context<AdminEnv>;

/** Adds the budget, alert and webhook routes to the admin API. */
export function addBudgetRoutes(api: Hono<AdminEnv>): void {
  const store = (c: C) => c.get("deps").store;
  const tenant = async (c: C) =>
    (await findTenant(store(c), c.get("principal"), c.req.param("id")!)).id;
  const page = (c: C) => ({
    cursor: c.req.query("cursor"),
    limit: limitParam(c.req.query("limit")),
  });
  const allowPrivate = (c: C) => c.get("deps").config.allowPrivateWebhookUrls;

  api.get(
    "/tenants/:id/budgets",
    async (c) =>
      c.json(await statusJson(store(c), c.get("principal"), await tenant(c))),
  );
  api.get("/tenants/:id/budgets/:unit", async (c) =>
    c.json(
      await oneBudget(
        store(c),
        c.get("principal"),
        await tenant(c),
        null,
        parseUnit(c.req.param("unit")),
      ),
    ));
  api.put("/tenants/:id/budgets/:unit", async (c) => {
    const id = await tenant(c);
    const b = await setTenantBudget(
      store(c),
      c.get("principal"),
      id,
      parseUnit(c.req.param("unit")),
      await readJson(c),
    );
    // answered as GET reads it: with this month's spend
    return c.json(
      await oneBudget(store(c), c.get("principal"), id, null, b.unit),
    );
  });
  api.delete("/tenants/:id/budgets/:unit", async (c) => {
    const id = await tenant(c);
    await deleteTenantBudget(
      store(c),
      c.get("principal"),
      id,
      parseUnit(c.req.param("unit")),
    );
    return c.body(null, 204);
  });
  api.get("/keys/:id/budgets/:unit", async (c) => {
    const key = await getApiKey(
      store(c),
      c.get("principal"),
      c.req.param("id"),
    );
    return c.json(
      await oneBudget(
        store(c),
        c.get("principal"),
        key.tenantId,
        key.id,
        parseUnit(c.req.param("unit")),
      ),
    );
  });
  api.put("/keys/:id/budgets/:unit", async (c) => {
    const b = await setKeyBudget(
      store(c),
      c.get("principal"),
      c.req.param("id"),
      parseUnit(c.req.param("unit")),
      await readJson(c),
    );
    return c.json(
      await oneBudget(
        store(c),
        c.get("principal"),
        b.tenantId,
        b.keyId,
        b.unit,
      ),
    );
  });
  api.delete("/keys/:id/budgets/:unit", async (c) => {
    await deleteKeyBudget(
      store(c),
      c.get("principal"),
      c.req.param("id"),
      parseUnit(c.req.param("unit")),
    );
    return c.body(null, 204);
  });

  api.get("/tenants/:id/alerts", async (c) => {
    const r = await listAlerts(
      store(c),
      c.get("principal"),
      await tenant(c),
      page(c),
    );
    return c.json({ ...r, items: r.items.map(alertJson) });
  });
  api.post("/tenants/:id/alerts/:alertId/ack", async (c) =>
    c.json(alertJson(
      await acknowledgeAlert(
        store(c),
        c.get("principal"),
        await tenant(c),
        c.req.param("alertId"),
      ),
    )));
  api.get("/alerts", async (c) => {
    const r = await listAllAlerts(store(c), c.get("principal"), page(c));
    return c.json({ ...r, items: r.items.map(alertJson) });
  });

  // A tenant's endpoints (tenant admins), and the provider's (platform admins).
  for (const scope of ["tenant", "provider"] as const) {
    const base = scope === "tenant" ? "/tenants/:id/webhooks" : "/webhooks";
    const owner = (c: C) =>
      scope === "tenant" ? tenant(c) : Promise.resolve(null);
    api.get(base, async (c) =>
      c.json({
        items: await listWebhooks(store(c), c.get("principal"), await owner(c)),
      }));
    api.post(base, async (c) => {
      const { secret, webhook } = await createWebhook(
        store(c),
        c.get("principal"),
        await owner(c),
        await readJson(c),
        allowPrivate(c),
      );
      c.header("cache-control", "no-store");
      return c.json({ ...webhook, secret }, 201);
    });
    api.get(`${base}/deliveries`, async (c) =>
      c.json(
        await listDeliveries(
          store(c),
          c.get("principal"),
          await owner(c),
          page(c),
        ),
      ));
    api.delete(`${base}/:webhookId`, async (c) =>
      c.json(
        await deleteWebhook(
          store(c),
          c.get("principal"),
          await owner(c),
          c.req.param("webhookId"),
        ),
      ));
  }
}

/** A tenant's budgets with this month's spend, money as decimal strings. */
async function statusJson(store: Store, p: Principal, tenantId: string) {
  const s = await budgetStatus(store, p, tenantId);
  return { ...s, budgets: s.budgets.map((b) => budgetJson(b, s.currency)) };
}

/** One budget (the tenant's, or a key's) with its spend, or 404. */
async function oneBudget(
  store: Store,
  p: Principal,
  tenantId: string,
  keyId: string | null,
  unit: "tokens" | "money",
) {
  const s = await budgetStatus(store, p, tenantId);
  const b = s.budgets.find((b) => b.keyId === keyId && b.unit === unit);
  if (!b) throw new NotFoundError("Budget");
  return budgetJson(b, s.currency);
}

const path = (name: string, what: string) => ({
  name,
  in: "path",
  required: true,
  schema: { type: "string" },
  description: what,
});
const tenantId = path("id", "tenant id or slug");
const unit = {
  name: "unit",
  in: "path",
  required: true,
  schema: { enum: ["tokens", "money"] },
};
const paging = [
  { name: "cursor", in: "query", schema: { type: "string" } },
  { name: "limit", in: "query", schema: { type: "integer", minimum: 1 } },
];
const ok = (summary: string, status = "200") => ({
  summary,
  responses: {
    [status]: {
      description: "OK",
      content: { "application/json": { schema: { type: "object" } } },
    },
  },
});
const budgetBody = {
  required: true,
  content: {
    "application/json": {
      schema: {
        description:
          "per calendar month (UTC): a tokens budget's amount in whole tokens, a money budget's as a decimal string in major units of the pricing's currency (never a number); a hard one refuses requests (429 insufficient_quota) once reached; alerts at `thresholds` percents (default [80, 100]). A budget read back (GET) may be sent as is: its read-only fields are ignored",
        oneOf: [
          { title: "tokens", ...jsonSchemaOf(budgetBodySchema("tokens")) },
          { title: "money", ...jsonSchemaOf(budgetBodySchema("money")) },
        ],
      },
    },
  },
};
const webhookBody = requestBody(webhookCreateSchema);

documentPaths({
  "/tenants/{id}/budgets": {
    get: {
      ...ok("The tenant's and its keys' budgets with this month's spend"),
      parameters: [tenantId],
    },
  },
  "/tenants/{id}/budgets/{unit}": {
    get: {
      ...ok("The tenant's budget in a unit, with this month's spend"),
      parameters: [tenantId, unit],
    },
    put: {
      ...ok("Set the tenant's budget in a unit (platform admins)"),
      parameters: [tenantId, unit],
      requestBody: budgetBody,
    },
    delete: {
      ...ok("Remove the tenant's budget in a unit (platform admins)", "204"),
      parameters: [tenantId, unit],
    },
  },
  "/keys/{id}/budgets/{unit}": {
    get: {
      ...ok("A key's budget in a unit, with this month's spend"),
      parameters: [path("id", "key id"), unit],
    },
    put: {
      ...ok("Set a key's budget, within the tenant's (tenant admins)"),
      parameters: [path("id", "key id"), unit],
      requestBody: budgetBody,
    },
    delete: {
      ...ok("Remove a key's budget", "204"),
      parameters: [path("id", "key id"), unit],
    },
  },
  "/tenants/{id}/alerts": {
    get: {
      ...ok("The tenant's budget alerts, newest first"),
      parameters: [tenantId, ...paging],
    },
  },
  "/tenants/{id}/alerts/{alertId}/ack": {
    post: {
      ...ok("Acknowledge an alert"),
      parameters: [tenantId, path("alertId", "alert id")],
    },
  },
  "/alerts": {
    get: {
      ...ok("Every tenant's alerts (platform admins)"),
      parameters: paging,
    },
  },
  "/tenants/{id}/webhooks": {
    get: { ...ok("The tenant's webhook endpoints"), parameters: [tenantId] },
    post: {
      ...ok(
        "Add an endpoint; only this response carries its signing `secret`",
        "201",
      ),
      parameters: [tenantId],
      requestBody: webhookBody,
    },
  },
  "/tenants/{id}/webhooks/{webhookId}": {
    delete: {
      ...ok("Delete an endpoint"),
      parameters: [tenantId, path("webhookId", "endpoint id")],
    },
  },
  "/tenants/{id}/webhooks/deliveries": {
    get: {
      ...ok("The delivery log: status, attempts, last error"),
      parameters: [tenantId, ...paging],
    },
  },
  "/webhooks": {
    get: ok("The provider's endpoints (platform admins)"),
    post: {
      ...ok("Add a provider endpoint (every tenant's alerts)", "201"),
      requestBody: webhookBody,
    },
  },
  "/webhooks/{webhookId}": {
    delete: {
      ...ok("Delete a provider endpoint"),
      parameters: [path("webhookId", "endpoint id")],
    },
  },
  "/webhooks/deliveries": {
    get: {
      ...ok("The provider endpoints' delivery log"),
      parameters: paging,
    },
  },
});
