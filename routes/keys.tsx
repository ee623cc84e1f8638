/**
 * `/tenants/:id/keys/:keyId`: one API key: edit its name, scopes, models
 * and own limits (within the tenant's), rotate its secret (the new one is
 * shown once, the previous one keeps working for the grace period chosen),
 * and its usage over the last 30 days with links to the charts and its
 * request log. Posts are POST/redirect/GET with a one-time flash; errors
 * render the page with what was typed.
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
  PostForm,
} from "../components/ui.tsx";
import { fmtInt, fmtMs, Stats } from "../components/dashboard.tsx";
import ConfirmSubmit from "../islands/ConfirmSubmit.tsx";
import {
  type ApiKeyView,
  getApiKey,
  rotateApiKey,
  ROTATION_GRACE_MS,
  updateApiKey,
} from "../store/api_keys.ts";
import { NotFoundError, ServiceError } from "../store/errors.ts";
import { getTenantLimits, LIMIT_FIELDS, type Limits } from "../store/limits.ts";
import { isPlatform, requireTenantWrite } from "../store/principal.ts";
import { SCOPES } from "../store/schemas.ts";
import { getTenant } from "../store/tenants.ts";
import { usageTotals } from "../store/usage.ts";
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
type Section = "edit" | "rotate";

const LIMIT_LABELS: Record<keyof Limits, string> = {
  rpm: "Requests / minute",
  tpm: "Tokens / minute",
  concurrency: "Concurrent requests",
  tokensPerDay: "Tokens / day",
  tokensPerMonth: "Tokens / month",
};

const GRACE_LABELS: Record<number, string> = {
  0: "None: the old secret stops at once",
  3_600_000: "1 hour",
  86_400_000: "24 hours",
  [7 * 86_400_000]: "7 days",
};

/** The tenant and its key (404 when the key is another tenant's). */
async function load(c: C) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const tenant = await getTenant(store, p, c.req.param("id")!);
  const key = await getApiKey(store, p, c.req.param("keyId")!);
  if (key.tenantId !== tenant.id) throw new NotFoundError("API key");
  return { store, p, tenant, key };
}

