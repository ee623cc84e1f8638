/**
 * `/users`: user administration. Platform admins see every user, tenant
 * admins their tenant's members (viewers read only): role, status, last
 * sign-in; disable or enable (which ends their sessions), a one-time
 * password reset link, and pending invites (new link, revoke). Links are
 * shown once, after a redirect.
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { Island } from "../components/Island.tsx";
import {
  Alert,
  Badge,
  Card,
  Field,
  fmtTime,
  Pager,
  PostForm,
  Table,
  Time,
} from "../components/ui.tsx";
import ConfirmSubmit from "../islands/ConfirmSubmit.tsx";
import { ServiceError } from "../store/errors.ts";
import { createPasswordReset } from "../store/password_resets.ts";
import { isPlatform, type Role } from "../store/principal.ts";
import {
  findTenant,
  getTenantRaw,
  listTenants,
  type Tenant,
} from "../store/tenants.ts";
import {
  createInvite,
  listPendingInvites,
  listUserAccounts,
  reissueInvite,
  revokeInviteById,
  setUserDisabled,
} from "../store/users.ts";
import type { PortalEnv } from "./_env.ts";
import { setOnce, takeOnce } from "./_flash.tsx";
import { page, str } from "./_page.tsx";

type C = Context<PortalEnv>;
const PATH = "/users";

/** What the page shows once after a post. */
interface Once {
  ok?: string;
  resetLink?: { email: string; link: string; expiresAt: string };
  inviteLink?: { email: string; link: string; expiresAt: string };
}

const ROLE_LABELS: Record<Role, string> = {
  platform_admin: "Platform admin",
  tenant_admin: "Tenant admin",
  tenant_viewer: "Viewer (read only)",
};

