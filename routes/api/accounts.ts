/**
 * Admin API for who may administer: admin tokens (`/admin-tokens`), users
 * (`/users`: list, disable, enable, password reset links) and pending
 * invites (`GET /invites`, `DELETE /invites/{id}`). Mounted under
 * `/api/admin/v1` after admin authentication; authorization is in the
 * service functions.
 */
import { Hono } from "hono";
import {
  createAdminToken,
  listAdminTokens,
  revokeAdminToken,
} from "../../store/admin_tokens.ts";
import { createPasswordReset } from "../../store/password_resets.ts";
import { isPlatform, type Principal } from "../../store/principal.ts";
import { adminTokenCreateSchema } from "../../store/schemas.ts";
import type { Store } from "../../store/store.ts";
import { findTenant } from "../../store/tenants.ts";
import {
  listPendingInvites,
  listUserAccounts,
  revokeInviteById,
  setUserDisabled,
} from "../../store/users.ts";
import type { AdminEnv } from "../_env.ts";
import { limitParam, readJson } from "./_json.ts";
import { documentPaths, requestBody } from "./openapi.ts";

/** `?tenant=` (id or slug) as a tenant id; the caller's own tenant for tenant principals without it. */
async function tenantScope(
  store: Store,
  p: Principal,
  ref: string | undefined,
): Promise<string | null> {
  if (ref) return (await findTenant(store, p, ref.slice(0, 64))).id;
  return isPlatform(p) ? null : p.tenantId;
}

/**
 * Builds the accounts part of the admin API. (`GET /invites` is documented
 * with `POST /invites` in openapi.ts: one path, one entry.)
 */
export function createAccountsAdminApi(): Hono<AdminEnv> {
  const api = new Hono<AdminEnv>();
  const store = (c: { get(k: "deps"): AdminEnv["Variables"]["deps"] }) =>
    c.get("deps").store;
  const page = (c: { req: { query(k: string): string | undefined } }) => ({
    cursor: c.req.query("cursor"),
    limit: limitParam(c.req.query("limit")),
  });

  api.post("/admin-tokens", async (c) => {
    const { token, record } = await createAdminToken(
      store(c),
      c.get("principal"),
      await readJson(c),
    );
    c.header("cache-control", "no-store");
    return c.json({ ...record, token }, 201);
  });
  api.get("/admin-tokens", async (c) => {
    const p = c.get("principal");
    return c.json(
      await listAdminTokens(store(c), p, {
        tenantId: await tenantScope(store(c), p, c.req.query("tenant")),
        ...page(c),
      }),
    );
  });
  api.delete(
    "/admin-tokens/:tokenId",
    async (c) =>
      c.json(
        await revokeAdminToken(
          store(c),
          c.get("principal"),
          c.req.param("tokenId"),
        ),
      ),
  );
  api.get("/users", async (c) => {
    const p = c.get("principal");
    return c.json(
      await listUserAccounts(
        store(c),
        p,
        await tenantScope(store(c), p, c.req.query("tenant")),
        page(c),
      ),
    );
  });
  for (const action of ["disable", "enable"] as const) {
    api.post(
      `/users/:userId/${action}`,
      async (c) =>
        c.json(
          await setUserDisabled(
            store(c),
            c.get("principal"),
            c.req.param("userId"),
            action === "disable",
          ),
        ),
    );
  }
  api.post("/users/:userId/password-reset", async (c) => {
    const { token, reset } = await createPasswordReset(
      store(c),
      c.get("principal"),
      c.req.param("userId"),
    );
    c.header("cache-control", "no-store");
    return c.json({
      ...reset,
      link: `${c.get("deps").config.publicUrl}/reset/${token}`,
    }, 201);
  });
  api.get("/invites", async (c) => {
    const p = c.get("principal");
    return c.json(
      await listPendingInvites(
        store(c),
        p,
        await tenantScope(store(c), p, c.req.query("tenant")),
        page(c),
      ),
    );
  });
  api.delete(
    "/invites/:inviteId",
    async (c) =>
      c.json(
        await revokeInviteById(
          store(c),
          c.get("principal"),
          c.req.param("inviteId"),
        ),
      ),
  );
  return api;
}

