/**
 * `/admin-tokens`: admin API tokens (for the admin API and the CLI). Platform
 * admins manage every token; tenant admins their own tenant's (see
 * store/admin_tokens.ts). A new token is shown once, after a redirect, so a
 * reload does not show it again.
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
  fmtTime,
  Pager,
  PostForm,
  Table,
  Time,
} from "../components/ui.tsx";
import ConfirmSubmit from "../islands/ConfirmSubmit.tsx";
import {
  type AdminTokenView,
  createAdminToken,
  listAdminTokens,
  revokeAdminToken,
} from "../store/admin_tokens.ts";
import { ServiceError } from "../store/errors.ts";
import { isPlatform, type Role } from "../store/principal.ts";
import { getTenantRaw, listTenants, type Tenant } from "../store/tenants.ts";
import type { PortalEnv } from "./_env.ts";
import { setOnce, takeOnce } from "./_flash.tsx";
import { page, str } from "./_page.tsx";

type C = Context<PortalEnv>;
const PATH = "/admin-tokens";

/** What the page shows once after a post. */
interface Once {
  ok?: string;
  created?: { token: string; name: string };
}

/** The create form's values (kept after an error). */
interface FormInput {
  name: string;
  role: string;
  tenantId: string;
  expires: string;
}

const ROLE_LABELS: Record<Role, string> = {
  platform_admin: "Platform admin",
  tenant_admin: "Tenant admin",
  tenant_viewer: "Tenant viewer (read only)",
};

const EXPIRY_CHOICES: [string, string][] = [
  ["7", "7 days"],
  ["30", "30 days"],
  ["90", "90 days"],
  ["365", "1 year"],
  ["never", "Never"],
];

function expiresAt(choice: string): string | null {
  if (choice === "never") return null;
  const days = Number(choice);
  if (!Number.isInteger(days) || days < 1 || days > 3650) return null;
  return new Date(Date.now() + days * 86_400_000).toISOString();
}

function state(t: AdminTokenView, now: number) {
  if (t.revokedAt) return <Badge tone="danger">revoked</Badge>;
  if (t.expiresAt && Date.parse(t.expiresAt) <= now) {
    return <Badge tone="warn">expired</Badge>;
  }
  return <Badge tone="ok">active</Badge>;
}

