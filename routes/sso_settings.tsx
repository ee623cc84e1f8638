/**
 * `/settings/sso` (platform admins only): the OpenID Connect providers the
 * sign-in page offers, their claim rules, and which tenants may still sign
 * in with a password. Saving a provider reads its discovery document first,
 * so a mistyped issuer is said at once. Every change is audited by the
 * store; client secrets are write-only.
 */
import type { Context } from "hono";
import { Hono } from "hono";
import type { ComponentChildren } from "preact";
import { Island } from "../components/Island.tsx";
import { Alert, Badge, Card, PostForm, Table } from "../components/ui.tsx";
import ConfirmSubmit from "../islands/ConfirmSubmit.tsx";
import { discover, OidcError } from "../lib/oidc.ts";
import { ValidationError } from "../store/errors.ts";
import { requirePlatform } from "../store/principal.ts";
import {
  listPasswordOffTenants,
  setPasswordSignIn,
} from "../store/sign_in_policy.ts";
import {
  createProvider,
  DEFAULT_SCOPES,
  deleteProvider,
  listProviders,
  type SsoProviderView,
  updateProvider,
} from "../store/sso_providers.ts";
import { formatRules, parseRules } from "../store/sso_rules.ts";
import { listTenants, type Tenant } from "../store/tenants.ts";
import { confirmed, confirmPage } from "./_confirm.tsx";
import type { PortalEnv } from "./_env.ts";
import {
  type Flash,
  FlashMessages,
  redirectWithFlash,
  takeFlash,
} from "./_flash.tsx";
import { page, str } from "./_page.tsx";
import { redirectUri } from "./sso.tsx";

type C = Context<PortalEnv>;
const PATH = "/settings/sso";
const RULES_EXAMPLE = [
  'groups contains "acme-admins" -> tenant acme, role tenant_admin',
  'email ends_with "@acme.com" -> tenant acme, role tenant_viewer',
].join("\n");

/** A provider form's values as typed (the secret is never shown back). */
interface FormValues {
  id: string;
  displayName: string;
  issuer: string;
  clientId: string;
  scopes: string;
  tenantId: string;
  rules: string;
  trustEmail: boolean;
  enabled: boolean;
}

/** An error to show in one form (`form`: a provider id, or "new"). */
interface FormError {
  form: string;
  message: string;
  values: FormValues;
}

function valuesOf(p: SsoProviderView, slugOf: (id: string) => string) {
  return {
    id: p.id,
    displayName: p.displayName,
    issuer: p.issuer,
    clientId: p.clientId,
    scopes: p.scopes,
    tenantId: p.tenantId ?? "",
    rules: formatRules(p.rules, slugOf),
    trustEmail: p.trustEmail,
    enabled: p.enabled,
  } satisfies FormValues;
}

function Input(
  props: {
    form: string;
    name: string;
    label: string;
    value: string;
    hint?: string;
    type?: string;
    placeholder?: string;
    required?: boolean;
  },
) {
  const id = `sso-${props.form}-${props.name}`;
  return (
    <div class="field">
      <label for={id}>
        {props.label} {props.hint && <span class="hint">{props.hint}</span>}
      </label>
      <input
        id={id}
        name={props.name}
        type={props.type ?? "text"}
        value={props.value}
        placeholder={props.placeholder}
        required={props.required}
        maxLength={props.name === "clientSecret" ? 2000 : 500}
        autocomplete="off"
      />
    </div>
  );
}

