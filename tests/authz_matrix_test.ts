/**
 * Authorization matrix generated from the router: every route × (platform
 * admin, tenant A admin, tenant A viewer, anonymous) × objects of tenant B.
 * No principal but the platform admin may read or change B's data. A route
 * missing from COVERAGE fails the test, so new routes must be classified.
 */
import assert from "node:assert/strict";
import { createAdminToken } from "../store/admin_tokens.ts";
import { createApiKey } from "../store/api_keys.ts";
import { checkBudgets } from "../store/budget_alerts.ts";
import { setKeyBudget, setTenantBudget } from "../store/budgets.ts";
import { setTenantLimits } from "../store/limits.ts";
import { writeUsage } from "../store/usage_rollups.ts";
import { createWebhook } from "../store/webhooks.ts";
import { setPasswordSignIn } from "../store/sign_in_policy.ts";
import { createProvider } from "../store/sso_providers.ts";
import { SYSTEM } from "../store/principal.ts";
import { createInvite, createUser } from "../store/users.ts";
import { createWorld, portalLogin, type TestWorld } from "./_helpers.ts";

/** How a route is reached and what it may show. */
type Cover =
  | { kind: "tenant-b" } // params point at tenant B's objects: must never leak or change
  | { kind: "public" } // reachable signed out; shows no tenant data
  | { kind: "platform-only" } // lists across tenants: only platform admins get data
  | { kind: "own" }; // no tenant param: must only show the caller's own tenant

