/**
 * `/tenants/:id/budgets`: a tenant's budgets (the provider sets the
 * tenant's; the tenant's admins set their keys', within it) with this
 * month's spend, its alerts, its webhook endpoints (the signing secret
 * shown once) and their delivery log. `/alerts`: the provider's view,
 * every tenant's alerts, and its own endpoints and their log. Forms post,
 * then redirect back (a new endpoint's secret is shown in the answer to
 * its post, once). Another tenant's page is 404.
 */
import { SecretValue } from "../components/secret.tsx";
import { type Context, Hono, type MiddlewareHandler } from "hono";
import {
  AlertList,
  BudgetFields,
  BudgetTable,
  DeliveryLog,
  WebhookList,
} from "../components/budgets.tsx";
import { Alert, Card, Field, PostForm } from "../components/ui.tsx";
import { listApiKeys } from "../store/api_keys.ts";
import {
  acknowledgeAlert,
  listAlerts,
  listAllAlerts,
} from "../store/budget_alerts.ts";
import {
  budgetStatus,
  deleteKeyBudget,
  deleteTenantBudget,
  parseUnit,
  setKeyBudget,
  setTenantBudget,
} from "../store/budgets.ts";
import { ServiceError } from "../store/errors.ts";
import { isPlatform } from "../store/principal.ts";
import { getTenant } from "../store/tenants.ts";
import { openAlertCount } from "../store/budget_alerts.ts";
import {
  createWebhook,
  deleteWebhook,
  listDeliveries,
  listWebhooks,
} from "../store/webhooks.ts";
import type { PortalEnv } from "./_env.ts";
import { page, safeNext, str } from "./_page.tsx";

type C = Context<PortalEnv>;

/** What a render says after a post. */
interface Flash {
  ok?: string;
  error?: string;
  section?: "budgets" | "webhooks";
  secret?: { value: string; url: string };
}

/** Messages of redirects (`?done=`): fixed texts, nothing reflected. */
const DONE: Record<string, string> = {
  "budget-saved": "Budget saved.",
  "budget-removed": "Budget removed.",
  "alert-acknowledged": "Alert acknowledged.",
  "webhook-deleted": "Webhook endpoint deleted.",
};

function flashOf(c: C): Flash {
  const done = DONE[c.req.query("done") ?? ""];
  return done ? { ok: done } : {};
}

/** A budget form's body as the service takes it. */
function budgetInput(body: Record<string, unknown>) {
  const thresholds = str(body.thresholds).split(/[\s,;%]+/).filter(Boolean);
  return {
    amount: str(body.amount).trim(),
    hard: str(body.hard) === "on",
    ...(thresholds.length > 0 ? { thresholds } : {}),
  };
}