function ProviderFields(
  props: {
    form: string;
    v: FormValues;
    tenants: Tenant[];
    isNew: boolean;
  },
) {
  const { form, v } = props;
  return (
    <>
      <div class="row">
        {props.isNew
          ? (
            <Input
              form={form}
              name="id"
              label="Id"
              hint="in the redirect URI; cannot change"
              value={v.id}
              placeholder="e.g. entra"
              required
            />
          )
          : <input type="hidden" name="id" value={v.id} />}
        <Input
          form={form}
          name="displayName"
          label="Button label"
          hint="Sign in with …"
          value={v.displayName}
          placeholder="e.g. Microsoft"
          required
        />
      </div>
      <Input
        form={form}
        name="issuer"
        label="Issuer URL"
        hint="its /.well-known/openid-configuration is read"
        value={v.issuer}
        placeholder="https://login.microsoftonline.com/<tenant id>/v2.0"
        required
      />
      <div class="row">
        <Input
          form={form}
          name="clientId"
          label="Client id"
          value={v.clientId}
          required
        />
        <Input
          form={form}
          name="clientSecret"
          label="Client secret"
          type="password"
          hint={props.isNew ? "" : "leave empty to keep the current one"}
          value=""
          placeholder={props.isNew ? "" : "unchanged"}
          required={props.isNew}
        />
      </div>
      <div class="row">
        <Input
          form={form}
          name="scopes"
          label="Scopes"
          value={v.scopes}
          placeholder={DEFAULT_SCOPES}
        />
        <div class="field">
          <label for={`sso-${form}-tenantId`}>
            Restricted to tenant{" "}
            <span class="hint">a client's own IdP: its tenant only</span>
          </label>
          <select id={`sso-${form}-tenantId`} name="tenantId">
            <option value="">— any tenant (as the rules say)</option>
            {props.tenants.map((t) => (
              <option key={t.id} value={t.id} selected={v.tenantId === t.id}>
                {t.name} ({t.slug})
              </option>
            ))}
          </select>
        </div>
      </div>
      <div class="field">
        <label for={`sso-${form}-rules`}>
          Sign-in rules{" "}
          <span class="hint">
            one per line, first match wins; no match: no access
          </span>
        </label>
        <textarea
          id={`sso-${form}-rules`}
          name="rules"
          rows={4}
          maxLength={20000}
          placeholder={RULES_EXAMPLE}
        >
          {v.rules}
        </textarea>
      </div>
      <div class="row">
        <label>
          <input
            type="checkbox"
            name="enabled"
            value="1"
            checked={v.enabled}
          />{" "}
          Offered on the sign-in page
        </label>
        <label>
          <input
            type="checkbox"
            name="trustEmail"
            value="1"
            checked={v.trustEmail}
          />{" "}
          Link existing accounts by email even without{" "}
          <code>email_verified</code>
        </label>
      </div>
    </>
  );
}

function Section(
  props: { id: string; title: string; children: ComponentChildren },
) {
  return <Card id={props.id} title={props.title}>{props.children}</Card>;
}