async function view(
  c: C,
  flash: Flash = {},
  failure:
    | { error: string; section: Section; input: Record<string, string> }
    | null = null,
  status: 200 | 400 | 409 = 200,
) {
  const { store, p, tenant, key } = await load(c);
  const canWrite = p.role !== "tenant_viewer" && !key.revokedAt;
  const now = Date.now();
  const [limits, totals] = await Promise.all([
    getTenantLimits(store, p, tenant.id),
    usageTotals(store, {
      tenantId: tenant.id,
      keyId: key.id,
      granularity: "day",
      from: now - 29 * 86_400_000,
      to: now,
    }),
  ]);
  const typed = (s: Section, name: string) =>
    failure?.section === s ? failure.input[name] : undefined;
  const messages = (s: Section) => (
    <>
      <FlashMessages flash={flash} section={s} />
      {failure?.section === s && <Alert tone="error">{failure.error}</Alert>}
    </>
  );
  const base = `/tenants/${tenant.id}/keys/${key.id}`;
  const csrf = c.get("csrf");
  return page(
    c,
    `Key ${key.name}`,
    isPlatform(p) ? "/tenants" : `/tenants/${tenant.id}`,
    (
      <>
        <h1>
          {key.name}{" "}
          {key.revokedAt
            ? <Badge tone="danger">revoked</Badge>
            : <Badge tone="ok">active</Badge>}
        </h1>
        <p class="sub">
          <a href={`/tenants/${tenant.id}#keys`}>{tenant.name}</a> ·{" "}
          <span class="mono" data-testid="key-mask">
            {key.prefix}…{key.last4}
          </span>
        </p>
        <FlashMessages flash={flash} />
        {flash.newKey && (
          <Card title="Your new secret" id="new-key">
            <Alert tone="warn">
              Copy this key now. It is shown only once and cannot be recovered.
            </Alert>
            <SecretValue
              value={flash.newKey.key}
              testid="new-key"
              label="Copy key"
            />
          </Card>
        )}
        <Card title="Usage, last 30 days" id="usage">
          <Stats
            items={[
              ["Requests", fmtInt(totals.requests)],
              ["Errors", fmtInt(totals.errors)],
              ["Prompt tokens", fmtInt(totals.promptTokens)],
              ["Completion tokens", fmtInt(totals.completionTokens)],
              ["Latency p50", fmtMs(totals.latencyP50Ms)],
            ]}
          />
          <p class="row" style="margin-top:12px">
            <a
              class="btn small"
              href={`/usage?tenant=${tenant.id}&key=${key.id}&range=30d`}
            >
              Usage charts and spend →
            </a>
            <a
              class="btn small"
              href={`/tenants/${tenant.id}/requests?key=${key.id}`}
              data-testid="key-requests"
            >
              Request log →
            </a>
          </p>
        </Card>
        <Card title="Details" id="details">
          <dl class="kv">
            <dt>Scopes</dt>
            <dd>{key.scopes.join(", ")}</dd>
            <dt>Models</dt>
            <dd>{key.models ? key.models.join(", ") : "all"}</dd>
            <dt>Created</dt>
            <dd>{fmtTime(key.createdAt)}</dd>
            <dt>Expires</dt>
            <dd>{fmtTime(key.expiresAt)}</dd>
            <dt>Last used</dt>
            <dd>{fmtTime(key.lastUsedAt)}</dd>
            <dt>Rotated</dt>
            <dd data-testid="key-rotated">{fmtTime(key.rotatedAt)}</dd>
            {key.previousValidUntil && (
              <>
                <dt>Previous secret</dt>
                <dd data-testid="key-grace">
                  works until {fmtTime(key.previousValidUntil)}
                </dd>
              </>
            )}
          </dl>
        </Card>
        {canWrite && (
          <div class="grid2">
            <Card title="Edit" id="edit">
              {messages("edit")}
              <EditForm
                action={`${base}/edit`}
                csrf={csrf}
                keyView={key}
                limits={limits}
                typed={(n) => typed("edit", n)}
                failed={failure?.section === "edit"}
              />
            </Card>
            <Card title="Rotate the secret" id="rotate">
              {messages("rotate")}
              <p class="muted">
                A new secret replaces this one; limits, budgets and usage stay
                with the key. Clients keep working with the old secret for the
                grace period you choose, then it stops.
              </p>
              <PostForm action={`${base}/rotate`} csrf={csrf} id="rotate-form">
                <div class="field">
                  <label for="f-grace">Old secret keeps working for</label>
                  <select id="f-grace" name="grace">
                    {ROTATION_GRACE_MS.map((ms) => (
                      <option
                        key={ms}
                        value={String(ms / 1000)}
                        selected={String(ms / 1000) ===
                          (typed("rotate", "grace") ?? "86400")}
                      >
                        {GRACE_LABELS[ms]}
                      </option>
                    ))}
                  </select>
                </div>
                <Island
                  name="ConfirmSubmit"
                  component={ConfirmSubmit}
                  props={{
                    label: "Rotate",
                    confirmLabel: "Yes, rotate",
                    question: "The new secret is shown once.",
                    action: "rotate",
                  }}
                />
              </PostForm>
            </Card>
          </div>
        )}
      </>
    ),
    status,
  );
}

function EditForm(
  props: {
    action: string;
    csrf: string;
    keyView: ApiKeyView;
    limits: Limits;
    typed: (name: string) => string | undefined;
    failed: boolean;
  },
) {
  const { keyView: key, typed } = props;
  const checked = (s: string) =>
    props.failed
      ? (typed("scopes") ?? "").split(",").includes(s)
      : key.scopes.includes(s as ApiKeyView["scopes"][number]);
  return (
    <PostForm action={props.action} csrf={props.csrf} id="edit-form">
      <Field
        label="Name"
        name="name"
        required
        maxLength={100}
        value={typed("name") ?? key.name}
      />
      <div class="field">
        <label>Scopes</label>
        <div class="checks">
          {SCOPES.map((s) => (
            <label key={s}>
              <input
                type="checkbox"
                name="scopes"
                value={s}
                checked={checked(s)}
              />{" "}
              {s}
            </label>
          ))}
        </div>
      </div>
      <Field
        label="Models"
        name="models"
        hint="comma-separated; empty: all models"
        value={typed("models") ?? (key.models ?? []).join(", ")}
      />
      <p class="muted">
        Own limits, within the tenant's (empty: the tenant's only).
      </p>
      {LIMIT_FIELDS.map((f) => (
        <Field
          key={f}
          label={LIMIT_LABELS[f]}
          name={f}
          type="number"
          min={0}
          max={1e12}
          hint={props.limits[f] === null
            ? "tenant: unlimited"
            : `tenant: ${fmtInt(props.limits[f])}`}
          value={typed(f) ?? key.limits?.[f] ?? null}
        />
      ))}
      <button class="primary" type="submit">Save key</button>
    </PostForm>
  );
}