async function tenantView(c: C, flash: Flash, status: 200 | 400 | 409 = 200) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const id = c.req.param("id")!;
  const tenant = await getTenant(store, p, id);
  const [status_, keys, alerts, hooks, deliveries] = await Promise.all([
    budgetStatus(store, p, id),
    listApiKeys(store, p, id, { limit: 100 }),
    listAlerts(store, p, id, { limit: 50 }),
    listWebhooks(store, p, id),
    listDeliveries(store, p, id, { limit: 50 }),
  ]);
  const canWrite = p.role !== "tenant_viewer";
  const csrf = c.get("csrf");
  const keyNames = new Map(keys.items.map((k) => [k.id, k.name]));
  const live = keys.items.filter((k) => !k.revokedAt);
  const err = (s: Flash["section"]) =>
    flash.error && flash.section === s
      ? <Alert tone="error">{flash.error}</Alert>
      : null;
  const base = `/tenants/${id}`;
  return page(
    c,
    `Budgets · ${tenant.name}`,
    isPlatform(p) ? "/tenants" : base,
    (
      <>
        <h1>Budgets &amp; alerts</h1>
        <p class="sub">
          <a href={base}>{tenant.name}</a> · {status_.period}{" "}
          (UTC month) · spend priced like the monthly statement
        </p>
        {flash.ok && <Alert tone="ok">{flash.ok}</Alert>}
        {flash.secret && (
          <Card title="Your webhook signing secret" id="new-secret">
            <Alert tone="warn">
              Copy this secret now: it is shown only once. Verify each
              delivery's <code>Orchard-Signature</code> header with it.
            </Alert>
            <p class="mono wrap">{flash.secret.url}</p>
            <SecretValue
              value={flash.secret.value}
              testid="webhook-secret"
              label="Copy secret"
            />
          </Card>
        )}
        <Card title="Budgets this month" id="budgets">
          {err("budgets")}
          <BudgetTable
            budgets={status_.budgets}
            currency={status_.currency}
            keys={keyNames}
            action={`${base}/budgets/delete`}
            csrf={csrf}
            deleteAction={canWrite
              ? (b) => b.keyId !== null || isPlatform(p)
              : null}
          />
          <p class="muted">
            A soft budget alerts; a hard one also refuses requests (429{" "}
            <code>insufficient_quota</code>) once reached.
            {!isPlatform(p) &&
              " Your provider sets the tenant's budgets; you set your keys' within them."}
          </p>
          {isPlatform(p) && (
            <PostForm
              action={`${base}/budgets`}
              csrf={csrf}
              id="tenant-budget-form"
            >
              <input type="hidden" name="scope" value="tenant" />
              <h3>Tenant budget</h3>
              <BudgetFields prefix="tb" />
              <button class="primary" type="submit">Save tenant budget</button>
            </PostForm>
          )}
          {canWrite && live.length > 0 && (
            <PostForm
              action={`${base}/budgets`}
              csrf={csrf}
              id="key-budget-form"
              style="margin-top:16px"
            >
              <input type="hidden" name="scope" value="key" />
              <h3>Key budget</h3>
              <BudgetFields prefix="kb" keys={live} />
              <button class="primary" type="submit">Save key budget</button>
            </PostForm>
          )}
        </Card>
        <Card title="Alerts" id="alerts">
          <AlertList
            alerts={alerts.items}
            ackAction={canWrite ? (a) => `${base}/alerts/${a.id}/ack` : null}
            csrf={csrf}
            next={`${base}/budgets`}
          />
        </Card>
        <Card title="Webhooks" id="webhooks">
          {err("webhooks")}
          <p class="muted">
            Alerts are POSTed as JSON to each endpoint, signed with its secret
            (<code>Orchard-Signature: t=…,v1=…</code>), and retried with backoff
            until delivered.
          </p>
          <WebhookList
            hooks={hooks}
            csrf={csrf}
            deleteAction={canWrite
              ? (h) => `${base}/webhooks/${h.id}/delete`
              : null}
          />
          {canWrite && (
            <PostForm
              action={`${base}/webhooks`}
              csrf={csrf}
              style="margin-top:16px"
              id="webhook-form"
            >
              <div class="row">
                <Field
                  label="Endpoint URL"
                  name="url"
                  type="url"
                  required
                  maxLength={2000}
                  placeholder="https://example.com/orchard-hook"
                />
                <Field
                  label="Description"
                  name="description"
                  maxLength={200}
                  hint="optional"
                />
              </div>
              <button type="submit">Add endpoint</button>
            </PostForm>
          )}
        </Card>
        <Card title="Delivery log" id="deliveries">
          <DeliveryLog deliveries={deliveries.items} />
        </Card>
      </>
    ),
    status,
  );
}