async function view(c: C, flash: Flash & { error?: FormError } = {}) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const [providers, tenants, passwordOff] = await Promise.all([
    listProviders(store, p),
    listTenants(store, p, { limit: 200 }).then((r) => r.items),
    listPasswordOffTenants(store),
  ]);
  const slugs = new Map(tenants.map((t) => [t.id, t.slug]));
  const slugOf = (id: string) => slugs.get(id) ?? id;
  const off = new Set(passwordOff);
  const csrf = c.get("csrf");
  const publicUrl = c.get("deps").config.publicUrl;
  const err = flash.error;
  const blank: FormValues = {
    id: "",
    displayName: "",
    issuer: "",
    clientId: "",
    scopes: DEFAULT_SCOPES,
    tenantId: "",
    rules: "",
    trustEmail: false,
    enabled: true,
  };
  return page(
    c,
    "Single sign-on",
    "/settings",
    <>
      <h1>Single sign-on</h1>
      <p class="sub">
        OpenID Connect providers (Entra ID, Google, Okta, Authentik…) people
        sign in with. Register <code>{publicUrl}/sso/&lt;id&gt;/callback</code>
        {" "}
        as the redirect URI at the provider. <a href="/settings">Prices</a>
      </p>
      <FlashMessages flash={flash} />
      {providers.map((pr) => (
        <Section
          key={pr.id}
          id={`provider-${pr.id}`}
          title={`${pr.displayName} (${pr.id})`}
        >
          <p class="muted">
            Redirect URI:{" "}
            <code data-testid="redirect-uri">
              {redirectUri(publicUrl, pr.id)}
            </code>
            {" · "}
            {pr.enabled
              ? <Badge tone="ok">on the sign-in page</Badge>
              : <Badge tone="warn">off</Badge>}
            {pr.tenantId && (
              <>
                {" · "}restricted to <b>{slugOf(pr.tenantId)}</b>
              </>
            )}
          </p>
          <FlashMessages flash={flash} section={`provider-${pr.id}`} />
          {err?.form === pr.id && <Alert tone="error">{err.message}</Alert>}
          <PostForm action={`${PATH}/providers/${pr.id}`} csrf={csrf}>
            <ProviderFields
              form={pr.id}
              v={err?.form === pr.id ? err.values : valuesOf(pr, slugOf)}
              tenants={tenants}
              isNew={false}
            />
            <button class="primary" type="submit">Save {pr.displayName}</button>
          </PostForm>
          <PostForm action={`${PATH}/providers/${pr.id}/delete`} csrf={csrf}>
            <Island
              name="ConfirmSubmit"
              component={ConfirmSubmit}
              props={{
                label: "Remove provider",
                confirmLabel: "Yes, remove",
                question:
                  "Its button disappears; accounts it made stay, without a way to sign in until linked again.",
              }}
            />
          </PostForm>
        </Section>
      ))}
      <Section id="add" title="Add a provider">
        <FlashMessages flash={flash} section="add" />
        {err?.form === "new" && <Alert tone="error">{err.message}</Alert>}
        <PostForm action={`${PATH}/providers`} csrf={csrf}>
          <ProviderFields
            form="new"
            v={err?.form === "new" ? err.values : blank}
            tenants={tenants}
            isNew
          />
          <button class="primary" type="submit">Add provider</button>
        </PostForm>
      </Section>
      <Section id="passwords" title="Password sign-in per tenant">
        <p class="muted">
          Turn passwords off for a tenant whose people sign in through its
          identity provider. Platform admins always keep their passwords.
        </p>
        <FlashMessages flash={flash} section="passwords" />
        <Table
          head={["Tenant", "Password sign-in", ""]}
          rows={tenants.length}
          empty="No tenants yet."
        >
          {tenants.map((t) => (
            <tr key={t.id} data-tenant={t.slug}>
              <td>
                {t.name} ({t.slug})
              </td>
              <td>
                {off.has(t.id)
                  ? <Badge tone="warn">off: SSO only</Badge>
                  : <Badge tone="ok">allowed</Badge>}
              </td>
              <td>
                <PostForm action={`${PATH}/password`} csrf={csrf}>
                  <input type="hidden" name="tenantId" value={t.id} />
                  {off.has(t.id)
                    ? (
                      <>
                        <input type="hidden" name="allowed" value="1" />
                        <button class="small" type="submit">
                          Allow passwords
                        </button>
                      </>
                    )
                    : (
                      <>
                        <input type="hidden" name="allowed" value="0" />
                        <Island
                          name="ConfirmSubmit"
                          component={ConfirmSubmit}
                          props={{
                            label: "Turn passwords off",
                            confirmLabel: "Yes, SSO only",
                            question:
                              "Its users must then sign in with single sign-on.",
                          }}
                        />
                      </>
                    )}
                </PostForm>
              </td>
            </tr>
          ))}
        </Table>
      </Section>
    </>,
    err ? 400 : 200,
  );
}

function formValues(body: Record<string, unknown>): FormValues {
  return {
    id: str(body.id).trim().slice(0, 64),
    displayName: str(body.displayName).slice(0, 200),
    issuer: str(body.issuer).slice(0, 500),
    clientId: str(body.clientId).slice(0, 500),
    scopes: str(body.scopes).slice(0, 500),
    tenantId: str(body.tenantId).slice(0, 64),
    rules: str(body.rules).slice(0, 20000),
    trustEmail: str(body.trustEmail) === "1",
    enabled: str(body.enabled) === "1",
  };
}

/** The store's input from the form (rules parsed from their text form). */
function inputOf(v: FormValues, secret: string) {
  return {
    id: v.id,
    displayName: v.displayName,
    issuer: v.issuer,
    clientId: v.clientId,
    clientSecret: secret,
    scopes: v.scopes || DEFAULT_SCOPES,
    tenantId: v.tenantId || null,
    rules: parseRules(v.rules),
    trustEmail: v.trustEmail,
    enabled: v.enabled,
  };
}

