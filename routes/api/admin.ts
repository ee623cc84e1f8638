/**
 * The admin REST API (`/api/admin/v1`), bearer admin token, JSON. Same
 * service layer as the portal; authorization is in the service functions.
 */
import { Hono, type MiddlewareHandler } from "hono";
import { verifyAdminToken } from "../../store/admin_tokens.ts";
import {
  createApiKey,
  getApiKey,
  listApiKeys,
  revokeApiKey,
  rotateApiKey,
  updateApiKey,
} from "../../store/api_keys.ts";
import {
  listRequestLog,
  parseLogTime,
  parseRequestLogQuery,
} from "../../store/request_log.ts";
import { listAudit } from "../../store/audit.ts";
import { auditJson } from "../../store/audit_json.ts";
import { UnauthorizedError } from "../../store/errors.ts";
import { getTenantLimits, setTenantLimits } from "../../store/limits.ts";
import {
  createTenant,
  findTenant,
  listTenants,
  updateTenant,
} from "../../store/tenants.ts";
import { createInvite, listUsers } from "../../store/users.ts";
import { getPricing, pricingJson, setPricing } from "../../store/pricing.ts";
import { moneyJson } from "../../store/money.ts";
import { isPlatform, requirePlatform } from "../../store/principal.ts";
import { buildStatement, statementCsv } from "../../store/statements.ts";
import { clusterChargeback } from "../../store/chargeback.ts";
import { capacityReport } from "../../store/capacity.ts";
import { capacityCsv } from "../../store/capacity_csv.ts";
import { parseUsageQuery, usageReport } from "../../store/usage_report.ts";
import { ValidationError } from "../../store/errors.ts";
import { keyRotateSchema, parse } from "../../store/schemas.ts";
import { type AdminEnv, clientIp } from "../_env.ts";
import { limitParam, readJson } from "./_json.ts";
import { addBudgetRoutes } from "./budgets.ts";
import { openApiDocument } from "./openapi.ts";
import { addRetentionRoutes } from "./retention.ts";

/** Authenticates `Authorization: Bearer <admin token>`. */
export function adminAuth(): MiddlewareHandler<AdminEnv> {
  return async function adminAuth(c, next) {
    const h = c.req.header("authorization") ?? "";
    const m = /^Bearer\s+(\S+)$/i.exec(h);
    const principal = m
      ? await verifyAdminToken(c.get("deps").store, m[1]!, clientIp(c))
      : null;
    if (!principal) {
      c.header("www-authenticate", 'Bearer realm="orchard-admin"');
      throw new UnauthorizedError(
        "A valid admin token is required (Authorization: Bearer …)",
      );
    }
    c.set("principal", principal);
    await next();
  };
}

