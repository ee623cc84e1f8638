import assert from "node:assert/strict";
import { listAudit } from "./audit.ts";
import { ForbiddenError, ValidationError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import { type Principal, SYSTEM } from "./principal.ts";
import { checkSession } from "./sessions.ts";
import {
  createProvider,
  providerForSignIn,
  type SsoProvider,
  type SsoProviderInput,
  updateProvider,
} from "./sso_providers.ts";
import { type SsoRefusal, SsoRefusedError, ssoSignIn } from "./sso_sign_in.ts";
import { createStore, type Store } from "./store.ts";
import { createTenant } from "./tenants.ts";
import { createUser, getUserByEmail, setUserDisabled } from "./users.ts";

const PW = "a very long password";

async function world() {
  const store = await createStore(await Deno.openKv(":memory:"));
  const a = await createTenant(store, SYSTEM, { name: "Acme", slug: "acme" });
  const b = await createTenant(store, SYSTEM, { name: "Beta", slug: "beta" });
  return { store, a, b };
}

function input(over: Partial<SsoProviderInput>): SsoProviderInput {
  return {
    id: "idp",
    displayName: "IdP",
    issuer: "https://idp.example",
    clientId: "client",
    clientSecret: "the-client-secret-value",
    rules: [],
    ...over,
  };
}

async function provider(store: Store, id: string): Promise<SsoProvider> {
  return (await providerForSignIn(store, id))!.provider;
}

async function refused(
  p: Promise<unknown>,
  reason: SsoRefusal,
): Promise<void> {
  await assert.rejects(
    p,
    (e: unknown) => e instanceof SsoRefusedError && e.reason === reason,
  );
}

async function actions(store: Store): Promise<string[]> {
  return (await listAudit(store.kv, SYSTEM, {})).items.map((e) => e.action);
}

Deno.test("createProvider() keeps the client secret sealed and only platform admins configure providers", async () => {
  const { store, a } = await world();
  const tenantAdmin: Principal = {
    kind: "user",
    id: "u",
    label: "u",
    role: "tenant_admin",
    tenantId: a.id,
    ip: null,
  };
  await assert.rejects(
    createProvider(store, tenantAdmin, input({ tenantId: a.id })),
    ForbiddenError,
  );
  await createProvider(store, SYSTEM, input({}));
  const raw = await store.kv.get(k.ssoProvider("idp"));
  assert.ok(!JSON.stringify(raw.value).includes("the-client-secret-value"));
  assert.ok(
    !JSON.stringify(await listAudit(store.kv, SYSTEM, {})).includes(
      "the-client-secret-value",
    ),
  );
  assert.equal(
    (await providerForSignIn(store, "idp"))?.client.clientSecret,
    "the-client-secret-value",
  );
  // an empty secret on update keeps it; a new one replaces it
  await updateProvider(store, SYSTEM, "idp", input({ clientSecret: "" }));
  assert.equal(
    (await providerForSignIn(store, "idp"))?.client.clientSecret,
    "the-client-secret-value",
  );
  await updateProvider(store, SYSTEM, "idp", input({ clientSecret: "next" }));
  assert.equal(
    (await providerForSignIn(store, "idp"))?.client.clientSecret,
    "next",
  );
  // a sealed secret copied onto another provider does not open there
  await createProvider(store, SYSTEM, input({ id: "other" }));
  const other = await store.kv.get<SsoProvider>(k.ssoProvider("other"));
  await store.kv.set(k.ssoProvider("other"), {
    ...other.value!,
    sealedSecret: (raw.value as SsoProvider).sealedSecret,
  });
  await assert.rejects(providerForSignIn(store, "other"), /Cannot open/);
  // http only on loopback
  await assert.rejects(
    createProvider(store, SYSTEM, input({ id: "x", issuer: "http://idp.lan" })),
    /https/,
  );
});

Deno.test("createProvider() refuses rules a tenant-restricted provider may not give", async () => {
  const { store, a, b } = await world();
  const rule = (tenant: string | null, role: string) => ({
    claim: "groups",
    op: "contains" as const,
    value: "x",
    tenant,
    role: role as "tenant_admin",
  });
  await assert.rejects(
    createProvider(
      store,
      SYSTEM,
      input({ tenantId: a.id, rules: [rule(null, "platform_admin")] }),
    ),
    (e: unknown) =>
      e instanceof ValidationError && /cannot sign anyone in as platform/
        .test(e.message),
  );
  await assert.rejects(
    createProvider(
      store,
      SYSTEM,
      input({ tenantId: a.id, rules: [rule("beta", "tenant_admin")] }),
    ),
    /restricted to one tenant/,
  );
  await assert.rejects(
    createProvider(
      store,
      SYSTEM,
      input({ rules: [rule("nope", "tenant_admin")] }),
    ),
    /no tenant "nope"/,
  );
  await createProvider(
    store,
    SYSTEM,
    input({ tenantId: a.id, rules: [rule(null, "tenant_admin")] }),
  );
  assert.equal((await provider(store, "idp")).rules[0]!.tenantId, a.id);
  assert.ok(b.id);
});

Deno.test("ssoSignIn() links an existing account only when the provider vouches for its email and may reach it", async () => {
  const { store, a } = await world();
  const root = await createUser(store, SYSTEM, {
    email: "root@orchard.test",
    password: PW,
    role: "platform_admin",
    tenantId: null,
  });
  // a client's own IdP claims the platform admin's email: refused
  await createProvider(
    store,
    SYSTEM,
    input({
      id: "acme-idp",
      tenantId: a.id,
      rules: [{ claim: "*", op: "any", tenant: null, role: "tenant_admin" }],
    }),
  );
  const claims = {
    sub: "s-1",
    email: "root@orchard.test",
    email_verified: true,
  };
  await refused(
    ssoSignIn(store, await provider(store, "acme-idp"), claims, null),
    "email_taken",
  );
  // the platform's IdP, without email_verified: refused too
  await createProvider(
    store,
    SYSTEM,
    input({
      id: "corp",
      rules: [{ claim: "*", op: "any", tenant: null, role: "platform_admin" }],
    }),
  );
  const corp = await provider(store, "corp");
  await refused(
    ssoSignIn(store, corp, { ...claims, email_verified: false }, null),
    "email_taken",
  );
  assert.equal((await store.kv.get(k.userBySso("corp", "s-1"))).value, null);
  // verified: linked, and signed in as that account
  const { session, user, provisioned } = await ssoSignIn(
    store,
    corp,
    claims,
    "10.0.0.9",
  );
  assert.equal(user.id, root.id);
  assert.equal(provisioned, false);
  assert.ok(await checkSession(store, session.sid));
  assert.ok((await actions(store)).includes("user.sso_link"));
  // next time the link decides, whatever the email says
  const again = await ssoSignIn(
    store,
    corp,
    { sub: "s-1", email: "changed@orchard.test" },
    null,
  );
  assert.equal(again.user.id, root.id);
});

Deno.test("ssoSignIn() provisions on first sign-in and follows the groups afterwards", async () => {
  const { store, a, b } = await world();
  await createProvider(
    store,
    SYSTEM,
    input({
      rules: [
        {
          claim: "groups",
          op: "contains",
          value: "admins",
          tenant: "acme",
          role: "tenant_admin",
        },
        {
          claim: "groups",
          op: "contains",
          value: "staff",
          tenant: "acme",
          role: "tenant_viewer",
        },
        {
          claim: "groups",
          op: "contains",
          value: "beta",
          tenant: "beta",
          role: "tenant_viewer",
        },
      ],
    }),
  );
  const idp = await provider(store, "idp");
  const ann = (groups: string[]) => ({
    sub: "ann",
    email: "ann@acme.test",
    groups,
  });
  // no rule, no email: refused, nothing made
  await refused(ssoSignIn(store, idp, ann(["guests"]), null), "no_rule");
  await refused(
    ssoSignIn(store, idp, { sub: "x", groups: ["staff"] }, null),
    "no_email",
  );
  assert.equal(await getUserByEmail(store, "ann@acme.test"), null);

  const first = await ssoSignIn(store, idp, ann(["admins"]), null);
  assert.equal(first.provisioned, true);
  assert.equal(first.user.role, "tenant_admin");
  assert.equal(first.user.tenantId, a.id);
  assert.equal(
    (await store.kv.get(k.tenantUser(a.id, first.user.id))).value,
    first.user.id,
  );
  // out of the admins group: a viewer from the next sign-in on
  const second = await ssoSignIn(store, idp, ann(["staff"]), null);
  assert.equal(second.provisioned, false);
  assert.equal(second.user.role, "tenant_viewer");
  assert.equal(
    (await getUserByEmail(store, "ann@acme.test"))?.role,
    "tenant_viewer",
  );
  const log = await actions(store);
  for (
    const a of [
      "user.provision",
      "user.role_sync",
      "user.sso_sign_in",
      "user.sso_refused",
    ]
  ) assert.ok(log.includes(a), a);
  // groups that now point at another tenant: refused, account unchanged
  await refused(ssoSignIn(store, idp, ann(["beta"]), null), "other_tenant");
  assert.equal((await getUserByEmail(store, "ann@acme.test"))?.tenantId, a.id);
  assert.ok(b.id);
  // a disabled account stays out
  await setUserDisabled(store, SYSTEM, first.user.id, true);
  await refused(ssoSignIn(store, idp, ann(["staff"]), null), "disabled");
});