/** For an enabled provider, reads its discovery document (a typo is said at once). */
async function checkReachable(v: FormValues): Promise<void> {
  if (!v.enabled) return;
  try {
    await discover(v.issuer.trim(), true);
  } catch (err) {
    if (!(err instanceof OidcError)) throw err;
    throw new ValidationError(`Issuer: ${err.message}`, "issuer");
  }
}

/** `/settings/sso` and its form posts. */
export const ssoSettingsRoutes = new Hono<PortalEnv>()
  .use("*", async (c, next) => {
    requirePlatform(c.get("principal")!);
    await next();
  })
  .get("/", async (c) => await view(c, await takeFlash(c)))
  // a form's address opened by hand: its page
  .get("/providers", (c) => c.redirect(PATH, 303))
  .get("/providers/:rest{.+}", (c) => c.redirect(PATH, 303))
  .get("/password", (c) => c.redirect(`${PATH}#passwords`, 303))
  .post("/providers", async (c) => {
    const body = await c.req.parseBody();
    const v = formValues(body);
    try {
      const input = inputOf(v, str(body.clientSecret));
      await checkReachable(v);
      const pr = await createProvider(
        c.get("deps").store,
        c.get("principal")!,
        input,
      );
      return await redirectWithFlash(c, `${PATH}#provider-${pr.id}`, {
        section: `provider-${pr.id}`,
        ok: `Provider "${pr.displayName}" added.`,
      });
    } catch (err) {
      if (!(err instanceof ValidationError || isConflict(err))) throw err;
      return await view(c, {
        error: { form: "new", message: (err as Error).message, values: v },
      });
    }
  })
  .post("/providers/:providerId", async (c) => {
    const id = c.req.param("providerId");
    const body = await c.req.parseBody();
    const v = { ...formValues(body), id };
    try {
      const input = inputOf(v, str(body.clientSecret));
      await checkReachable(v);
      const pr = await updateProvider(
        c.get("deps").store,
        c.get("principal")!,
        id,
        input,
      );
      return await redirectWithFlash(c, `${PATH}#provider-${pr.id}`, {
        section: `provider-${pr.id}`,
        ok: `Provider "${pr.displayName}" saved.`,
      });
    } catch (err) {
      if (!(err instanceof ValidationError || isConflict(err))) throw err;
      return await view(c, {
        error: { form: id, message: (err as Error).message, values: v },
      });
    }
  })
  .post("/providers/:providerId/delete", async (c) => {
    const id = c.req.param("providerId");
    const store = c.get("deps").store;
    const p = c.get("principal")!;
    if (!(await confirmed(c))) {
      const pr = (await listProviders(store, p)).find((x) => x.id === id);
      if (!pr) return c.redirect(PATH, 303);
      return confirmPage(c, {
        title: `Remove provider "${pr.displayName}"?`,
        question:
          "Its sign-in button disappears and its links to accounts are removed.",
        confirmLabel: "Yes, remove",
        action: `${PATH}/providers/${id}/delete`,
        back: `${PATH}#provider-${id}`,
        active: "/settings",
      });
    }
    const pr = await deleteProvider(store, p, id);
    return await redirectWithFlash(c, PATH, {
      ok: `Provider "${pr.displayName}" removed.`,
    });
  })
  .post("/password", async (c) => {
    const body = await c.req.parseBody();
    const tenantId = str(body.tenantId).slice(0, 64);
    const allowed = str(body.allowed) === "1";
    const store = c.get("deps").store;
    const p = c.get("principal")!;
    if (!allowed && !(await confirmed(c))) {
      return confirmPage(c, {
        title: "Turn password sign-in off?",
        question:
          "This tenant's users must then sign in with single sign-on; platform admins keep their passwords.",
        confirmLabel: "Yes, SSO only",
        action: `${PATH}/password`,
        back: `${PATH}#passwords`,
        active: "/settings",
        fields: { tenantId, allowed: "0" },
      });
    }
    await setPasswordSignIn(store, p, tenantId, allowed);
    return await redirectWithFlash(c, `${PATH}#passwords`, {
      section: "passwords",
      ok: allowed
        ? "Password sign-in allowed again."
        : "Password sign-in turned off: this tenant signs in with SSO only.",
    });
  });

function isConflict(err: unknown): boolean {
  return (err as { status?: number })?.status === 409;
}
