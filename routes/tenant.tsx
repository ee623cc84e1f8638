/** One tenant: its API keys, limits, members, and settings. */
import { Hono } from "hono";
import type { Context } from "hono";
import { Island } from "../components/Island.tsx";
import {
  Alert,
  Badge,
  Card,
  Field,
  fmtTime,
  PostForm,
  Table,
} from "../components/ui.tsx";
import ConfirmSubmit from "../islands/ConfirmSubmit.tsx";
import CopyButton from "../islands/CopyButton.tsx";
import { createApiKey, listApiKeys, revokeApiKey } from "../store/api_keys.ts";
import { NotFoundError, ServiceError } from "../store/errors.ts";
import {
  getTenantLimits,
  LIMIT_FIELDS,
  type Limits,
  setTenantLimits,
} from "../store/limits.ts";
import { isPlatform } from "../store/principal.ts";
import { SCOPES } from "../store/schemas.ts";
import { getTenant, updateTenant } from "../store/tenants.ts";
import { quotaStatus } from "../store/quota/mod.ts";
import { QuotaTable } from "../components/dashboard.tsx";
import { AlertList } from "../components/budgets.tsx";
import { listAlerts, openAlertCount } from "../store/budget_alerts.ts";
import { createInvite, listUsers, setUserDisabled } from "../store/users.ts";
import type { PortalEnv } from "./_env.ts";
import { page, str } from "./_page.tsx";

type C = Context<PortalEnv>;

/** Flash state for one render of the tenant page. */
interface Flash {
  ok?: string;
  error?: string;
  section?: "keys" | "limits" | "members" | "settings";
  newKey?: { key: string; name: string };
  inviteLink?: string;
  limitsInput?: Record<string, string>;
}

const LIMIT_LABELS: Record<keyof Limits, string> = {
  rpm: "Requests / minute",
  tpm: "Tokens / minute",
  concurrency: "Concurrent requests",
  tokensPerDay: "Tokens / day",
  tokensPerMonth: "Tokens / month",
};

function limitsFromForm(
  body: Record<string, unknown>,
): Record<string, number | null> {
  const out: Record<string, number | null> = {};
  for (const f of LIMIT_FIELDS) {
    const raw = str(body[f]).trim();
    out[f] = raw === "" ? null : Number(raw);
  }
  return out;
}