/** Runs a post: 303 to the key page with a flash, or the page with the error. */
async function attempt(
  c: C,
  section: Section,
  fn: () => Promise<Flash | Response>,
) {
  try {
    const out = await fn();
    if (out instanceof Response) return out;
    const { tenant, key } = await load(c);
    return await redirectWithFlash(
      c,
      `/tenants/${tenant.id}/keys/${key.id}#${
        out.newKey ? "new-key" : section
      }`,
      { section: out.newKey ? undefined : section, ...out },
    );
  } catch (err) {
    if (
      !(err instanceof ServiceError) || err.status === 404 || err.status === 403
    ) throw err;
    const body = await c.req.parseBody({ all: true });
    const input: Record<string, string> = {};
    for (const [k, v] of Object.entries(body)) {
      if (k.startsWith("_")) continue;
      input[k] = ([] as unknown[]).concat(v).map(str).join(",").slice(0, 400);
    }
    return await view(
      c,
      {},
      { error: portalMessage(err), section, input },
      err.status === 409 ? 409 : 400,
    );
  }
}

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

/** A plain GET of a form's address: the key page. */
/** A plain GET of a key form's address: the key's page (a key gone: the tenant's keys). */
async function toPage(c: C) {
  const store = c.get("deps").store;
  const tenant = await getTenant(
    store,
    c.get("principal")!,
    c.req.param("id")!,
  );
  try {
    const { key } = await load(c);
    return c.redirect(`/tenants/${tenant.id}/keys/${key.id}`, 303);
  } catch (e) {
    if (!(e instanceof NotFoundError)) throw e;
    return c.redirect(`/tenants/${tenant.id}#keys`, 303);
  }
}

/** `/tenants/:id/keys/:keyId…` (mounted under `/tenants`). */
export const keyRoutes = new Hono<PortalEnv>()
  .get("/:id/keys/:keyId", async (c) => view(c, await takeFlash(c)))
  .get("/:id/keys/:keyId/edit", toPage)
  .post("/:id/keys/:keyId/edit", (c) =>
    attempt(c, "edit", async () => {
      const { store, p, tenant, key } = await load(c);
      const body = await c.req.parseBody({ all: true });
      const models = str(body.models).split(",").map((s) => s.trim())
        .filter(Boolean);
      const limits = limitsFromForm(body);
      const after = await updateApiKey(store, p, key.id, {
        name: str(body.name),
        scopes: ([] as unknown[]).concat(body.scopes ?? []).map(str),
        models: models.length ? models : null,
        limits: Object.values(limits).every((v) => v === null) ? null : limits,
      }, tenant.id);
      return { ok: `Key "${after.name}" saved.` };
    }))
  .get("/:id/keys/:keyId/rotate", toPage)
  .post("/:id/keys/:keyId/rotate", (c) =>
    attempt(c, "rotate", async () => {
      const { store, p, tenant, key } = await load(c);
      const body = await c.req.parseBody();
      const seconds = Number(str(body.grace) || "0");
      requireTenantWrite(p, tenant.id, "API key");
      if (!(await confirmed(c))) {
        return confirmPage(c, {
          title: `Rotate key "${key.name}"?`,
          question: seconds === 0
            ? "The current secret stops working at once; the new one is shown once."
            : "The new secret is shown once; the current one keeps working for the grace period.",
          confirmLabel: "Yes, rotate",
          action: `/tenants/${tenant.id}/keys/${key.id}/rotate`,
          back: `/tenants/${tenant.id}/keys/${key.id}#rotate`,
          active: isPlatform(p) ? "/tenants" : `/tenants/${tenant.id}`,
          fields: { grace: String(seconds) },
        });
      }
      const { key: secret, apiKey } = await rotateApiKey(
        store,
        p,
        key.id,
        Number.isFinite(seconds) ? seconds * 1000 : -1,
        tenant.id,
      );
      return {
        newKey: { key: secret, name: apiKey.name },
        ok: apiKey.previousValidUntil
          ? `Key "${apiKey.name}" rotated. The previous secret works until ${
            fmtTime(apiKey.previousValidUntil)
          }.`
          : `Key "${apiKey.name}" rotated. The previous secret no longer works.`,
      };
    }));