const COVERAGE: Record<string, Cover> = {
  // admin API
  "GET /api/admin/v1/openapi.json": { kind: "public" },
  "GET /healthz": { kind: "public" },
  "POST /api/admin/v1/tenants": { kind: "platform-only" },
  "GET /api/admin/v1/tenants": { kind: "own" },
  "GET /api/admin/v1/tenants/:id": { kind: "tenant-b" },
  "PATCH /api/admin/v1/tenants/:id": { kind: "tenant-b" },
  "GET /api/admin/v1/tenants/:id/limits": { kind: "tenant-b" },
  "PUT /api/admin/v1/tenants/:id/limits": { kind: "tenant-b" },
  "POST /api/admin/v1/tenants/:id/keys": { kind: "tenant-b" },
  "GET /api/admin/v1/tenants/:id/keys": { kind: "tenant-b" },
  "GET /api/admin/v1/tenants/:id/users": { kind: "tenant-b" },
  "GET /api/admin/v1/keys/:id": { kind: "tenant-b" },
  "DELETE /api/admin/v1/keys/:id": { kind: "tenant-b" },
  "POST /api/admin/v1/invites": { kind: "tenant-b" },
  "GET /api/admin/v1/audit": { kind: "own" },
  "GET /api/admin/v1/usage": { kind: "own" },
  "GET /api/admin/v1/statements": { kind: "own" },
  "GET /api/admin/v1/settings/pricing": { kind: "platform-only" },
  "GET /api/admin/v1/capacity": { kind: "platform-only" },
  "PUT /api/admin/v1/settings/pricing": { kind: "platform-only" },
  // admin tokens, users and invites (routes/api/accounts.ts)
  "POST /api/admin/v1/admin-tokens": { kind: "tenant-b" },
  "GET /api/admin/v1/admin-tokens": { kind: "own" },
  "DELETE /api/admin/v1/admin-tokens/:tokenId": { kind: "tenant-b" },
  "GET /api/admin/v1/users": { kind: "own" },
  "POST /api/admin/v1/users/:userId/disable": { kind: "tenant-b" },
  "POST /api/admin/v1/users/:userId/enable": { kind: "tenant-b" },
  "POST /api/admin/v1/users/:userId/password-reset": { kind: "tenant-b" },
  "GET /api/admin/v1/invites": { kind: "own" },
  "DELETE /api/admin/v1/invites/:inviteId": { kind: "tenant-b" },
  // retention, export and deletion (issue 31)
  "GET /api/admin/v1/tenants/:id/retention": { kind: "tenant-b" },
  "PUT /api/admin/v1/tenants/:id/retention": { kind: "tenant-b" },
  "GET /api/admin/v1/tenants/:id/export": { kind: "tenant-b" },
  "DELETE /api/admin/v1/tenants/:id": { kind: "tenant-b" },
  "POST /api/admin/v1/tenants/:id/deletion/cancel": { kind: "tenant-b" },
  "GET /api/admin/v1/settings/retention": { kind: "platform-only" },
  "GET /tenants/:id/retention": { kind: "tenant-b" },
  "POST /tenants/:id/retention": { kind: "tenant-b" },
  "GET /tenants/:id/export": { kind: "tenant-b" },
  "GET /tenants/:id/delete": { kind: "tenant-b" },
  "POST /tenants/:id/delete": { kind: "tenant-b" },
  "GET /tenants/:id/deletion/cancel": { kind: "tenant-b" },
  "POST /tenants/:id/deletion/cancel": { kind: "tenant-b" },
  "PUT /api/admin/v1/settings/retention": { kind: "platform-only" },
  // portal
  "GET /login": { kind: "public" },
  "POST /login": { kind: "public" },
  "POST /logout": { kind: "public" },
  "GET /setup": { kind: "public" },
  "POST /setup": { kind: "public" },
  "GET /invite/:token": { kind: "public" },
  "POST /invite/:token": { kind: "public" },
  "GET /": { kind: "own" },
  "GET /tenants": { kind: "own" },
  "POST /tenants": { kind: "platform-only" },
  "GET /tenants/:id": { kind: "tenant-b" },
  "POST /tenants/:id": { kind: "tenant-b" },
  "POST /tenants/:id/keys": { kind: "tenant-b" },
  "POST /tenants/:id/keys/:keyId/revoke": { kind: "tenant-b" },
  "POST /tenants/:id/limits": { kind: "tenant-b" },
  "POST /tenants/:id/invites": { kind: "tenant-b" },
  "POST /tenants/:id/users/:userId/:action{disable|enable}": {
    kind: "tenant-b",
  },
  "GET /audit": { kind: "own" },
  "GET /reset/:token": { kind: "public" },
  "POST /reset/:token": { kind: "public" },
  "GET /admin-tokens": { kind: "own" },
  "POST /admin-tokens": { kind: "tenant-b" },
  "POST /admin-tokens/:tokenId/revoke": { kind: "tenant-b" },
  "GET /users": { kind: "own" },
  "POST /users/:userId/:action{disable|enable}": { kind: "tenant-b" },
  "POST /users/:userId/reset-password": { kind: "tenant-b" },
  "POST /users/invites": { kind: "tenant-b" },
  "POST /users/invites/:inviteId/reissue": { kind: "tenant-b" },
  "POST /users/invites/:inviteId/revoke": { kind: "tenant-b" },
  // dashboards
  "GET /usage": { kind: "own" },
  "GET /settings": { kind: "platform-only" },
  "POST /settings": { kind: "platform-only" },
  "GET /chargeback": { kind: "platform-only" },
  "GET /chargeback/:month": { kind: "platform-only" },
  "GET /api/admin/v1/chargeback": { kind: "platform-only" },
  "GET /tenants/:id/statements": { kind: "tenant-b" },
  "GET /tenants/:id/statements/:month": { kind: "tenant-b" },
  "GET /tenants/:id/statements/:month/:format{csv|json}": { kind: "tenant-b" },
  // key management and the request log (issue 28)
  "PATCH /api/admin/v1/keys/:id": { kind: "tenant-b" },
  "POST /api/admin/v1/keys/:id/rotate": { kind: "tenant-b" },
  "GET /api/admin/v1/tenants/:id/requests": { kind: "tenant-b" },
  "GET /tenants/:id/keys/:keyId": { kind: "tenant-b" },
  "GET /tenants/:id/keys/:keyId/edit": { kind: "tenant-b" },
  "POST /tenants/:id/keys/:keyId/edit": { kind: "tenant-b" },
  "GET /tenants/:id/keys/:keyId/rotate": { kind: "tenant-b" },
  "POST /tenants/:id/keys/:keyId/rotate": { kind: "tenant-b" },
  "GET /tenants/:id/requests": { kind: "tenant-b" },
  "GET /settings/request-log": { kind: "platform-only" },
  "POST /settings/request-log": { kind: "platform-only" },
  "GET /nodes": { kind: "platform-only" },
  "POST /nodes/:id/drain": { kind: "platform-only" },
  "POST /nodes/:id/undrain": { kind: "platform-only" },
  "POST /nodes/:id/remove": { kind: "platform-only" },
  "POST /nodes/join-tokens": { kind: "platform-only" },
  "GET /nodes/events": { kind: "platform-only" },
  "GET /mesh": { kind: "platform-only" },
  "POST /mesh/test-all": { kind: "platform-only" },
  "GET /mesh/progress": { kind: "platform-only" },
  "GET /models": { kind: "platform-only" },
  // model placement and aliases (issue 31)
  "GET /models/nodes/:id/placement": { kind: "platform-only" },
  "POST /models/nodes/:id/placement": { kind: "platform-only" },
  "GET /models/rules": { kind: "platform-only" },
  "POST /models/rules": { kind: "platform-only" },
  "GET /models/rules/:id/remove": { kind: "platform-only" },
  "POST /models/rules/:id/remove": { kind: "platform-only" },
  "GET /models/spans": { kind: "platform-only" },
  "POST /models/spans": { kind: "platform-only" },
  "GET /models/spans/remove": { kind: "platform-only" },
  "POST /models/spans/remove": { kind: "platform-only" },
  "GET /models/aliases": { kind: "platform-only" },
  "POST /models/aliases": { kind: "platform-only" },
  "GET /models/aliases/remove": { kind: "platform-only" },
  "POST /models/aliases/remove": { kind: "platform-only" },
  "GET /api/admin/v1/models": { kind: "platform-only" },
  "PUT /api/admin/v1/nodes/:id/placement": { kind: "platform-only" },
  "POST /api/admin/v1/placement/rules": { kind: "platform-only" },
  "DELETE /api/admin/v1/placement/rules/:rule": { kind: "platform-only" },
  "PUT /api/admin/v1/models/:id/span": { kind: "platform-only" },
  "DELETE /api/admin/v1/models/:id/span": { kind: "platform-only" },
  "GET /api/admin/v1/model-aliases": { kind: "platform-only" },
  "PUT /api/admin/v1/model-aliases/:alias": { kind: "platform-only" },
  "DELETE /api/admin/v1/model-aliases/:alias": { kind: "platform-only" },
  "GET /playground": { kind: "own" },
  "GET /capacity": { kind: "platform-only" },
  "GET /capacity/export.csv": { kind: "platform-only" },
  "GET /capacity/export.json": { kind: "platform-only" },
  // a plain GET of a form's address goes to its page (issue 28)
  "GET /favicon.ico": { kind: "public" },
  "GET /logout": { kind: "public" },
  "GET /tenants/:id/keys": { kind: "tenant-b" },
  "GET /tenants/:id/keys/:keyId/revoke": { kind: "tenant-b" },
  "GET /tenants/:id/limits": { kind: "tenant-b" },
  "GET /tenants/:id/users/:userId/:action{disable|enable}": {
    kind: "tenant-b",
  },
  "GET /tenants/:id/invites": { kind: "tenant-b" },
  "GET /tenants/:id/invites/:inviteId/revoke": { kind: "tenant-b" },
  "POST /tenants/:id/invites/:inviteId/revoke": { kind: "tenant-b" },
  "GET /nodes/:id/drain": { kind: "platform-only" },
  "GET /nodes/:id/undrain": { kind: "platform-only" },
  "GET /nodes/:id/remove": { kind: "platform-only" },
  "GET /nodes/:id/dedication": { kind: "platform-only" },
  "POST /nodes/:id/dedication": { kind: "platform-only" },
  "GET /nodes/join-tokens": { kind: "platform-only" },
  "GET /mesh/test-all": { kind: "platform-only" },
  "GET /admin-tokens/:tokenId/revoke": { kind: "own" },
  "GET /users/invites": { kind: "own" },
  "GET /users/invites/:inviteId/:action{reissue|revoke}": { kind: "own" },
  "GET /users/:userId/:action{disable|enable|reset-password}": { kind: "own" },
  // fleet (platform admins only) and the node-facing API (node JWTs only)
  "GET /metrics": { kind: "platform-only" },
  "POST /api/node/v1/enroll": { kind: "platform-only" },
  "POST /api/node/v1/heartbeat": { kind: "platform-only" },
  "POST /api/admin/v1/join-tokens": { kind: "platform-only" },
  "GET /api/admin/v1/join-tokens": { kind: "platform-only" },
  "GET /api/admin/v1/nodes": { kind: "platform-only" },
  "GET /api/admin/v1/nodes/:id": { kind: "platform-only" },
  "POST /api/admin/v1/nodes/:id/drain": { kind: "platform-only" },
  "POST /api/admin/v1/nodes/:id/undrain": { kind: "platform-only" },
  "PUT /api/admin/v1/nodes/:id/dedication": { kind: "platform-only" },
  "DELETE /api/admin/v1/nodes/:id": { kind: "platform-only" },
  "POST /api/admin/v1/links/test": { kind: "platform-only" },
  "POST /api/admin/v1/links/test-all": { kind: "platform-only" },
  "GET /api/admin/v1/links": { kind: "platform-only" },
  "GET /api/admin/v1/instances": { kind: "platform-only" },
  "GET /api/admin/v1/links/progress": { kind: "platform-only" },
  // budgets, alerts and webhooks
  "GET /api/admin/v1/tenants/:id/budgets": { kind: "tenant-b" },
  "GET /api/admin/v1/tenants/:id/budgets/:unit": { kind: "tenant-b" },
  "PUT /api/admin/v1/tenants/:id/budgets/:unit": { kind: "tenant-b" },
  "DELETE /api/admin/v1/tenants/:id/budgets/:unit": { kind: "tenant-b" },
  "GET /api/admin/v1/keys/:id/budgets/:unit": { kind: "tenant-b" },
  "PUT /api/admin/v1/keys/:id/budgets/:unit": { kind: "tenant-b" },
  "DELETE /api/admin/v1/keys/:id/budgets/:unit": { kind: "tenant-b" },
  "GET /api/admin/v1/tenants/:id/alerts": { kind: "tenant-b" },
  "POST /api/admin/v1/tenants/:id/alerts/:alertId/ack": { kind: "tenant-b" },
  "GET /api/admin/v1/alerts": { kind: "platform-only" },
  "GET /api/admin/v1/tenants/:id/webhooks": { kind: "tenant-b" },
  "POST /api/admin/v1/tenants/:id/webhooks": { kind: "tenant-b" },
  "GET /api/admin/v1/tenants/:id/webhooks/deliveries": { kind: "tenant-b" },
  "DELETE /api/admin/v1/tenants/:id/webhooks/:webhookId": { kind: "tenant-b" },
  "GET /api/admin/v1/webhooks": { kind: "platform-only" },
  "POST /api/admin/v1/webhooks": { kind: "platform-only" },
  "GET /api/admin/v1/webhooks/deliveries": { kind: "platform-only" },
  "DELETE /api/admin/v1/webhooks/:webhookId": { kind: "platform-only" },
  "GET /tenants/:id/budgets": { kind: "tenant-b" },
  "POST /tenants/:id/budgets": { kind: "tenant-b" },
  "POST /tenants/:id/budgets/delete": { kind: "tenant-b" },
  "POST /tenants/:id/alerts/:alertId/ack": { kind: "tenant-b" },
  "POST /tenants/:id/webhooks": { kind: "tenant-b" },
  "POST /tenants/:id/webhooks/:webhookId/delete": { kind: "tenant-b" },
  "GET /alerts": { kind: "own" },
  "GET /alerts/webhooks": { kind: "own" },
  "GET /alerts/webhooks/:rest{.*}": { kind: "own" },
  "GET /tenants/:id/:what{budgets/delete|webhooks|webhooks/[^/]+/delete|alerts/[^/]+/ack}":
    { kind: "tenant-b" },
  "POST /alerts/webhooks": { kind: "platform-only" },
  "POST /alerts/webhooks/:webhookId/delete": { kind: "platform-only" },
  // single sign-on: signing in (public) and its settings (platform admins only)
  "GET /sso/:providerId/start": { kind: "public" },
  "GET /sso/:providerId/callback": { kind: "public" },
  "GET /settings/sso": { kind: "platform-only" },
  "GET /settings/sso/providers": { kind: "platform-only" },
  "GET /settings/sso/providers/:rest{.+}": { kind: "platform-only" },
  "GET /settings/sso/password": { kind: "platform-only" },
  "POST /settings/sso/providers": { kind: "platform-only" },
  "POST /settings/sso/providers/:providerId": { kind: "platform-only" },
  "POST /settings/sso/providers/:providerId/delete": { kind: "platform-only" },
  "POST /settings/sso/password": { kind: "platform-only" },
};