async function view(
  c: C,
  flash: Once & { error?: string } = {},
  status: 200 | 400 | 409 = 200,
) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const platform = isPlatform(p);
  const tenantRef = platform ? (c.req.query("tenant") ?? "").slice(0, 64) : "";
  const filter = tenantRef ? await findTenant(store, p, tenantRef) : null;
  const scope = platform ? filter?.id ?? null : p.tenantId!;
  const cursor = c.req.query("cursor") ?? null;
  const [users, invites] = await Promise.all([
    listUserAccounts(store, p, scope, { cursor, limit: 50 }),
    listPendingInvites(store, p, scope, { limit: 200 }),
  ]);
  const tenants: Tenant[] = platform
    ? (await listTenants(store, p, { limit: 200 })).items
    : [];
  const names = new Map(tenants.map((t) => [t.id, t.name]));
  for (const id of [...users.items, ...invites.items].map((x) => x.tenantId)) {
    if (id && !names.has(id)) {
      names.set(id, (await getTenantRaw(store, id))?.name ?? id);
    }
  }
  const tenantName = (id: string | null) =>
    id ? names.get(id) ?? id : "— (platform)";
  const canWrite = p.role !== "tenant_viewer";
  const csrf = c.get("csrf");
  const qs = new URLSearchParams();
  if (filter) qs.set("tenant", filter.id);
  if (users.cursor) qs.set("cursor", users.cursor);
  const next = users.cursor ? `${PATH}?${qs}` : null;
  const roles: Role[] = platform
    ? ["tenant_admin", "tenant_viewer", "platform_admin"]
    : ["tenant_admin", "tenant_viewer"];
  const head = platform
    ? ["Email", "Role", "Tenant", "Status", "Last sign-in", "Created", ""]
    : ["Email", "Role", "Status", "Last sign-in", "Created", ""];
  return page(
    c,
    "Users",
    PATH,
    (
      <>
        <h1>Users</h1>
        <p class="sub">
          {platform
            ? filter
              ? `Members of ${filter.name}.`
              : "Everyone who can sign in to this portal."
            : `Members of ${tenantName(p.tenantId)}.`}
        </p>
        {flash.ok && <Alert tone="ok">{flash.ok}</Alert>}
        {flash.error && <Alert tone="error">{flash.error}</Alert>}
        {flash.resetLink && (
          <Card title="Password reset link" id="reset-link">
            <Alert tone="warn">
              Pass this one-time link to {flash.resetLink.email}{" "}
              yourself; it is shown only once and works until{" "}
              {fmtTime(flash.resetLink.expiresAt)}. Setting a new password with
              it ends all of their sessions.
            </Alert>
            <code class="secret" data-testid="reset-link">
              {flash.resetLink.link}
            </code>
          </Card>
        )}
        {flash.inviteLink && (
          <Card title="Invite link" id="invite-link">
            <Alert tone="warn">
              Send this one-time link to{" "}
              {flash.inviteLink.email}; it is shown only once and works until
              {" "}
              {fmtTime(flash.inviteLink.expiresAt)}.
            </Alert>
            <code class="secret" data-testid="invite-link">
              {flash.inviteLink.link}
            </code>
          </Card>
        )}
        {platform && (
          <form method="get" action={PATH} class="row" role="search">
            <div class="field">
              <label for="f-filter">Tenant</label>
              <select id="f-filter" name="tenant">
                <option value="">All users</option>
                {tenants.map((t) => (
                  <option
                    key={t.id}
                    value={t.id}
                    selected={filter?.id === t.id}
                  >
                    {t.name}
                  </option>
                ))}
              </select>
            </div>
            <div class="field" style="flex:0">
              <button type="submit">Show</button>
            </div>
          </form>
        )}
        <Card title="Users" id="users">
          <Table head={head} rows={users.items.length} empty="No users yet.">
            {users.items.map((u) => (
              <tr key={u.id} data-user-id={u.id}>
                <td>
                  <span class="trunc" title={u.email}>{u.email}</span>
                </td>
                <td>{u.role.replace("_", " ")}</td>
                {platform && <td>{tenantName(u.tenantId)}</td>}
                <td>
                  {u.disabled
                    ? <Badge tone="danger">disabled</Badge>
                    : <Badge tone="ok">active</Badge>}
                </td>
                <td class="time">
                  <Time iso={u.lastSignInAt} />
                </td>
                <td class="time">
                  <Time iso={u.createdAt} />
                </td>
                <td>
                  {canWrite && u.id !== p.id && (
                    <div class="row" style="gap:6px;align-items:center">
                      {u.disabled
                        ? (
                          <PostForm
                            action={`${PATH}/${u.id}/enable`}
                            csrf={csrf}
                          >
                            <button type="submit" class="small">Enable</button>
                          </PostForm>
                        )
                        : (
                          <>
                            <PostForm
                              action={`${PATH}/${u.id}/disable`}
                              csrf={csrf}
                            >
                              <Island
                                name="ConfirmSubmit"
                                component={ConfirmSubmit}
                                props={{
                                  label: "Disable",
                                  confirmLabel: "Yes, disable",
                                  question: "They are signed out at once.",
                                }}
                              />
                            </PostForm>
                            <PostForm
                              action={`${PATH}/${u.id}/reset-password`}
                              csrf={csrf}
                            >
                              <button type="submit" class="small">
                                Reset password
                              </button>
                            </PostForm>
                          </>
                        )}
                    </div>
                  )}
                </td>
              </tr>
            ))}
          </Table>
          <Pager next={next} />
        </Card>
        <Card title="Pending invites" id="invites">
          <Table
            head={platform
              ? ["Email", "Role", "Tenant", "Expires", ""]
              : ["Email", "Role", "Expires", ""]}
            rows={invites.items.length}
            empty="No pending invites."
          >
            {invites.items.map((inv) => (
              <tr key={inv.id} data-invite-id={inv.id}>
                <td>
                  <span class="trunc" title={inv.email}>{inv.email}</span>
                </td>
                <td>{inv.role.replace("_", " ")}</td>
                {platform && <td>{tenantName(inv.tenantId)}</td>}
                <td class="time">
                  <Time iso={inv.expiresAt} />
                </td>
                <td>
                  {canWrite && (
                    <div class="row" style="gap:6px;align-items:center">
                      <PostForm
                        action={`${PATH}/invites/${inv.id}/reissue`}
                        csrf={csrf}
                      >
                        <button type="submit" class="small">New link</button>
                      </PostForm>
                      <PostForm
                        action={`${PATH}/invites/${inv.id}/revoke`}
                        csrf={csrf}
                      >
                        <button type="submit" class="small danger">
                          Revoke
                        </button>
                      </PostForm>
                    </div>
                  )}
                </td>
              </tr>
            ))}
          </Table>
          {canWrite && (
            <PostForm
              action={`${PATH}/invites`}
              csrf={csrf}
              style="margin-top:16px"
            >
              <div class="row">
                <Field
                  label="Invite by email"
                  name="email"
                  type="email"
                  required
                />
                <div class="field">
                  <label for="f-invite-role">Role</label>
                  <select id="f-invite-role" name="role">
                    {roles.map((r) => (
                      <option key={r} value={r}>{ROLE_LABELS[r]}</option>
                    ))}
                  </select>
                </div>
                {platform
                  ? (
                    <div class="field">
                      <label for="f-invite-tenant">
                        Tenant <span class="hint">for tenant roles</span>
                      </label>
                      <select id="f-invite-tenant" name="tenantId">
                        <option value="">—</option>
                        {tenants.map((t) => (
                          <option
                            key={t.id}
                            value={t.id}
                            selected={filter?.id === t.id}
                          >
                            {t.name}
                          </option>
                        ))}
                      </select>
                    </div>
                  )
                  : <input type="hidden" name="tenantId" value={p.tenantId!} />}
              </div>
              <button type="submit">Create invite link</button>
            </PostForm>
          )}
        </Card>
      </>
    ),
    status,
  );
}

