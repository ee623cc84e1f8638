import assert from "node:assert/strict";
import { listAudit } from "./audit.ts";
import { ForbiddenError } from "./errors.ts";
import { SYSTEM } from "./principal.ts";
import {
  completePasswordReset,
  createPasswordReset,
} from "./password_resets.ts";
import {
  checkSession,
  login,
  PasswordSignInOffError,
  startSession,
} from "./sessions.ts";
import {
  listPasswordOffTenants,
  passwordSignInAllowed,
  setPasswordSignIn,
} from "./sign_in_policy.ts";
import { createStore } from "./store.ts";
import { createTenant } from "./tenants.ts";
import { createUser, getUserRaw } from "./users.ts";

const PW = "a very long password";

Deno.test("setPasswordSignIn() off: the tenant's users cannot sign in with a password, platform admins still can", async () => {
  const store = await createStore(await Deno.openKv(":memory:"));
  const acme = await createTenant(store, SYSTEM, { name: "Acme" });
  await createUser(store, SYSTEM, {
    email: "root@x.test",
    password: PW,
    role: "platform_admin",
    tenantId: null,
  });
  await createUser(store, SYSTEM, {
    email: "ann@acme.test",
    password: PW,
    role: "tenant_admin",
    tenantId: acme.id,
  });
  await assert.rejects(
    setPasswordSignIn(
      store,
      {
        ...SYSTEM,
        role: "tenant_admin",
        tenantId: acme.id,
      },
      acme.id,
      false,
    ),
    ForbiddenError,
  );
  await setPasswordSignIn(store, SYSTEM, acme.id, false);
  assert.equal(await passwordSignInAllowed(store, acme.id), false);
  assert.deepEqual(await listPasswordOffTenants(store), [acme.id]);
  await assert.rejects(
    login(store, "ann@acme.test", PW, null),
    PasswordSignInOffError,
  );
  // a wrong password is still just a wrong password (nothing revealed)
  await assert.rejects(
    login(store, "ann@acme.test", "wrong password!", null),
    /Wrong email or password/,
  );
  assert.ok((await login(store, "root@x.test", PW, null)).session.sid);
  await setPasswordSignIn(store, SYSTEM, acme.id, true);
  assert.ok((await login(store, "ann@acme.test", PW, null)).session.sid);
  const actions = (await listAudit(store.kv, SYSTEM, { tenantId: acme.id }))
    .items.map((e) => e.action);
  assert.ok(actions.includes("tenant.password_sign_in.disable"));
  assert.ok(actions.includes("tenant.password_sign_in.enable"));
});

Deno.test("turning password sign-in off ends the tenant's open password sessions at once (SSO ones stay), and no reset link can give a password", async () => {
  const store = await createStore(await Deno.openKv(":memory:"));
  const acme = await createTenant(store, SYSTEM, { name: "Acme" });
  const ann = await createUser(store, SYSTEM, {
    email: "ann@acme.test",
    password: PW,
    role: "tenant_admin",
    tenantId: acme.id,
  });
  const root = await createUser(store, SYSTEM, {
    email: "root@x.test",
    password: PW,
    role: "platform_admin",
    tenantId: null,
  });
  const byPassword = (await login(store, "ann@acme.test", PW, null)).session;
  const annRaw = (await getUserRaw(store, ann.id))!;
  const bySso = await startSession(store, annRaw, null, Date.now(), "sso");
  const rootSession = (await login(store, "root@x.test", PW, null)).session;
  const reset = await createPasswordReset(store, SYSTEM, ann.id);
  await setPasswordSignIn(store, SYSTEM, acme.id, false);
  assert.equal(await checkSession(store, byPassword.sid), null);
  assert.equal((await checkSession(store, bySso.sid))?.user.id, ann.id);
  assert.equal((await checkSession(store, rootSession.sid))?.user.id, root.id);
  // A link issued before: refused on use. A new one: refused when asked for.
  await assert.rejects(
    completePasswordReset(store, reset.token, "another long password", null),
    PasswordSignInOffError,
  );
  await assert.rejects(
    createPasswordReset(store, SYSTEM, ann.id),
    /signs in with single sign-on only/,
  );
  assert.ok((await createPasswordReset(store, SYSTEM, root.id)).token);
});