interface Caller {
  name: string;
  headers: Record<string, string>;
  csrf: string;
}

async function callers(w: TestWorld): Promise<Caller[]> {
  const out: Caller[] = [];
  for (
    const [name, email, token] of [
      ["tenant A admin", "a-admin@example.com", w.tokens.adminA],
      ["tenant A viewer", "a-viewer@example.com", w.tokens.viewerA],
    ] as const
  ) {
    const { cookie, csrf } = await portalLogin(w, email);
    out.push({
      name,
      headers: { cookie, authorization: `Bearer ${token}` },
      csrf,
    });
  }
  out.push({ name: "anonymous", headers: {}, csrf: "" });
  return out;
}

/** Everything of tenant B that must not leak, as strings to search for. */
interface Secrets {
  needles: string[];
  snapshot: () => Promise<string>;
}

async function seedB(
  w: TestWorld,
): Promise<{ keyId: string; secrets: Secrets }> {
  const b = w.tenantB;
  const { apiKey } = await createApiKey(w.store, SYSTEM, b.id, {
    name: "globex-prod-key",
  });
  // A limit no timestamp or id shows by chance ("777" matched a
  // millisecond in an audit entry's time).
  await setTenantLimits(w.store, SYSTEM, b.id, { rpm: 7_654_321 });
  bUserId = (await createUser(w.store, SYSTEM, {
    email: "boss@globex.test",
    password: w.password,
    role: "tenant_admin",
    tenantId: b.id,
  })).id;
  bTokenId = (await createAdminToken(w.store, SYSTEM, {
    name: "globex-ci-token",
    role: "tenant_admin",
    tenantId: b.id,
  })).record.id;
  bInviteId = (await createInvite(w.store, SYSTEM, {
    email: "invitee@globex.test",
    role: "tenant_viewer",
    tenantId: b.id,
  })).invite.id;
  // B's budgets, a webhook, and an alert (with its delivery queued)
  await setTenantBudget(w.store, SYSTEM, b.id, "money", { amount: "4321.98" });
  await setTenantBudget(w.store, SYSTEM, b.id, "tokens", {
    amount: 5,
    thresholds: [10],
  });
  await setKeyBudget(w.store, SYSTEM, apiKey.id, "tokens", { amount: 4 });
  bWebhookId = (await createWebhook(w.store, SYSTEM, b.id, {
    url: "https://globex-hooks.example/orchard",
  }, false)).webhook.id;
  await writeUsage(w.store, [{
    id: "b-usage",
    at: new Date().toISOString(),
    requestId: "b-req-7d1e",
    tenantId: b.id,
    keyId: apiKey.id,
    model: "m",
    nodeId: null,
    endpoint: "chat",
    promptTokens: 3,
    completionTokens: 3,
    latencyMs: 1,
    ttftMs: 1,
    status: 200,
    outcome: "ok",
  }]);
  bAlertId = (await checkBudgets(w.store, b.id))[0]!.id;
  // B's own identity provider (its button label and id are public, on the
  // sign-in page; its issuer, client id and rules are not) and SSO-only
  await createProvider(w.store, SYSTEM, {
    id: "partner-idp",
    displayName: "Partner IdP",
    issuer: "https://login.globex-idp.example",
    clientId: "globex-client-id",
    clientSecret: "globex-client-secret",
    tenantId: b.id,
    rules: [{
      claim: "groups",
      op: "contains",
      value: "globex-admins",
      tenant: null,
      role: "tenant_admin",
    }],
  });
  await setPasswordSignIn(w.store, SYSTEM, b.id, false);
  const snapshot = async () => {
    const parts: unknown[] = [];
    for (
      const prefix of [
        ["tenant", b.id],
        ["tenant_limits", b.id],
        ["api_key", apiKey.id],
        ["tenant_user", b.id],
        ["tenant_api_key", b.id],
        ["user", bUserId],
        ["admin_token", bTokenId],
        ["tenant_admin_token", b.id],
        ["tenant_invite", b.id],
        ["invite", bInviteId],
        ["user_password_reset", bUserId],
        ["budget", b.id],
        ["budget_alert", b.id],
        ["webhook_by_owner", b.id],
        ["webhook", bWebhookId],
        ["webhook_delivery_by_owner", b.id],
        ["sso_provider", "partner-idp"],
        ["tenant_password_off", b.id],
        ["usage", b.id],
        ["request_log_idx", b.id],
        ["config", "settings"],
      ]
    ) {
      for await (const e of w.kv.list({ prefix })) parts.push([e.key, e.value]);
    }
    return JSON.stringify(parts);
  };
  return {
    keyId: apiKey.id,
    secrets: {
      needles: [
        "Globex",
        "globex-prod-key",
        "boss@globex.test",
        "globex-ci-token",
        "invitee@globex.test",
        bTokenId,
        bInviteId,
        b.id,
        apiKey.id,
        "7654321",
        "7,654,321", // as the portal shows it
        "4321.98",
        "globex-hooks",
        "globex-idp",
        "globex-client",
        "globex-admins",
        "b-req-7d1e", // a request in B's request log
      ],
      snapshot,
    },
  };
}

