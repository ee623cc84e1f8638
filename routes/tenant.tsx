/**
 * One tenant: its API keys, limits, members, pending invites and settings.
 * Every form post that changes something answers 303 to this page (at its
 * section) with a one-time flash (routes/_flash.tsx); errors, which change
 * nothing, render the page directly with what was typed.
 */
import { SecretValue } from "../components/secret.tsx";
import { Hono } from "hono";
import type { Context } from "hono";
import { Island } from "../components/Island.tsx";
import {
  Alert,
  Badge,
  Card,
  Field,
  PostForm,
  Table,
  Time,
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
import {
  isPlatform,
  requirePlatform,
  requireTenantWrite,
} from "../store/principal.ts";
import { SCOPES } from "../store/schemas.ts";
import { getTenant, updateTenant } from "../store/tenants.ts";
import { quotaStatus } from "../store/quota/mod.ts";
import { QuotaTable } from "../components/dashboard.tsx";
import { AlertList } from "../components/budgets.tsx";
import { listAlerts, openAlertCount } from "../store/budget_alerts.ts";
import {
  createInvite,
  listInvites,
  listUsers,
  revokeInvite,
  setUserDisabled,
} from "../store/users.ts";
import { RetentionCard } from "../components/retention.tsx";
import {
  cancelTenantDeletion,
  getTenantRetention,
  RETENTION_KINDS,
  scheduleTenantDeletion,
  setTenantRetention,
} from "../store/retention.ts";
import { exportTenant } from "../store/tenant_export.ts";
import { exportFileName } from "./api/retention.ts";
import { confirmed, confirmPage } from "./_confirm.tsx";
import type { PortalEnv } from "./_env.ts";
import {
  type Flash,
  FlashMessages,
  redirectWithFlash,
  takeFlash,
} from "./_flash.tsx";
import { portalMessage } from "./_messages.ts";
import { page, str } from "./_page.tsx";

type C = Context<PortalEnv>;

type Section = "keys" | "limits" | "members" | "settings" | "retention";

/** An error to show in a section, with what was typed there. */
interface Failure {
  error: string;
  section: Section;
  input: Record<string, string>;
}

const LIMIT_LABELS: Record<keyof Limits, string> = {
  rpm: "Requests / minute",
  tpm: "Tokens / minute",
  concurrency: "Concurrent requests",
  tokensPerDay: "Tokens / day",
  tokensPerMonth: "Tokens / month",
};

/** The largest limit accepted (store/schemas.ts). */
const LIMIT_MAX = 1e12;

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

async function view(
  c: C,
  flash: Flash = {},
  failure: Failure | null = null,
  status: 200 | 400 | 409 = 200,
) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const id = c.req.param("id")!;
  const tenant = await getTenant(store, p, id);
  const canWrite = p.role !== "tenant_viewer";
  const [keys, limits, members, quota, invites, alerts, openAlerts, retention] =
    await Promise.all([
      listApiKeys(store, p, id, { limit: 100 }),
      getTenantLimits(store, p, id),
      listUsers(store, p, id, { limit: 100 }),
      quotaStatus(store, p, id),
      canWrite ? listInvites(store, p, id) : Promise.resolve([]),
      listAlerts(store, p, id, { limit: 5 }),
      openAlertCount(store, id),
      getTenantRetention(store, p, id),
    ]);
  const csrf = c.get("csrf");
  const input = (s: Section, name: string) =>
    failure?.section === s ? failure.input[name] : undefined;
  const messages = (s: Section) => (
    <>
      <FlashMessages flash={flash} section={s} />
      {failure?.section === s && <Alert tone="error">{failure.error}</Alert>}
    </>
  );
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
        <FlashMessages flash={flash} />
        <Card title="Quota status" id="quota">
          <QuotaTable rows={quota} />
          <p class="row" style="margin-top:12px">
            <a class="btn small" href={`/usage?tenant=${id}&range=30d`}>
              Usage charts →
            </a>
            <a class="btn small" href={`/tenants/${id}/statements`}>
              Monthly statements →
            </a>
            <a
              class="btn small"
              href={`/tenants/${id}/requests`}
              data-testid="request-log-link"
            >
              Request log →
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
          {messages("keys")}
          {flash.newKey && (
            <section class="new-key" id="new-key">
              <h3>Your new API key</h3>
              <Alert tone="warn">
                Copy this key now. It is shown only once and cannot be
                recovered; create a new one if it is lost.
              </Alert>
              <SecretValue
                value={flash.newKey.key}
                testid="new-key"
                label="Copy key"
              />
            </section>
          )}
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
                <td>
                  <a
                    href={`/tenants/${id}/keys/${key.id}`}
                    data-testid="key-link"
                    class="trunc"
                    title={key.name}
                  >
                    {key.name}
                  </a>
                </td>
                <td class="mono nowrap">{key.prefix}…{key.last4}</td>
                <td>
                  {key.scopes.join(", ")}
                  {key.models
                    ? <div class="muted">models: {key.models.join(", ")}</div>
                    : null}
                </td>
                <td class="time">
                  <Time iso={key.createdAt} />
                </td>
                <td class="time">
                  <Time iso={key.expiresAt} />
                </td>
                <td class="time">
                  <Time iso={key.lastUsedAt} />
                </td>
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
                  value={input("keys", "name")}
                />
                <Field
                  label="Expires"
                  name="expiresAt"
                  type="datetime-local"
                  hint="optional (UTC)"
                  value={input("keys", "expiresAt")}
                />
                <Field
                  label="Models"
                  name="models"
                  hint="optional, comma-separated"
                  placeholder="all models"
                  value={input("keys", "models")}
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
            {messages("limits")}
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
                  max={LIMIT_MAX}
                  value={failure?.section === "limits"
                    ? failure.input[f]
                    : limits[f]}
                />
              ))}
              {isPlatform(p) && (
                <button class="primary" type="submit">Save limits</button>
              )}
            </PostForm>
          </Card>
          <Card title="Members" id="members">
            {messages("members")}
            {flash.inviteLink && (
              <div class="row" style="align-items:center;margin-bottom:12px">
                <span>
                  Invite link (one-time, valid 7 days, shown once):{" "}
                  <code
                    class="mono"
                    id="secret-value"
                    data-testid="invite-link"
                  >
                    {flash.inviteLink}
                  </code>
                </span>
                <Island
                  name="CopyButton"
                  component={CopyButton}
                  props={{ text: flash.inviteLink, label: "Copy link" }}
                />
              </div>
            )}
            <Table
              head={canWrite
                ? ["Email", "Role", "Status", ""]
                : ["Email", "Role", "Status"]}
              rows={members.items.length}
              empty="No members yet."
            >
              {members.items.map((u) => (
                <tr key={u.id} data-user={u.email}>
                  <td>{u.email}</td>
                  <td>{u.role.replace("_", " ")}</td>
                  <td>
                    {u.disabled
                      ? <Badge tone="danger">disabled</Badge>
                      : <Badge tone="ok">active</Badge>}
                  </td>
                  {canWrite && (
                    <td>
                      {u.id !== p.id && (
                        <PostForm
                          action={`/tenants/${id}/users/${u.id}/${
                            u.disabled ? "enable" : "disable"
                          }`}
                          csrf={csrf}
                        >
                          {u.disabled
                            ? (
                              <button type="submit" class="small">
                                Enable
                              </button>
                            )
                            : (
                              <Island
                                name="ConfirmSubmit"
                                component={ConfirmSubmit}
                                props={{
                                  label: "Disable",
                                  confirmLabel: "Yes, disable",
                                  question: "They are signed out at once.",
                                }}
                              />
                            )}
                        </PostForm>
                      )}
                    </td>
                  )}
                </tr>
              ))}
            </Table>
            {canWrite && (
              <>
                <h3 style="margin-top:16px">Pending invites</h3>
                <Table
                  head={["Email", "Role", "Expires", ""]}
                  rows={invites.length}
                  empty="No pending invites."
                >
                  {invites.map((inv) => (
                    <tr key={inv.id} data-invite={inv.email}>
                      <td>{inv.email}</td>
                      <td>{inv.role.replace("_", " ")}</td>
                      <td class="time">
                        <Time iso={inv.expiresAt} />
                      </td>
                      <td>
                        <PostForm
                          action={`/tenants/${id}/invites/${inv.id}/revoke`}
                          csrf={csrf}
                        >
                          <Island
                            name="ConfirmSubmit"
                            component={ConfirmSubmit}
                            props={{
                              label: "Revoke",
                              confirmLabel: "Yes, revoke",
                              question: "The link stops working.",
                            }}
                          />
                        </PostForm>
                      </td>
                    </tr>
                  ))}
                </Table>
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
                    value={input("members", "email")}
                    hint="inviting again replaces the pending link"
                  />
                  <div class="field">
                    <label for="f-role">Role</label>
                    <select id="f-role" name="role">
                      <option value="tenant_admin">Tenant admin</option>
                      <option
                        value="tenant_viewer"
                        selected={input("members", "role") === "tenant_viewer"}
                      >
                        Viewer (read only)
                      </option>
                    </select>
                  </div>
                  <button type="submit">Create invite link</button>
                </PostForm>
              </>
            )}
          </Card>
        </div>
        <RetentionCard
          tenantId={id}
          retention={retention}
          csrf={csrf}
          canWrite={canWrite}
          platform={isPlatform(p)}
          messages={messages("retention")}
          input={(name) => input("retention", name)}
        />
        {isPlatform(p) && (
          <Card title="Settings" id="settings">
            {messages("settings")}
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
                  value={input("settings", "name") ?? tenant.name}
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
                      <Island
                        name="ConfirmSubmit"
                        component={ConfirmSubmit}
                        props={{
                          label: "Suspend tenant",
                          confirmLabel: "Yes, suspend",
                          question:
                            "Its keys stop working and its members cannot sign in.",
                          action: "suspend",
                        }}
                      />
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

/**
 * Runs a form post's action: on success 303 to the page at `section` with
 * the flash it returns; on a service error (nothing changed) the page
 * itself with the message and what was typed. 403/404 go to the error page.
 */
async function attempt(
  c: C,
  section: Section,
  fn: () => Promise<Flash | Response>,
) {
  const id = c.req.param("id")!;
  try {
    const out = await fn();
    if (out instanceof Response) return out;
    return await redirectWithFlash(c, `/tenants/${id}#${section}`, {
      section,
      ...out,
    });
  } catch (err) {
    if (
      !(err instanceof ServiceError) || err.status === 404 || err.status === 403
    ) throw err;
    const body = await c.req.parseBody();
    const input: Record<string, string> = {};
    for (const [k, v] of Object.entries(body)) {
      if (!k.startsWith("_") && typeof v === "string") {
        input[k] = v.slice(0, 400);
      }
    }
    return await view(
      c,
      {},
      { error: portalMessage(err), section, input },
      err.status === 409 ? 409 : 400,
    );
  }
}

/** A plain GET of a form's address: the page, at the form's section. */
function toSection(section: Section) {
  return async (c: C) => {
    const t = await getTenant(
      c.get("deps").store,
      c.get("principal")!,
      c.req.param("id")!,
    );
    return c.redirect(`/tenants/${t.id}#${section}`, 303);
  };
}

/** `/tenants/:id` pages and their form posts. */
export const tenantDetailRoutes = new Hono<PortalEnv>()
  .get("/:id", async (c) => view(c, await takeFlash(c)))
  .post("/:id", (c) =>
    attempt(c, "settings", async () => {
      const body = await c.req.parseBody();
      const store = c.get("deps").store;
      const p = c.get("principal")!;
      const id = c.req.param("id");
      const patch: Record<string, string> = {};
      if (str(body.name)) patch.name = str(body.name);
      if (str(body.status)) patch.status = str(body.status);
      if (patch.status === "suspended" && !(await confirmed(c))) {
        const t = await getTenant(store, p, id);
        requirePlatform(p);
        if (t.status === "active") {
          return confirmPage(c, {
            title: `Suspend ${t.name}?`,
            question:
              "Its API keys stop working at once and its members cannot sign in until it is resumed.",
            confirmLabel: "Yes, suspend",
            action: `/tenants/${t.id}`,
            back: `/tenants/${t.id}#settings`,
            active: "/tenants",
            fields: { status: "suspended" },
          });
        }
      }
      const t = await updateTenant(store, p, id, patch);
      return {
        ok: patch.status
          ? `Tenant ${t.status === "active" ? "resumed" : "suspended"}.`
          : "Tenant renamed.",
      };
    }))
  .get("/:id/retention", toSection("retention"))
  .post("/:id/retention", (c) =>
    attempt(c, "retention", async () => {
      const body = await c.req.parseBody();
      const choice: Record<string, number | null> = {};
      for (const kind of RETENTION_KINDS) {
        const raw = str(body[kind]).trim();
        choice[kind] = raw === "" ? null : Number(raw);
      }
      await setTenantRetention(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("id"),
        choice,
      );
      return {
        ok: "Retention saved; older records are removed within the hour.",
      };
    }))
  .get("/:id/export", async (c) => {
    const store = c.get("deps").store;
    const t = await getTenant(store, c.get("principal")!, c.req.param("id"));
    const doc = await exportTenant(store, c.get("principal")!, t.id);
    c.header("cache-control", "no-store");
    c.header(
      "content-disposition",
      `attachment; filename="${exportFileName(t.slug)}"`,
    );
    return c.json(doc);
  })
  .get("/:id/delete", toSection("retention"))
  .post("/:id/delete", (c) =>
    attempt(c, "retention", async () => {
      const store = c.get("deps").store;
      const p = c.get("principal")!;
      const t = await getTenant(store, p, c.req.param("id"));
      requirePlatform(p);
      if (!(await confirmed(c))) {
        return confirmPage(c, {
          title: `Delete ${t.name}?`,
          question:
            "Its API keys stop working at once; its records are removed after the grace period.",
          confirmLabel: "Yes, delete",
          action: `/tenants/${t.id}/delete`,
          back: `/tenants/${t.id}#retention`,
          active: "/tenants",
        });
      }
      const after = await scheduleTenantDeletion(store, p, t.id);
      return {
        ok: `Tenant disabled; its data is removed on ${
          after.deletion!.purgeAt.slice(0, 10)
        }.`,
      };
    }))
  .get("/:id/deletion/cancel", toSection("retention"))
  .post("/:id/deletion/cancel", (c) =>
    attempt(c, "retention", async () => {
      await cancelTenantDeletion(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("id"),
      );
      return {
        ok: "Deletion cancelled; the tenant stays suspended until resumed.",
      };
    }))
  .get("/:id/keys", toSection("keys"))
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
  .get("/:id/keys/:keyId/revoke", toSection("keys"))
  .post("/:id/keys/:keyId/revoke", (c) =>
    attempt(c, "keys", async () => {
      const store = c.get("deps").store;
      const p = c.get("principal")!;
      const tenantId = c.req.param("id");
      const t = await getTenant(store, p, tenantId);
      requireTenantWrite(p, t.id);
      if (!(await confirmed(c))) {
        const keys = await listApiKeys(store, p, t.id, { limit: 100 });
        const key = keys.items.find((k) => k.id === c.req.param("keyId"));
        if (!key) throw new NotFoundError("API key");
        return confirmPage(c, {
          title: `Revoke key "${key.name}"?`,
          question: "Clients using it stop working at once.",
          confirmLabel: "Yes, revoke",
          action: `/tenants/${t.id}/keys/${key.id}/revoke`,
          back: `/tenants/${t.id}#keys`,
          active: isPlatform(p) ? "/tenants" : `/tenants/${t.id}`,
        });
      }
      const key = await revokeApiKey(store, p, c.req.param("keyId"), tenantId);
      return { ok: `Key "${key.name}" revoked.` };
    }))
  .get("/:id/limits", toSection("limits"))
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
  .get("/:id/users/:userId/:action{disable|enable}", toSection("members"))
  .post(
    "/:id/users/:userId/:action{disable|enable}",
    (c) =>
      attempt(c, "members", async () => {
        const store = c.get("deps").store;
        const p = c.get("principal")!;
        const members = await listUsers(store, p, c.req.param("id"), {
          limit: 200,
        });
        const member = members.items.find((u) =>
          u.id === c.req.param("userId")
        );
        if (!member) throw new NotFoundError("User");
        const disable = c.req.param("action") === "disable";
        if (disable && !(await confirmed(c))) {
          const t = await getTenant(store, p, c.req.param("id"));
          requireTenantWrite(p, t.id, "User");
          return confirmPage(c, {
            title: `Disable ${member.email}?`,
            question: "They are signed out at once and cannot sign in.",
            confirmLabel: "Yes, disable",
            action: `/tenants/${t.id}/users/${member.id}/disable`,
            back: `/tenants/${t.id}#members`,
            active: isPlatform(p) ? "/tenants" : `/tenants/${t.id}`,
          });
        }
        const u = await setUserDisabled(store, p, member.id, disable);
        return {
          ok: `${u.email} ${
            disable ? "disabled: their sessions ended" : "enabled"
          }.`,
        };
      }),
  )
  .get("/:id/invites", toSection("members"))
  .post("/:id/invites", (c) =>
    attempt(c, "members", async () => {
      const body = await c.req.parseBody();
      const { token, invite, replaced } = await createInvite(
        c.get("deps").store,
        c.get("principal")!,
        {
          email: str(body.email),
          role: str(body.role),
          tenantId: c.req.param("id"),
        },
      );
      return {
        ok: replaced
          ? `New invite for ${invite.email} created. It replaces the previous link, which no longer works.`
          : `Invite for ${invite.email} created.`,
        inviteLink: `${c.get("deps").config.publicUrl}/invite/${token}`,
      };
    }))
  .get("/:id/invites/:inviteId/revoke", toSection("members"))
  .post(
    "/:id/invites/:inviteId/revoke",
    (c) =>
      attempt(c, "members", async () => {
        const store = c.get("deps").store;
        const p = c.get("principal")!;
        const t = await getTenant(store, p, c.req.param("id"));
        requireTenantWrite(p, t.id);
        if (!(await confirmed(c))) {
          const inv = (await listInvites(store, p, t.id)).find((i) =>
            i.id === c.req.param("inviteId")
          );
          if (!inv) throw new NotFoundError("Invite");
          return confirmPage(c, {
            title: `Revoke the invite for ${inv.email}?`,
            question: "Its link stops working.",
            confirmLabel: "Yes, revoke",
            action: `/tenants/${t.id}/invites/${inv.id}/revoke`,
            back: `/tenants/${t.id}#members`,
            active: isPlatform(p) ? "/tenants" : `/tenants/${t.id}`,
          });
        }
        const inv = await revokeInvite(store, p, t.id, c.req.param("inviteId"));
        return { ok: `Invite for ${inv.email} revoked.` };
      }),
  );