async function view(
  c: C,
  flash: Once & { error?: string; input?: FormInput } = {},
  status: 200 | 400 | 409 = 200,
) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const cursor = c.req.query("cursor") ?? null;
  const tokens = await listAdminTokens(store, p, { cursor, limit: 50 });
  const platform = isPlatform(p);
  const tenants: Tenant[] = platform
    ? (await listTenants(store, p, { limit: 200 })).items
    : [];
  const names = new Map(tenants.map((t) => [t.id, t.name]));
  for (const t of tokens.items) {
    if (t.tenantId && !names.has(t.tenantId)) {
      const tenant = await getTenantRaw(store, t.tenantId);
      names.set(t.tenantId, tenant?.name ?? t.tenantId);
    }
  }
  if (!platform && !names.has(p.tenantId!)) {
    names.set(
      p.tenantId!,
      (await getTenantRaw(store, p.tenantId!))?.name ?? p.tenantId!,
    );
  }
  const roles: Role[] = platform
    ? ["platform_admin", "tenant_admin", "tenant_viewer"]
    : ["tenant_admin", "tenant_viewer"];
  const input: FormInput = flash.input ??
    { name: "", role: roles[0]!, tenantId: "", expires: "90" };
  const csrf = c.get("csrf");
  const now = Date.now();
  const publicUrl = c.get("deps").config.publicUrl;
  const next = tokens.cursor
    ? `${PATH}?cursor=${encodeURIComponent(tokens.cursor)}`
    : null;
  return page(
    c,
    "Admin tokens",
    PATH,
    (
      <>
        <h1>Admin API tokens</h1>
        <p class="sub">
          Bearer tokens for the admin API (<code>/api/admin/v1</code>) and the
          {" "}
          <code>deno task orchard</code>{" "}
          CLI. A token acts with its role{platform ? "" : " in your tenant"};
          only a hash is kept, so its secret is shown once.
        </p>
        {flash.ok && <Alert tone="ok">{flash.ok}</Alert>}
        {flash.created && (
          <Card title="Your new admin token" id="new-token">
            <Alert tone="warn">
              Copy this token now. It is shown only once and cannot be
              recovered; create a new one if it is lost.
            </Alert>
            <SecretValue
              value={flash.created.token}
              testid="new-admin-token"
              label="Copy token"
            />
            <p class="muted" style="margin-bottom:0">
              Use it with the CLI:{" "}
              <code class="mono">
                export ORCHARD_URL={publicUrl}{" "}
                ORCHARD_ADMIN_TOKEN=&lt;the token&gt;
              </code>
            </p>
          </Card>
        )}
        <Card title="Tokens" id="tokens">
          <Table
            head={[
              "Name",
              "Status",
              "Role",
              "Tenant",
              "Created",
              "Expires",
              "Last used",
              "",
            ]}
            rows={tokens.items.length}
            empty="No admin tokens yet."
          >
            {tokens.items.map((t) => (
              <tr key={t.id} data-token-id={t.id}>
                <td>
                  <span class="trunc" title={t.name}>{t.name}</span>
                </td>
                <td>{state(t, now)}</td>
                <td>{t.role.replace("_", " ")}</td>
                <td>
                  {t.tenantId ? names.get(t.tenantId) ?? t.tenantId : "—"}
                </td>
                <td class="time">
                  <Time iso={t.createdAt} />
                </td>
                <td class="time">
                  {t.expiresAt ? fmtTime(t.expiresAt) : "never"}
                </td>
                <td class="time">
                  <Time iso={t.lastUsedAt} />
                </td>
                <td>
                  {!t.revokedAt && (
                    <PostForm
                      action={`${PATH}/${t.id}/revoke`}
                      csrf={csrf}
                    >
                      <Island
                        name="ConfirmSubmit"
                        component={ConfirmSubmit}
                        props={{
                          label: "Revoke",
                          confirmLabel: "Yes, revoke",
                          question: t.id === "env"
                            ? "Stops working until the server restarts with ORCHARD_ADMIN_TOKEN set."
                            : "Scripts using it stop working.",
                        }}
                      />
                    </PostForm>
                  )}
                </td>
              </tr>
            ))}
          </Table>
          <Pager next={next} />
        </Card>
        <Card title="New token" id="create">
          {flash.error && <Alert tone="error">{flash.error}</Alert>}
          <PostForm action={PATH} csrf={csrf}>
            <div class="row">
              <Field
                label="Name"
                name="name"
                value={input.name}
                required
                maxLength={100}
                placeholder="e.g. deploy pipeline"
              />
              <div class="field">
                <label for="f-role">Role</label>
                <select id="f-role" name="role">
                  {roles.map((r) => (
                    <option key={r} value={r} selected={input.role === r}>
                      {ROLE_LABELS[r]}
                    </option>
                  ))}
                </select>
              </div>
              {platform
                ? (
                  <div class="field">
                    <label for="f-tenantId">
                      Tenant <span class="hint">for tenant roles</span>
                    </label>
                    <select id="f-tenantId" name="tenantId">
                      <option value="">—</option>
                      {tenants.map((t) => (
                        <option
                          key={t.id}
                          value={t.id}
                          selected={input.tenantId === t.id}
                        >
                          {t.name} ({t.slug})
                        </option>
                      ))}
                    </select>
                  </div>
                )
                : <input type="hidden" name="tenantId" value={p.tenantId!} />}
              <div class="field">
                <label for="f-expires">Expires</label>
                <select id="f-expires" name="expires">
                  {EXPIRY_CHOICES.map(([v, label]) => (
                    <option key={v} value={v} selected={input.expires === v}>
                      {label}
                    </option>
                  ))}
                </select>
              </div>
            </div>
            <button class="primary" type="submit">Create token</button>
          </PostForm>
        </Card>
      </>
    ),
    status,
  );
}

/** `/admin-tokens` pages and their form posts. */
export const adminTokenRoutes = new Hono<PortalEnv>()
  .get("/", async (c) => view(c, (await takeOnce<Once>(c)) ?? {}))
  // A form's address opened by hand (a reload of an old POST): its page.
  .get("/:tokenId/revoke", (c) => c.redirect(PATH, 303))
  .post("/", async (c) => {
    const body = await c.req.parseBody();
    const input: FormInput = {
      name: str(body.name).slice(0, 200),
      role: str(body.role).slice(0, 40),
      tenantId: str(body.tenantId).slice(0, 64),
      expires: str(body.expires).slice(0, 10) || "never",
    };
    try {
      const { token, record } = await createAdminToken(
        c.get("deps").store,
        c.get("principal")!,
        {
          name: input.name,
          role: input.role,
          tenantId: input.tenantId || null,
          expiresAt: expiresAt(input.expires),
        },
      );
      await setOnce(
        c,
        PATH,
        {
          ok: `Token "${record.name}" created.`,
          created: { token, name: record.name },
        } satisfies Once,
      );
      return c.redirect(PATH, 303);
    } catch (err) {
      if (
        !(err instanceof ServiceError) || err.status === 404 ||
        err.status === 403
      ) throw err;
      return await view(
        c,
        { error: err.message, input },
        err.status === 409 ? 409 : 400,
      );
    }
  })
  .post("/:tokenId/revoke", async (c) => {
    const t = await revokeAdminToken(
      c.get("deps").store,
      c.get("principal")!,
      c.req.param("tokenId"),
    );
    await setOnce(c, PATH, { ok: `Token "${t.name}" revoked.` } satisfies Once);
    return c.redirect(PATH, 303);
  });