/** Builds the admin API sub-app (mount at `/api/admin/v1`). */
export function createAdminApi(): Hono<AdminEnv> {
  const api = new Hono<AdminEnv>();
  api.get("/openapi.json", (c) => c.json(openApiDocument()));
  api.use("*", adminAuth());
  const store = (c: { get(k: "deps"): AdminEnv["Variables"]["deps"] }) =>
    c.get("deps").store;

  api.post(
    "/tenants",
    async (c) =>
      c.json(
        await createTenant(store(c), c.get("principal"), await readJson(c)),
        201,
      ),
  );
  api.get("/tenants", async (c) =>
    c.json(
      await listTenants(store(c), c.get("principal"), {
        search: c.req.query("search")?.slice(0, 100),
        cursor: c.req.query("cursor"),
        limit: limitParam(c.req.query("limit")),
      }),
    ));
  api.get(
    "/tenants/:id",
    async (c) =>
      c.json(await findTenant(store(c), c.get("principal"), c.req.param("id"))),
  );
  api.patch("/tenants/:id", async (c) => {
    const t = await findTenant(store(c), c.get("principal"), c.req.param("id"));
    return c.json(
      await updateTenant(store(c), c.get("principal"), t.id, await readJson(c)),
    );
  });
  api.get("/tenants/:id/limits", async (c) => {
    const t = await findTenant(store(c), c.get("principal"), c.req.param("id"));
    return c.json(await getTenantLimits(store(c), c.get("principal"), t.id));
  });
  api.put("/tenants/:id/limits", async (c) => {
    const t = await findTenant(store(c), c.get("principal"), c.req.param("id"));
    return c.json(
      await setTenantLimits(
        store(c),
        c.get("principal"),
        t.id,
        await readJson(c),
      ),
    );
  });
  api.post("/tenants/:id/keys", async (c) => {
    const t = await findTenant(store(c), c.get("principal"), c.req.param("id"));
    const { key, apiKey } = await createApiKey(
      store(c),
      c.get("principal"),
      t.id,
      await readJson(c),
    );
    c.header("cache-control", "no-store");
    return c.json({ ...apiKey, key }, 201);
  });
  api.get("/tenants/:id/keys", async (c) => {
    const t = await findTenant(store(c), c.get("principal"), c.req.param("id"));
    return c.json(
      await listApiKeys(store(c), c.get("principal"), t.id, {
        cursor: c.req.query("cursor"),
        limit: limitParam(c.req.query("limit")),
      }),
    );
  });
  api.get("/tenants/:id/users", async (c) => {
    const t = await findTenant(store(c), c.get("principal"), c.req.param("id"));
    return c.json(
      await listUsers(store(c), c.get("principal"), t.id, {
        cursor: c.req.query("cursor"),
        limit: limitParam(c.req.query("limit")),
      }),
    );
  });
  api.get(
    "/keys/:id",
    async (c) =>
      c.json(await getApiKey(store(c), c.get("principal"), c.req.param("id"))),
  );
  api.delete(
    "/keys/:id",
    async (c) =>
      c.json(
        await revokeApiKey(store(c), c.get("principal"), c.req.param("id")),
      ),
  );
  api.patch(
    "/keys/:id",
    async (c) =>
      c.json(
        await updateApiKey(
          store(c),
          c.get("principal"),
          c.req.param("id"),
          await readJson(c),
        ),
      ),
  );
  api.post("/keys/:id/rotate", async (c) => {
    const grace = parse(keyRotateSchema, await readJson(c)).graceSeconds;
    const { key, apiKey } = await rotateApiKey(
      store(c),
      c.get("principal"),
      c.req.param("id"),
      grace * 1000,
    );
    c.header("cache-control", "no-store");
    return c.json({ ...apiKey, key });
  });
  api.get("/tenants/:id/requests", async (c) => {
    const t = await findTenant(store(c), c.get("principal"), c.req.param("id"));
    return c.json(
      await listRequestLog(
        store(c),
        c.get("principal"),
        t.id,
        parseRequestLogQuery(c.req.query()),
      ),
    );
  });
  api.post("/invites", async (c) => {
    const { token, invite } = await createInvite(
      store(c),
      c.get("principal"),
      await readJson(c),
    );
    c.header("cache-control", "no-store");
    return c.json({
      ...invite,
      link: `${c.get("deps").config.publicUrl}/invite/${token}`,
    }, 201);
  });
  api.get("/audit", async (c) => {
    const page = await listAudit(store(c).kv, c.get("principal"), {
      tenantId: c.req.query("tenant")?.slice(0, 64),
      actorId: c.req.query("actor")?.slice(0, 64),
      action: c.req.query("action")?.slice(0, 64),
      from: parseLogTime(c.req.query("from"), "from"),
      to: parseLogTime(c.req.query("to"), "to", true),
      cursor: c.req.query("cursor"),
      limit: limitParam(c.req.query("limit")),
    });
    const { currency } = await getPricing(store(c));
    return c.json({
      ...page,
      items: page.items.map((e) => auditJson(e, currency)),
    });
  });
  api.get("/usage", async (c) => {
    const p = c.get("principal");
    const q = c.req.query();
    const tenant = q.tenant
      ? (await findTenant(store(c), p, q.tenant.slice(0, 64))).id
      : undefined;
    return c.json(moneyJson(
      await usageReport(
        store(c),
        p,
        parseUsageQuery({
          tenant,
          key: q.key,
          model: q.model,
          granularity: q.granularity,
          from: q.from,
          to: q.to,
        }),
      ),
    ));
  });
  api.get("/statements", async (c) => {
    const p = c.get("principal");
    const q = c.req.query();
    const ref = q.tenant?.slice(0, 64) || (isPlatform(p) ? "" : p.tenantId!);
    if (!ref) throw new ValidationError("tenant: is required", "tenant");
    const format = q.format ?? "json";
    if (format !== "json" && format !== "csv") {
      throw new ValidationError("format: must be csv or json", "format");
    }
    const tenant = await findTenant(store(c), p, ref);
    const s = await buildStatement(
      store(c),
      p,
      tenant.id,
      (q.month ?? "").slice(0, 20),
    );
    if (format === "json") return c.json(moneyJson(s));
    return c.body(statementCsv(s), 200, {
      "content-type": "text/csv; charset=utf-8",
      "content-disposition":
        `attachment; filename="statement-${tenant.slug}-${s.month}.csv"`,
    });
  });
  api.get("/chargeback", async (c) => {
    const month = (c.req.query("month") ?? "").slice(0, 20);
    return c.json(
      moneyJson(await clusterChargeback(store(c), c.get("principal"), month)),
    );
  });
  api.get("/capacity", async (c) => {
    const format = c.req.query("format") ?? "json";
    if (format !== "json" && format !== "csv") {
      throw new ValidationError("format: must be csv or json", "format");
    }
    const r = await capacityReport(store(c), c.get("principal"));
    if (format === "json") return c.json(moneyJson(r));
    return c.body(capacityCsv(r), 200, {
      "content-type": "text/csv; charset=utf-8",
      "content-disposition": `attachment; filename="capacity-${
        r.generatedAt.slice(0, 10)
      }.csv"`,
    });
  });
  api.get("/settings/pricing", async (c) => {
    requirePlatform(c.get("principal"));
    return c.json(pricingJson(await getPricing(store(c))));
  });
  api.put(
    "/settings/pricing",
    async (c) =>
      c.json(
        pricingJson(
          await setPricing(store(c), c.get("principal"), await readJson(c)),
        ),
      ),
  );
  addBudgetRoutes(api);
  addRetentionRoutes(api);
  return api;
}