/**
 * Runs a form action: on success shows its result once after a redirect;
 * a 400 or 409 re-renders
 * the page with the message; 403 and 404 go to the error page.
 */
async function act(c: C, fn: () => Promise<Once>) {
  try {
    await setOnce(c, PATH, await fn());
    return c.redirect(PATH, 303);
  } catch (err) {
    if (
      !(err instanceof ServiceError) || err.status === 404 ||
      err.status === 403
    ) throw err;
    return await view(
      c,
      { error: err.message },
      err.status === 409 ? 409 : 400,
    );
  }
}

/** `/users` pages and their form posts. */
export const userRoutes = new Hono<PortalEnv>()
  .get("/", async (c) => view(c, (await takeOnce<Once>(c)) ?? {}))
  // A form's address opened by hand (a reload of an old POST): its page.
  .get("/invites", (c) => c.redirect(PATH, 303))
  .get(
    "/invites/:inviteId/:action{reissue|revoke}",
    (c) => c.redirect(PATH, 303),
  )
  .get(
    "/:userId/:action{disable|enable|reset-password}",
    (c) => c.redirect(PATH, 303),
  )
  .post("/:userId/:action{disable|enable}", (c) =>
    act(c, async () => {
      const disable = c.req.param("action") === "disable";
      const u = await setUserDisabled(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("userId"),
        disable,
      );
      return {
        ok: disable
          ? `${u.email} disabled: their sessions ended.`
          : `${u.email} enabled.`,
      };
    }))
  .post("/:userId/reset-password", (c) =>
    act(c, async () => {
      const { token, reset } = await createPasswordReset(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("userId"),
      );
      return {
        ok: `Password reset link created for ${reset.email}.`,
        resetLink: {
          email: reset.email,
          link: `${c.get("deps").config.publicUrl}/reset/${token}`,
          expiresAt: reset.expiresAt,
        },
      };
    }))
  .post("/invites", (c) =>
    act(c, async () => {
      const body = await c.req.parseBody();
      const { token, invite } = await createInvite(
        c.get("deps").store,
        c.get("principal")!,
        {
          email: str(body.email),
          role: str(body.role),
          tenantId: str(body.tenantId) || null,
        },
      );
      return {
        ok: `Invite created for ${invite.email}.`,
        inviteLink: {
          email: invite.email,
          link: `${c.get("deps").config.publicUrl}/invite/${token}`,
          expiresAt: invite.expiresAt,
        },
      };
    }))
  .post("/invites/:inviteId/reissue", (c) =>
    act(c, async () => {
      const { token, invite } = await reissueInvite(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("inviteId"),
      );
      return {
        ok: `New invite link for ${invite.email}; the old one no longer works.`,
        inviteLink: {
          email: invite.email,
          link: `${c.get("deps").config.publicUrl}/invite/${token}`,
          expiresAt: invite.expiresAt,
        },
      };
    }))
  .post("/invites/:inviteId/revoke", (c) =>
    act(c, async () => {
      const inv = await revokeInviteById(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("inviteId"),
      );
      return { ok: `Invite for ${inv.email} revoked.` };
    }));