let bUserId = "";
let bTokenId = "";
let bInviteId = "";
let bWebhookId = "";
let bAlertId = "";

function fill(path: string, tenantId: string, keyId: string): string {
  return path.replace(":tokenId", bTokenId).replace(":inviteId", bInviteId)
    .replace(":keyId", keyId).replace(":token", "x.y")
    .replace(":unit", "money").replace(":alertId", bAlertId)
    .replace(":webhookId", bWebhookId)
    .replace(":userId", bUserId).replace(":action{disable|enable}", "disable")
    .replace(/\/keys\/:id/, `/keys/${keyId}`).replace(":id", tenantId)
    .replace(":month", new Date().toISOString().slice(0, 7))
    .replace(":format{csv|json}", "json");
}

const BODY: Record<string, unknown> = {
  name: "pwned",
  status: "suspended",
  rpm: 1,
  email: "evil@x.test",
  role: "tenant_admin",
  scopes: "chat",
  grace: "0",
  confirm: "1",
  graceSeconds: 0,
  retentionDays: 1,
};

Deno.test("authorization matrix: no route leaks or changes tenant B's data for A's admin, A's viewer or anonymous", async () => {
  const w = await createWorld();
  const { keyId, secrets } = await seedB(w);
  const before = await secrets.snapshot();
  const routes = w.app.routes.filter((r) =>
    r.method !== "ALL" && !r.path.includes("*")
  );
  const seen = new Set<string>();
  const missing: string[] = [];
  for (const r of routes) {
    const id = `${r.method} ${r.path}`;
    if (seen.has(id)) continue;
    seen.add(id);
    if (!COVERAGE[id]) missing.push(id);
  }
  assert.deepEqual(missing, [], "routes without authorization coverage");
  const who = await callers(w);
  let checked = 0;
  for (const id of seen) {
    const cover = COVERAGE[id]!;
    const [method, path] = id.split(" ") as [string, string];
    for (const caller of who) {
      const url = fill(path, w.tenantB.id, keyId);
      const isApi = url.startsWith("/api/");
      const headers: Record<string, string> = {
        ...caller.headers,
        host: "localhost",
        origin: "http://localhost",
      };
      let body: string | undefined;
      if (method !== "GET") {
        if (isApi) {
          headers["content-type"] = "application/json";
          body = JSON.stringify({
            ...BODY,
            scopes: ["chat"],
            tenantId: w.tenantB.id,
          });
        } else {
          headers["content-type"] = "application/x-www-form-urlencoded";
          body = new URLSearchParams({
            ...BODY as Record<string, string>,
            tenantId: w.tenantB.id,
            _csrf: caller.csrf,
          }).toString();
        }
      }
      const query = method === "GET" &&
          /\/(audit|tenants|usage|statements|users|admin-tokens|invites)$/
            .test(path)
        ? `?tenant=${w.tenantB.id}&search=glob&month=${
          new Date().toISOString().slice(0, 7)
        }`
        : "";
      const res = await w.app.request(url + query, { method, headers, body });
      const text = await res.text();
      checked++;
      assert.ok(res.status < 500, `${id} as ${caller.name}: ${res.status}`);
      for (const needle of secrets.needles) {
        assert.ok(
          !text.includes(needle),
          `${id} as ${caller.name} leaked ${needle} (${res.status})`,
        );
      }
      if (cover.kind === "tenant-b" || cover.kind === "platform-only") {
        assert.ok(
          [303, 400, 401, 403, 404].includes(res.status),
          `${id} as ${caller.name}: status ${res.status}`,
        );
        if (res.status === 303) {
          assert.match(res.headers.get("location") ?? "", /^\/login/);
        }
      }
    }
  }
  assert.equal(await secrets.snapshot(), before, "tenant B's data changed");
  assert.ok(checked >= seen.size * 3);
  await w.close();
});