async function providerView(
  c: C,
  flash: Flash,
  status: 200 | 400 | 409 = 200,
) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const [alerts, hooks, deliveries] = await Promise.all([
    listAllAlerts(store, p, { limit: 100 }),
    listWebhooks(store, p, null),
    listDeliveries(store, p, null, { limit: 50 }),
  ]);
  const csrf = c.get("csrf");
  return page(
    c,
    "Alerts",
    "/alerts",
    (
      <>
        <h1>Budget alerts</h1>
        <p class="sub">
          Every tenant's alerts; set budgets on each tenant's budgets page.
        </p>
        {flash.ok && <Alert tone="ok">{flash.ok}</Alert>}
        {flash.secret && (
          <Card title="Your webhook signing secret" id="new-secret">
            <Alert tone="warn">
              Copy this secret now: it is shown only once.
            </Alert>
            <p class="mono wrap">{flash.secret.url}</p>
            <code class="secret" data-testid="webhook-secret">
              {flash.secret.value}
            </code>
          </Card>
        )}
        <Card title="Alerts" id="alerts">
          <AlertList
            alerts={alerts.items}
            ackAction={(a) => `/tenants/${a.tenantId}/alerts/${a.id}/ack`}
            csrf={csrf}
            showTenant
            next="/alerts"
          />
        </Card>
        <Card title="Provider webhooks" id="webhooks">
          {flash.error && <Alert tone="error">{flash.error}</Alert>}
          <p class="muted">
            These endpoints receive every tenant's alerts.
          </p>
          <WebhookList
            hooks={hooks}
            csrf={csrf}
            deleteAction={(h) => `/alerts/webhooks/${h.id}/delete`}
          />
          <PostForm
            action="/alerts/webhooks"
            csrf={csrf}
            style="margin-top:16px"
            id="webhook-form"
          >
            <div class="row">
              <Field
                label="Endpoint URL"
                name="url"
                type="url"
                required
                maxLength={2000}
              />
              <Field
                label="Description"
                name="description"
                maxLength={200}
                hint="optional"
              />
            </div>
            <button type="submit">Add endpoint</button>
          </PostForm>
        </Card>
        <Card title="Delivery log" id="deliveries">
          <DeliveryLog deliveries={deliveries.items} />
        </Card>
      </>
    ),
    status,
  );
}

/** Runs a form's action: a redirect on success, the page with the error otherwise. */
async function attempt(
  c: C,
  section: Flash["section"],
  render: (c: C, f: Flash, s: 400 | 409) => Promise<Response>,
  fn: () => Promise<Response>,
): Promise<Response> {
  try {
    return await fn();
  } catch (err) {
    if (
      !(err instanceof ServiceError) || err.status === 404 || err.status === 403
    ) throw err;
    return await render(
      c,
      { error: err.message, section },
      err.status === 409 ? 409 : 400,
    );
  }
}

const back = (c: C, done: string) =>
  c.redirect(`/tenants/${c.req.param("id")}/budgets?done=${done}`, 303);