async function view(c: C, flash: Flash = {}, status: 200 | 400 | 409 = 200) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const id = c.req.param("id")!;
  const tenant = await getTenant(store, p, id);
  const [keys, limits, members, quota, alerts, openAlerts] = await Promise
    .all([
      listApiKeys(store, p, id, { limit: 100 }),
      getTenantLimits(store, p, id),
      listUsers(store, p, id, { limit: 100 }),
      quotaStatus(store, p, id),
      listAlerts(store, p, id, { limit: 5 }),
      openAlertCount(store, id),
    ]);
  const canWrite = p.role !== "tenant_viewer";
  const csrf = c.get("csrf");
  const err = (s: Flash["section"]) =>
    flash.error && flash.section === s
      ? <Alert tone="error">{flash.error}</Alert>
      : null;
  return page(
    c,
    tenant.name,
    isPlatform(p) ? "/tenants" : `/tenants/${id}`,
    (
      <>
        <h1>
          {tenant.name}{" "}
          <Badge tone={tenant.status === "active" ? "ok" : "danger"}>
            {tenant.status}
          </Badge>{" "}
          {openAlerts > 0 && (
            <a
              href={`/tenants/${id}/budgets#alerts`}
              data-testid="tenant-alerts"
            >
              <Badge tone="warn">
                {openAlerts} budget alert{openAlerts === 1 ? "" : "s"}
              </Badge>
            </a>
          )}
        </h1>
        <p class="sub mono">{tenant.slug} · {tenant.id}</p>
        {flash.ok && <Alert tone="ok">{flash.ok}</Alert>}
        {flash.newKey && (
          <Card title="Your new API key" id="new-key">
            <Alert tone="warn">
              Copy this key now. It is shown only once and cannot be recovered;
              create a new one if it is lost.
            </Alert>
            <div class="row" style="align-items:center">
              <code class="secret" id="secret-value" data-testid="new-key">
                {flash.newKey.key}
              </code>
              <Island
                name="CopyButton"
                component={CopyButton}
                props={{ text: flash.newKey.key, label: "Copy key" }}
              />
            </div>
          </Card>
        )}
        <Card title="Quota status" id="quota">
          <QuotaTable rows={quota} />
          <p class="row" style="margin-top:12px">
            <a class="btn small" href={`/usage?tenant=${id}&range=30d`}>
              Usage charts →
            </a>
            <a class="btn small" href={`/tenants/${id}/statements`}>
              Monthly statements →
            </a>
          </p>
        </Card>
        <Card title="Budget alerts" id="alerts">
          <AlertList
            alerts={alerts.items}
            ackAction={canWrite
              ? (a) => `/tenants/${id}/alerts/${a.id}/ack`
              : null}
            csrf={csrf}
            next={`/tenants/${id}`}
          />
          <p class="row" style="margin-top:12px">
            <a class="btn small" href={`/tenants/${id}/budgets`}>
              Budgets, webhooks and deliveries →
            </a>
          </p>
        </Card>
        <Card title="API keys" id="keys">
          {err("keys")}
          <Table
            head={[
              "Name",
              "Key",
              "Scopes",
              "Created",
              "Expires",
              "Last used",
              "",
            ]}
            rows={keys.items.length}
            empty="No keys yet."
          >
            {keys.items.map((key) => (
              <tr key={key.id} data-key-id={key.id}>
                <td>{key.name}</td>
                <td class="mono">{key.prefix}…{key.last4}</td>
                <td>
                  {key.scopes.join(", ")}
                  {key.models
                    ? <div class="muted">models: {key.models.join(", ")}</div>
                    : null}
                </td>
                <td>{fmtTime(key.createdAt)}</td>
                <td>{fmtTime(key.expiresAt)}</td>
                <td>{fmtTime(key.lastUsedAt)}</td>
                <td>
                  {key.revokedAt
                    ? <Badge tone="danger">revoked</Badge>
                    : canWrite && (
                      <PostForm
                        action={`/tenants/${id}/keys/${key.id}/revoke`}
                        csrf={csrf}
                      >
                        <Island
                          name="ConfirmSubmit"
                          component={ConfirmSubmit}
                          props={{
                            label: "Revoke",
                            confirmLabel: "Yes, revoke",
                            question: "Clients using it stop working.",
                          }}
                        />
                      </PostForm>
                    )}
                </td>
              </tr>
            ))}
          </Table>
          {canWrite && (
            <PostForm
              action={`/tenants/${id}/keys`}
              csrf={csrf}
              style="margin-top:16px"
            >
              <div class="row">
                <Field
                  label="New key name"
                  name="name"
                  required
                  maxLength={100}
                  placeholder="e.g. production app"
                />
                <Field
                  label="Expires"
                  name="expiresAt"
                  type="datetime-local"
                  hint="optional (UTC)"
                />
                <Field
                  label="Models"
                  name="models"
                  hint="optional, comma-separated"
                  placeholder="all models"
                />
              </div>
              <div class="field">
                <label>Scopes</label>
                <div class="checks">
                  {SCOPES.map((s) => (
                    <label key={s}>
                      <input type="checkbox" name="scopes" value={s} checked />
                      {" "}
                      {s}
                    </label>
                  ))}
                </div>
              </div>
              <button class="primary" type="submit">Create key</button>
            </PostForm>
          )}
        </Card>
        <div class="grid2">
          <Card title="Limits" id="limits">
            {err("limits")}
            <p class="muted">
              Empty means unlimited. Keys can have tighter limits of their own.
              {!isPlatform(p) &&
                " Your provider sets these; ask them to change your plan."}
            </p>
            <PostForm action={`/tenants/${id}/limits`} csrf={csrf}>
              {LIMIT_FIELDS.map((f) => (
                <Field
                  key={f}
                  label={LIMIT_LABELS[f]}
                  name={f}
                  type="number"
                  min={0}
                  value={flash.limitsInput ? flash.limitsInput[f] : limits[f]}
                />
              ))}
              {isPlatform(p) && (
                <button class="primary" type="submit">Save limits</button>
              )}
            </PostForm>
          </Card>
          <Card title="Members" id="members">
            {err("members")}
            {flash.inviteLink && (
              <Alert tone="ok">
                Invite link (one-time, valid 7 days):{" "}
                <code class="mono" data-testid="invite-link">
                  {flash.inviteLink}
                </code>
              </Alert>
            )}
            <Table
              head={["Email", "Role", "Status"]}
              rows={members.items.length}
              empty="No members yet."
            >
              {members.items.map((u) => (
                <tr key={u.id}>
                  <td>{u.email}</td>
                  <td>{u.role.replace("_", " ")}</td>
                  <td>
                    {u.disabled
                      ? <Badge tone="danger">disabled</Badge>
                      : <Badge tone="ok">active</Badge>}
                  </td>
                </tr>
              ))}
            </Table>
            {canWrite && (
              <PostForm
                action={`/tenants/${id}/invites`}
                csrf={csrf}
                style="margin-top:16px"
              >
                <Field
                  label="Invite by email"
                  name="email"
                  type="email"
                  required
                />
                <div class="field">
                  <label for="f-role">Role</label>
                  <select id="f-role" name="role">
                    <option value="tenant_admin">Tenant admin</option>
                    <option value="tenant_viewer">Viewer (read only)</option>
                  </select>
                </div>
                <button type="submit">Create invite link</button>
              </PostForm>
            )}
          </Card>
        </div>
        {isPlatform(p) && (
          <Card title="Settings" id="settings">
            {err("settings")}
            <div class="row">
              <PostForm
                action={`/tenants/${id}`}
                csrf={csrf}
                class="row"
                style="flex:1"
              >
                <Field
                  label="Name"
                  name="name"
                  value={tenant.name}
                  required
                  maxLength={100}
                />
                <div class="field" style="flex:0">
                  <button type="submit">Rename</button>
                </div>
              </PostForm>
              <PostForm action={`/tenants/${id}`} csrf={csrf}>
                <input
                  type="hidden"
                  name="status"
                  value={tenant.status === "active" ? "suspended" : "active"}
                />
                <div class="field">
                  {tenant.status === "active"
                    ? (
                      <button type="submit" class="danger">
                        Suspend tenant
                      </button>
                    )
                    : (
                      <button type="submit" class="primary">
                        Resume tenant
                      </button>
                    )}
                </div>
              </PostForm>
            </div>
          </Card>
        )}
      </>
    ),
    status,
  );
}