Deno.test("authorization matrix: the platform admin does see tenant B", async () => {
  const w = await createWorld();
  const { keyId } = await seedB(w);
  const h = { authorization: `Bearer ${w.tokens.platform}` };
  for (
    const path of [
      `/api/admin/v1/tenants/${w.tenantB.id}`,
      `/api/admin/v1/keys/${keyId}`,
      `/api/admin/v1/admin-tokens?tenant=${w.tenantB.id}`,
      `/api/admin/v1/users?tenant=${w.tenantB.id}`,
      `/api/admin/v1/invites?tenant=${w.tenantB.id}`,
      `/api/admin/v1/tenants/${w.tenantB.id}/budgets`,
      `/api/admin/v1/tenants/${w.tenantB.id}/alerts`,
      `/api/admin/v1/tenants/${w.tenantB.id}/webhooks/deliveries`,
      `/api/admin/v1/tenants/${w.tenantB.id}/requests`,
    ]
  ) {
    const res = await w.app.request(path, { headers: h });
    assert.equal(res.status, 200);
    assert.ok((await res.text()).includes(w.tenantB.id));
  }
  // the SSO settings show B's provider to the platform admin only
  const root = await portalLogin(w, "root@example.com");
  const sso = await w.app.request("/settings/sso", {
    headers: { cookie: root.cookie, host: "localhost" },
  });
  assert.equal(sso.status, 200);
  const ssoPage = await sso.text();
  assert.ok(ssoPage.includes("globex-client-id"));
  assert.ok(!ssoPage.includes("globex-client-secret"));
  // …while tenant A's admin gets its own tenant's lists without B's
  for (const path of ["admin-tokens", "users", "invites"]) {
    const res = await w.app.request(`/api/admin/v1/${path}`, {
      headers: { authorization: `Bearer ${w.tokens.adminA}` },
    });
    assert.equal(res.status, 200, path);
    const text = await res.text();
    assert.ok(!text.includes(w.tenantB.id), path);
  }
  await w.close();
});

