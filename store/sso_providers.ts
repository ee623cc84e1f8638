/**
 * OpenID Connect providers the portal signs people in with, configured by
 * platform admins: issuer, client id and secret, scopes, the display name
 * on the sign-in button, an optional tenant the provider is restricted to
 * (a client's own IdP signs its people into its tenant only, never as
 * platform admins), and the ordered claim rules (store/sso_rules.ts).
 *
 * The client secret is kept sealed (a JWE under a key derived from the
 * server's session key, bound to the provider id): never in clear in KV,
 * on disk, in the audit log or in logs, and never shown again.
 */
import { z } from "zod";
import { deriveKey256 } from "../lib/crypto.ts";
import { openSecret, sealSecret } from "../lib/jwt.ts";
import { checkIssuer, type OidcClient } from "../lib/oidc.ts";
import { addAudit } from "./audit.ts";
import { ConflictError, NotFoundError, ValidationError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import { parse, ROLES, slug } from "./schemas.ts";
import {
  checkRule,
  type ClaimRule,
  MAX_RULES,
  type RuleInput,
} from "./sso_rules.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";

/** A provider as stored. */
export interface SsoProvider {
  /** Chosen by the admin; part of the redirect URI (`/sso/<id>/callback`). */
  id: string;
  displayName: string;
  issuer: string;
  clientId: string;
  /** The client secret, sealed (see `sealSecret`). */
  sealedSecret: string;
  scopes: string;
  /** The only tenant this provider may sign people into; null: any (per rules). */
  tenantId: string | null;
  rules: ClaimRule[];
  /**
   * Link a first sign-in to an existing account with the same email even
   * when the provider does not assert `email_verified` (Entra ID does not).
   */
  trustEmail: boolean;
  enabled: boolean;
  createdAt: string;
  updatedAt: string;
  updatedBy: string;
}

/** A provider as shown: never its secret. */
export type SsoProviderView = Omit<SsoProvider, "sealedSecret">;

/** Most providers configured at once. */
export const MAX_PROVIDERS = 50;
/** Scopes asked for when none are given. */
export const DEFAULT_SCOPES = "openid email profile";

const ruleSchema = z.object({
  claim: z.string({ error: "claim must be a string" }).max(100),
  op: z.enum(["equals", "contains", "ends_with", "any"], {
    error: "op must be equals, contains, ends_with or any",
  }),
  value: z.string({ error: "value must be a string" }).max(200)
    .optional().default(""),
  tenant: z.string().max(64).nullable().optional().default(null),
  role: z.enum(ROLES, {
    error: "role must be platform_admin, tenant_admin or tenant_viewer",
  }),
}).strict();

const inputSchema = z.object({
  id: slug,
  displayName: z.string({ error: "Display name must be a string" }).trim()
    .min(1, "Display name is required")
    .max(60, "Display name must be at most 60 characters"),
  issuer: z.string({ error: "Issuer must be a string" }).max(500)
    .transform((v, ctx) => {
      const r = checkIssuer(v);
      if ("error" in r) {
        ctx.addIssue({ code: "custom", message: `Issuer ${r.error}` });
        return z.NEVER;
      }
      return r.url;
    }),
  clientId: z.string({ error: "Client id must be a string" }).trim()
    .min(1, "Client id is required")
    .max(400, "Client id must be at most 400 characters"),
  /** Empty or absent on an update: keep the current secret. */
  clientSecret: z.string({ error: "Client secret must be a string" })
    .max(2000, "Client secret must be at most 2000 characters")
    .optional().default(""),
  scopes: z.string({ error: "Scopes must be a string" }).max(500)
    .optional().default(DEFAULT_SCOPES)
    .transform((v, ctx) => {
      const list = v.split(/\s+/).filter(Boolean);
      if (list.some((s) => !/^[\x21\x23-\x5b\x5d-\x7e]{1,100}$/.test(s))) {
        ctx.addIssue({
          code: "custom",
          message: "Scopes must be words separated by spaces",
        });
        return z.NEVER;
      }
      if (!list.includes("openid")) list.unshift("openid");
      return [...new Set(list)].slice(0, 20).join(" ");
    }),
  tenantId: z.string().max(64).nullable().optional().default(null),
  rules: z.array(ruleSchema).max(MAX_RULES, `at most ${MAX_RULES} rules`)
    .optional().default([]),
  trustEmail: z.boolean().optional().default(false),
  enabled: z.boolean().optional().default(true),
}).strict();

/** What a create or update takes (the portal's form and tests). */
export type SsoProviderInput = z.input<typeof inputSchema>;

const keys = new WeakMap<Uint8Array, Promise<Uint8Array>>();
function secretKey(store: Store): Promise<Uint8Array> {
  const raw = store.secrets.sessionKey;
  let key = keys.get(raw);
  if (!key) {
    key = deriveKey256(raw, "orchard sso client secret v1");
    keys.set(raw, key);
  }
  return key;
}

/** Strips the sealed secret. */
export function providerView(p: SsoProvider): SsoProviderView {
  const { sealedSecret: _s, ...view } = p;
  return view;
}

/**
 * Turns rules as written (tenants by slug or id) into stored rules, and
 * checks them against the provider's restriction: a restricted provider's
 * rules give only tenant roles in its own tenant.
 */
async function resolveRules(
  store: Store,
  rules: RuleInput[],
  restrictTo: string | null,
): Promise<ClaimRule[]> {
  const out: ClaimRule[] = [];
  for (const [i, raw] of rules.entries()) {
    const n = i + 1;
    const r = checkRule(raw, n);
    if (r.role === "platform_admin") {
      if (restrictTo) {
        throw new ValidationError(
          `Rule ${n}: a provider restricted to one tenant cannot sign anyone in as platform admin`,
          "rules",
        );
      }
      if (r.tenant) {
        throw new ValidationError(
          `Rule ${n}: platform admins belong to no tenant; leave the tenant out`,
          "rules",
        );
      }
      out.push({ ...r, tenantId: null });
      continue;
    }
    let tenantId = restrictTo;
    if (r.tenant) {
      const bySlug = r.tenant.length <= 64
        ? (await store.kv.get<string>(k.tenantBySlug(r.tenant))).value
        : null;
      const t = await getTenantRaw(store, bySlug ?? r.tenant);
      if (!t) {
        throw new ValidationError(
          `Rule ${n}: there is no tenant "${r.tenant.slice(0, 64)}"`,
          "rules",
        );
      }
      if (restrictTo && t.id !== restrictTo) {
        throw new ValidationError(
          `Rule ${n}: this provider is restricted to one tenant and cannot sign people into "${t.slug}"`,
          "rules",
        );
      }
      tenantId = t.id;
    }
    if (!tenantId) {
      throw new ValidationError(
        `Rule ${n}: name the tenant for a ${r.role.replace("_", " ")}`,
        "rules",
      );
    }
    out.push({
      claim: r.claim,
      op: r.op,
      value: r.value,
      tenantId,
      role: r.role,
    });
  }
  return out;
}

/** Every provider, ordered by id (platform admins only). */
export async function listProviders(
  store: Store,
  p: Principal,
): Promise<SsoProviderView[]> {
  requirePlatform(p);
  const out: SsoProviderView[] = [];
  for await (
    const e of store.kv.list<SsoProvider>({ prefix: k.ssoProviderPrefix() }, {
      limit: MAX_PROVIDERS,
    })
  ) out.push(providerView(e.value));
  return out;
}

/** The enabled providers' ids and names, for the sign-in page's buttons (public). */
export async function signInProviders(
  store: Store,
): Promise<{ id: string; displayName: string }[]> {
  const out: { id: string; displayName: string }[] = [];
  for await (
    const e of store.kv.list<SsoProvider>({ prefix: k.ssoProviderPrefix() }, {
      limit: MAX_PROVIDERS,
    })
  ) {
    if (e.value.enabled) {
      out.push({ id: e.value.id, displayName: e.value.displayName });
    }
  }
  return out;
}

/**
 * An enabled provider with its secret opened, for a sign-in; null when
 * unknown or disabled.
 */
export async function providerForSignIn(
  store: Store,
  id: string,
): Promise<{ provider: SsoProvider; client: OidcClient } | null> {
  if (!id || id.length > 64) return null;
  const provider = (await store.kv.get<SsoProvider>(k.ssoProvider(id))).value;
  if (!provider?.enabled) return null;
  const secret = await openSecret(
    await secretKey(store),
    provider.sealedSecret,
    provider.id,
  );
  if (secret === null) {
    throw new Error(`Cannot open the client secret of SSO provider ${id}`);
  }
  return {
    provider,
    client: {
      issuer: provider.issuer,
      clientId: provider.clientId,
      clientSecret: secret,
      scopes: provider.scopes,
    },
  };
}

async function build(
  store: Store,
  p: Principal,
  input: unknown,
  previous: SsoProvider | null,
): Promise<{ record: SsoProvider; secretChanged: boolean }> {
  const data = parse(inputSchema, input);
  if (previous && data.id !== previous.id) {
    throw new ValidationError("A provider's id cannot change", "id");
  }
  if (data.tenantId && !(await getTenantRaw(store, data.tenantId))) {
    throw new ValidationError("There is no such tenant", "tenantId");
  }
  if (!previous && !data.clientSecret) {
    throw new ValidationError("Client secret is required", "clientSecret");
  }
  const now = new Date().toISOString();
  const sealedSecret = data.clientSecret
    ? await sealSecret(await secretKey(store), data.clientSecret, data.id)
    : previous!.sealedSecret;
  return {
    record: {
      id: data.id,
      displayName: data.displayName,
      issuer: data.issuer,
      clientId: data.clientId,
      sealedSecret,
      scopes: data.scopes,
      tenantId: data.tenantId,
      rules: await resolveRules(store, data.rules, data.tenantId),
      trustEmail: data.trustEmail,
      enabled: data.enabled,
      createdAt: previous?.createdAt ?? now,
      updatedAt: now,
      updatedBy: p.label,
    },
    secretChanged: data.clientSecret !== "",
  };
}

/** Adds a provider (platform admins; audited); a taken id is a 409. */
export async function createProvider(
  store: Store,
  p: Principal,
  input: unknown,
): Promise<SsoProviderView> {
  requirePlatform(p);
  const { record } = await build(store, p, input, null);
  let count = 0;
  for await (const _ of store.kv.list({ prefix: k.ssoProviderPrefix() })) {
    count++;
  }
  if (count >= MAX_PROVIDERS) {
    throw new ConflictError(`At most ${MAX_PROVIDERS} providers`);
  }
  const op = store.kv.atomic()
    .check({ key: k.ssoProvider(record.id), versionstamp: null })
    .set(k.ssoProvider(record.id), record);
  addAudit(op, p, {
    action: "sso.provider.create",
    target: { type: "sso_provider", id: record.id, label: record.displayName },
    tenantId: record.tenantId,
    after: { ...providerView(record), clientSecret: "(set)" },
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError(
      `A provider with id "${record.id}" already exists`,
      "id",
    );
  }
  return providerView(record);
}

/** Changes a provider (platform admins; audited); an empty secret keeps the current one. */
export async function updateProvider(
  store: Store,
  p: Principal,
  id: string,
  input: unknown,
): Promise<SsoProviderView> {
  requirePlatform(p);
  const entry = await store.kv.get<SsoProvider>(k.ssoProvider(id.slice(0, 64)));
  if (!entry.value) throw new NotFoundError("Provider");
  const { record, secretChanged } = await build(store, p, input, entry.value);
  const op = store.kv.atomic().check(entry).set(entry.key, record);
  addAudit(op, p, {
    action: "sso.provider.update",
    target: { type: "sso_provider", id: record.id, label: record.displayName },
    tenantId: record.tenantId,
    before: providerView(entry.value),
    after: {
      ...providerView(record),
      ...(secretChanged ? { clientSecret: "(changed)" } : {}),
    },
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The provider changed meanwhile; try again");
  }
  return providerView(record);
}

/**
 * Removes a provider (platform admins; audited) and its links to users:
 * the users stay, but a provider added later under the same id does not
 * inherit them.
 */
export async function deleteProvider(
  store: Store,
  p: Principal,
  id: string,
): Promise<SsoProviderView> {
  requirePlatform(p);
  const entry = await store.kv.get<SsoProvider>(k.ssoProvider(id.slice(0, 64)));
  if (!entry.value) throw new NotFoundError("Provider");
  const op = store.kv.atomic().check(entry).delete(entry.key);
  addAudit(op, p, {
    action: "sso.provider.delete",
    target: {
      type: "sso_provider",
      id: entry.value.id,
      label: entry.value.displayName,
    },
    tenantId: entry.value.tenantId,
    before: providerView(entry.value),
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The provider changed meanwhile; try again");
  }
  for (;;) {
    const batch: Deno.KvKey[] = [];
    for await (
      const e of store.kv.list({ prefix: k.userBySsoPrefix(entry.value.id) }, {
        limit: 100,
      })
    ) batch.push(e.key);
    if (batch.length === 0) break;
    const del = store.kv.atomic();
    for (const key of batch) del.delete(key);
    await del.commit();
  }
  return providerView(entry.value);
}