const json = (schema: unknown) => ({
  content: { "application/json": { schema } },
});
const errors = Object.fromEntries(
  [
    ["400", "Invalid input; `error.field` names the field"],
    ["401", "Missing or invalid admin token"],
    ["403", "Not allowed for this token's role"],
    ["404", "Not found (or belongs to another tenant)"],
    ["409", "Conflict (concurrent change)"],
  ].map(([s, d]) => [s, {
    description: d,
    ...json({ $ref: "#/components/schemas/Error" }),
  }]),
);
const op = (
  summary: string,
  status: string,
  schema: unknown,
  extra: Record<string, unknown> = {},
) => ({
  summary,
  responses: { [status]: { description: "OK", ...json(schema) }, ...errors },
  ...extra,
});
const path = (name: string, what: string) => ({
  name,
  in: "path",
  required: true,
  schema: { type: "string" },
  description: what,
});
const listParams = [
  {
    name: "tenant",
    in: "query",
    schema: { type: "string" },
    description:
      "Tenant id or slug (platform tokens; tenant tokens see only their own)",
  },
  { name: "cursor", in: "query", schema: { type: "string" } },
  {
    name: "limit",
    in: "query",
    schema: { type: "integer", minimum: 1, maximum: 200 },
  },
];
const pageOf = (item: unknown) => ({
  type: "object",
  properties: {
    items: { type: "array", items: item },
    cursor: { type: ["string", "null"] },
  },
});
const role = { enum: ["platform_admin", "tenant_admin", "tenant_viewer"] };
const adminToken = {
  type: "object",
  properties: {
    id: { type: "string" },
    name: { type: "string" },
    role,
    tenantId: { type: ["string", "null"] },
    createdAt: { type: "string" },
    createdBy: { type: ["string", "null"] },
    expiresAt: { type: ["string", "null"] },
    revokedAt: { type: ["string", "null"] },
    lastUsedAt: { type: ["string", "null"] },
  },
};
const user = {
  type: "object",
  properties: {
    id: { type: "string" },
    email: { type: "string" },
    role,
    tenantId: { type: ["string", "null"] },
    disabled: { type: "boolean" },
    createdAt: { type: "string" },
    lastSignInAt: { type: ["string", "null"] },
  },
};
const invite = {
  type: "object",
  properties: {
    id: { type: "string" },
    email: { type: "string" },
    role,
    tenantId: { type: ["string", "null"] },
    expiresAt: { type: "string" },
    createdBy: { type: "string" },
  },
};

documentPaths({
  "/admin-tokens": {
    get: op(
      "List admin tokens, newest first (platform: all; tenant admins: their tenant's), never the secret",
      "200",
      pageOf(adminToken),
      { parameters: listParams },
    ),
    post: op(
      "Create an admin token; the 201 response is the only one that carries `token`",
      "201",
      {
        allOf: [adminToken, {
          type: "object",
          properties: { token: { type: "string" } },
        }],
      },
      {
        requestBody: requestBody(adminTokenCreateSchema),
      },
    ),
  },
  "/admin-tokens/{tokenId}": {
    parameters: [path("tokenId", "Admin token id")],
    delete: op("Revoke an admin token (idempotent)", "200", adminToken),
  },
  "/users": {
    get: op(
      "List users with last sign-in (platform: all; tenant tokens: their tenant's members)",
      "200",
      pageOf(user),
      { parameters: listParams },
    ),
  },
  "/users/{userId}/disable": {
    parameters: [path("userId", "User id")],
    post: op("Disable a user; their sessions end at once", "200", user),
  },
  "/users/{userId}/enable": {
    parameters: [path("userId", "User id")],
    post: op("Enable a disabled user", "200", user),
  },
  "/users/{userId}/password-reset": {
    parameters: [path("userId", "User id")],
    post: op(
      "Issue a one-time password reset link (valid 24 h, replaces an earlier one; using it ends the user's sessions)",
      "201",
      {
        type: "object",
        properties: {
          id: { type: "string" },
          userId: { type: "string" },
          email: { type: "string" },
          expiresAt: { type: "string" },
          link: { type: "string" },
        },
      },
    ),
  },
  "/invites/{inviteId}": {
    parameters: [path("inviteId", "Invite id")],
    delete: op("Revoke a pending invite", "200", invite),
  },
});