async function attempt(
  c: C,
  section: Flash["section"],
  fn: () => Promise<Flash>,
) {
  try {
    return await view(c, await fn());
  } catch (err) {
    if (
      !(err instanceof ServiceError) || err.status === 404 || err.status === 403
    ) throw err;
    const body = await c.req.parseBody();
    const limitsInput = section === "limits"
      ? Object.fromEntries(LIMIT_FIELDS.map((f) => [f, str(body[f])]))
      : undefined;
    return await view(
      c,
      { error: err.message, section, limitsInput },
      err.status === 409 ? 409 : 400,
    );
  }
}

/** `/tenants/:id` pages and their form posts. */
export const tenantDetailRoutes = new Hono<PortalEnv>()
  .get(
    "/:id",
    (c) => view(c, c.req.query("created") ? { ok: "Tenant created." } : {}),
  )
  .post("/:id", (c) =>
    attempt(c, "settings", async () => {
      const body = await c.req.parseBody();
      const patch: Record<string, string> = {};
      if (str(body.name)) patch.name = str(body.name);
      if (str(body.status)) patch.status = str(body.status);
      const t = await updateTenant(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("id"),
        patch,
      );
      return {
        ok: patch.status
          ? `Tenant ${t.status === "active" ? "resumed" : "suspended"}.`
          : "Tenant renamed.",
      };
    }))
  .post("/:id/keys", (c) =>
    attempt(c, "keys", async () => {
      const body = await c.req.parseBody({ all: true });
      const scopes = ([] as unknown[]).concat(body.scopes ?? []).map(str);
      const models = str(body.models).split(",").map((s) => s.trim()).filter(
        Boolean,
      );
      const exp = str(body.expiresAt);
      const { key, apiKey } = await createApiKey(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("id"),
        {
          name: str(body.name),
          scopes,
          models: models.length ? models : null,
          expiresAt: exp
            ? new Date(exp + (exp.length === 16 ? ":00Z" : "Z")).toISOString()
            : null,
        },
      );
      return {
        newKey: { key, name: apiKey.name },
        ok: `Key "${apiKey.name}" created.`,
      };
    }))
  .post("/:id/keys/:keyId/revoke", (c) =>
    attempt(c, "keys", async () => {
      const store = c.get("deps").store;
      const p = c.get("principal")!;
      const tenantId = c.req.param("id");
      await getTenant(store, p, tenantId);
      const key = await revokeApiKey(store, p, c.req.param("keyId"), tenantId);
      return { ok: `Key "${key.name}" revoked.` };
    }))
  .post("/:id/limits", (c) =>
    attempt(c, "limits", async () => {
      const body = await c.req.parseBody();
      await setTenantLimits(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("id"),
        limitsFromForm(body),
      );
      return { ok: "Limits saved." };
    }))
  .post(
    "/:id/users/:userId/:action{disable|enable}",
    (c) =>
      attempt(c, "members", async () => {
        const store = c.get("deps").store;
        const p = c.get("principal")!;
        const members = await listUsers(store, p, c.req.param("id"), {
          limit: 200,
        });
        if (!members.items.some((u) => u.id === c.req.param("userId"))) {
          throw new NotFoundError("User");
        }
        const disable = c.req.param("action") === "disable";
        const u = await setUserDisabled(
          store,
          p,
          c.req.param("userId"),
          disable,
        );
        return {
          ok: `${u.email} ${
            disable ? "disabled: their sessions ended" : "enabled"
          }.`,
        };
      }),
  )
  .post("/:id/invites", (c) =>
    attempt(c, "members", async () => {
      const body = await c.req.parseBody();
      const { token } = await createInvite(
        c.get("deps").store,
        c.get("principal")!,
        {
          email: str(body.email),
          role: str(body.role),
          tenantId: c.req.param("id"),
        },
      );
      return {
        ok: "Invite created.",
        inviteLink: `${c.get("deps").config.publicUrl}/invite/${token}`,
      };
    }));