Deno.test("authorization matrix: tenant admins read their own retention and export; only platform admins change the bounds or delete a tenant", async () => {
  const w = await createWorld();
  const a = w.tenantA.id;
  const call = (token: string, method: string, path: string, body?: unknown) =>
    Promise.resolve(w.app.request(`/api/admin/v1${path}`, {
      method,
      headers: {
        authorization: `Bearer ${token}`,
        ...(body ? { "content-type": "application/json" } : {}),
      },
      body: body ? JSON.stringify(body) : undefined,
    })).then(async (r) => {
      await r.body?.cancel();
      return r.status;
    });
  const bounds = {
    defaults: { usage: 90, audit: 365, responses: 30 },
    min: { usage: 1, audit: 30, responses: 1 },
    max: { usage: 730, audit: 3650, responses: 365 },
    deletionGraceDays: 30,
  };
  const { adminA, viewerA, platform } = w.tokens;
  assert.equal(await call(adminA, "GET", `/tenants/${a}/retention`), 200);
  assert.equal(await call(viewerA, "GET", `/tenants/${a}/retention`), 200);
  assert.equal(await call(adminA, "GET", `/tenants/${a}/export`), 200);
  assert.equal(await call(viewerA, "GET", `/tenants/${a}/export`), 403);
  assert.equal(
    await call(adminA, "PUT", `/tenants/${a}/retention`, { usage: 30 }),
    200,
  );
  assert.equal(
    await call(viewerA, "PUT", `/tenants/${a}/retention`, { usage: 30 }),
    403,
  );
  for (const token of [adminA, viewerA]) {
    assert.equal(await call(token, "GET", "/settings/retention"), 403);
    assert.equal(
      await call(token, "PUT", "/settings/retention", bounds),
      403,
    );
    assert.equal(await call(token, "DELETE", `/tenants/${a}`), 403);
    assert.equal(
      await call(token, "POST", `/tenants/${a}/deletion/cancel`),
      403,
    );
  }
  assert.equal(await call(platform, "PUT", "/settings/retention", bounds), 200);
  assert.equal(await call(platform, "DELETE", `/tenants/${a}`), 202);
  assert.equal(
    await call(platform, "POST", `/tenants/${a}/deletion/cancel`),
    200,
  );
  await w.close();
});

Deno.test("authorization matrix: the capacity page, its exports and API answer the platform admin, and 403 to a tenant's admin and viewer", async () => {
  const w = await createWorld();
  await seedB(w);
  const { cookie } = await portalLogin(w, "root@example.com");
  for (
    const path of ["/capacity", "/capacity/export.csv", "/capacity/export.json"]
  ) {
    const res = await w.app.request(path, { headers: { cookie } });
    assert.equal(res.status, 200, path);
    await res.body?.cancel();
  }
  const res = await w.app.request("/api/admin/v1/capacity", {
    headers: { authorization: `Bearer ${w.tokens.platform}` },
  });
  assert.equal(res.status, 200);
  await res.body?.cancel();
  for (const caller of await callers(w)) {
    if (caller.name === "anonymous") continue;
    for (
      const path of [
        "/capacity",
        "/capacity/export.csv",
        "/capacity/export.json",
        "/api/admin/v1/capacity",
      ]
    ) {
      const res = await w.app.request(path, { headers: caller.headers });
      assert.equal(res.status, 403, `${path} as ${caller.name}`);
      await res.body?.cancel();
    }
  }
  await w.close();
});
