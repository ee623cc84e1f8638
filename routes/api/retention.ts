/**
 * Retention, export and deletion of a tenant's records in the admin API
 * (`/api/admin/v1`): a tenant's retention periods (its admins choose
 * within the provider's bounds), the bounds themselves and the deletion
 * grace period (platform admins), the JSON export of a tenant's records
 * (its admins, platform admins), and deleting a tenant (platform admins:
 * disabled at once, data removed after the grace period).
 */
import type { Context, Hono } from "hono";
import { requirePlatform } from "../../store/principal.ts";
import {
  cancelTenantDeletion,
  getRetentionBounds,
  getTenantRetention,
  retentionBoundsSchema,
  scheduleTenantDeletion,
  setRetentionBounds,
  setTenantRetention,
  tenantRetentionSchema,
} from "../../store/retention.ts";
import { exportTenant } from "../../store/tenant_export.ts";
import { findTenant } from "../../store/tenants.ts";
import type { AdminEnv } from "../_env.ts";
import { readJson } from "./_json.ts";
import { documentPaths, requestBody } from "./openapi.ts";

type C = Context<AdminEnv>;

/** The export's file name: the tenant's slug and the day. */
export function exportFileName(slug: string): string {
  return `orchard-export-${slug}-${new Date().toISOString().slice(0, 10)}.json`;
}

/** Adds the retention, export and deletion routes to the admin API. */
export function addRetentionRoutes(api: Hono<AdminEnv>): void {
  const store = (c: C) => c.get("deps").store;
  const tenant = (c: C) =>
    findTenant(store(c), c.get("principal"), c.req.param("id")!);

  api.get("/tenants/:id/retention", async (c) =>
    c.json(
      await getTenantRetention(
        store(c),
        c.get("principal"),
        (await tenant(c)).id,
      ),
    ));
  api.put("/tenants/:id/retention", async (c) => {
    const t = await tenant(c);
    return c.json(
      await setTenantRetention(
        store(c),
        c.get("principal"),
        t.id,
        await readJson(c),
      ),
    );
  });
  api.get("/tenants/:id/export", async (c) => {
    const t = await tenant(c);
    const doc = await exportTenant(store(c), c.get("principal"), t.id);
    c.header("cache-control", "no-store");
    c.header(
      "content-disposition",
      `attachment; filename="${exportFileName(t.slug)}"`,
    );
    return c.json(doc);
  });
  api.delete("/tenants/:id", async (c) => {
    const t = await tenant(c);
    return c.json(
      await scheduleTenantDeletion(store(c), c.get("principal"), t.id),
      202,
    );
  });
  api.post("/tenants/:id/deletion/cancel", async (c) => {
    const t = await tenant(c);
    return c.json(
      await cancelTenantDeletion(store(c), c.get("principal"), t.id),
    );
  });
  api.get("/settings/retention", async (c) => {
    requirePlatform(c.get("principal"));
    return c.json(await getRetentionBounds(store(c)));
  });
  api.put("/settings/retention", async (c) =>
    c.json(
      await setRetentionBounds(store(c), c.get("principal"), await readJson(c)),
    ));
}

const tenantId = {
  name: "id",
  in: "path",
  required: true,
  schema: { type: "string" },
  description: "tenant id or slug",
};
const ok = (summary: string, status = "200") => ({
  summary,
  responses: {
    [status]: {
      description: "OK",
      content: { "application/json": { schema: { type: "object" } } },
    },
  },
});
documentPaths({
  "/tenants/{id}/retention": {
    get: {
      ...ok(
        "The tenant's retention periods (days per kind), its choices and the provider's bounds",
      ),
      parameters: [tenantId],
    },
    put: {
      ...ok(
        "Choose the tenant's retention periods within the bounds (tenant admins; null: the default)",
      ),
      parameters: [tenantId],
      requestBody: requestBody(tenantRetentionSchema),
    },
  },
  "/tenants/{id}/export": {
    get: {
      ...ok("Every record of the tenant as one JSON document (tenant admins)"),
      parameters: [tenantId],
    },
  },
  "/tenants/{id}/deletion/cancel": {
    post: {
      ...ok(
        "Cancel a scheduled deletion within its grace period (platform admins)",
      ),
      parameters: [tenantId],
    },
  },
  "/settings/retention": {
    get: ok(
      "Retention bounds: defaults, minimum and maximum per kind, deletion grace days (platform admins)",
    ),
    put: {
      ...ok("Replace the retention bounds (platform admins)"),
      requestBody: requestBody(retentionBoundsSchema),
    },
  },
});