/** `/tenants/:id/budgets`, alerts and webhooks of a tenant (mount at `/tenants`). */
export const budgetPageRoutes = new Hono<PortalEnv>()
  .get("/:id/budgets", (c) => tenantView(c, flashOf(c)))
  // A form's address opened by hand (a reload of an old POST): its page,
  // after the tenant check (another tenant's id stays a 404).
  .get(
    "/:id/:what{budgets/delete|webhooks|webhooks/[^/]+/delete|alerts/[^/]+/ack}",
    async (c) => {
      await getTenant(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("id"),
      );
      return c.redirect(`/tenants/${c.req.param("id")}/budgets`, 303);
    },
  )
  .post("/:id/budgets", (c) =>
    attempt(c, "budgets", tenantView, async () => {
      const store = c.get("deps").store;
      const p = c.get("principal")!;
      const id = c.req.param("id");
      await getTenant(store, p, id);
      const body = await c.req.parseBody();
      const unit = parseUnit(str(body.unit));
      if (str(body.scope) === "key") {
        await setKeyBudget(
          store,
          p,
          str(body.keyId),
          unit,
          budgetInput(body),
          id,
        );
      } else await setTenantBudget(store, p, id, unit, budgetInput(body));
      return back(c, "budget-saved");
    }))
  .post(
    "/:id/budgets/delete",
    (c) =>
      attempt(c, "budgets", tenantView, async () => {
        const store = c.get("deps").store;
        const p = c.get("principal")!;
        const id = c.req.param("id");
        await getTenant(store, p, id);
        const body = await c.req.parseBody();
        const unit = parseUnit(str(body.unit));
        if (str(body.scope) === "key") {
          await deleteKeyBudget(store, p, str(body.keyId), unit, id);
        } else await deleteTenantBudget(store, p, id, unit);
        return back(c, "budget-removed");
      }),
  )
  .post("/:id/alerts/:alertId/ack", async (c) => {
    const store = c.get("deps").store;
    const p = c.get("principal")!;
    await acknowledgeAlert(store, p, c.req.param("id"), c.req.param("alertId"));
    const next = safeNext(str((await c.req.parseBody()).next));
    const to = next === "/" ? `/tenants/${c.req.param("id")}` : next;
    return c.redirect(
      `${to}${to.includes("?") ? "&" : "?"}done=alert-acknowledged`,
      303,
    );
  })
  .post("/:id/webhooks", (c) =>
    attempt(c, "webhooks", tenantView, async () => {
      const store = c.get("deps").store;
      const p = c.get("principal")!;
      const body = await c.req.parseBody();
      const { secret, webhook } = await createWebhook(
        store,
        p,
        c.req.param("id"),
        { url: str(body.url), description: str(body.description) },
        c.get("deps").config.allowPrivateWebhookUrls,
      );
      const res = await tenantView(c, {
        ok: "Webhook endpoint added.",
        secret: { value: secret, url: webhook.url },
      });
      res.headers.set("cache-control", "no-store");
      return res;
    }))
  .post("/:id/webhooks/:webhookId/delete", async (c) => {
    await deleteWebhook(
      c.get("deps").store,
      c.get("principal")!,
      c.req.param("id"),
      c.req.param("webhookId"),
    );
    return back(c, "webhook-deleted");
  });

/** `/alerts`: the provider's alerts and webhooks (platform admins; others go to their tenant's page). */
export const alertPageRoutes = new Hono<PortalEnv>()
  .get("/", (c) => {
    const p = c.get("principal")!;
    if (!isPlatform(p)) {
      return c.redirect(`/tenants/${p.tenantId}/budgets`, 303);
    }
    return providerView(c, flashOf(c));
  })
  .get("/webhooks/:rest{.*}", (c) => c.redirect("/alerts", 303))
  .get("/webhooks", (c) => {
    return c.redirect("/alerts", 303);
  })
  .post("/webhooks", (c) =>
    attempt(c, "webhooks", providerView, async () => {
      const body = await c.req.parseBody();
      const { secret, webhook } = await createWebhook(
        c.get("deps").store,
        c.get("principal")!,
        null,
        { url: str(body.url), description: str(body.description) },
        c.get("deps").config.allowPrivateWebhookUrls,
      );
      const res = await providerView(c, {
        ok: "Webhook endpoint added.",
        secret: { value: secret, url: webhook.url },
      });
      res.headers.set("cache-control", "no-store");
      return res;
    }))
  .post("/webhooks/:webhookId/delete", async (c) => {
    await deleteWebhook(
      c.get("deps").store,
      c.get("principal")!,
      null,
      c.req.param("webhookId"),
    );
    return c.redirect("/alerts?done=webhook-deleted", 303);
  });

/**
 * Puts the caller's open (unacknowledged) alerts in the context, for the
 * navigation's badge: one read per page.
 */
export function alertBadge(): MiddlewareHandler<PortalEnv> {
  return async function alertBadge(c, next) {
    const p = c.get("principal");
    if (p && c.req.method === "GET") {
      const scope = isPlatform(p) ? "provider" : p.tenantId;
      if (scope) {
        c.set(
          "openAlerts",
          await openAlertCount(c.get("deps").store, scope).catch(() => 0),
        );
      }
    }
    await next();
  };
}
