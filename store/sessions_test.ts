import assert from "node:assert/strict";
import { TooManyRequestsError, UnauthorizedError } from "./errors.ts";
import { SYSTEM } from "./principal.ts";
import {
  bootstrapAdmin,
  checkSession,
  completeSetup,
  login,
  LOGIN_MAX_FAILURES,
  logout,
  setupPending,
} from "./sessions.ts";
import { createStore } from "./store.ts";
import { createTenant } from "./tenants.ts";
import {
  acceptInvite,
  createInvite,
  createUser,
  findInvite,
  setUserDisabled,
} from "./users.ts";

async function setup() {
  const kv = await Deno.openKv(":memory:");
  return { kv, store: await createStore(kv) };
}

const PW = "twelve+ characters";

Deno.test("login() throttles an account after repeated failures, without a permanent lockout", async () => {
  const { kv, store } = await setup();
  await createUser(store, SYSTEM, {
    email: "a@x.test",
    password: PW,
    role: "platform_admin",
    tenantId: null,
  });
  // Relative to the real clock: checkSession() compares expiry with Date.now().
  const now = Date.now() - 17 * 60_000;
  for (let i = 0; i < LOGIN_MAX_FAILURES.account; i++) {
    await assert.rejects(
      login(store, "a@x.test", "wrong password", "10.0.0.1", now),
      UnauthorizedError,
    );
  }
  await assert.rejects(
    login(store, "a@x.test", PW, "10.0.0.2", now),
    TooManyRequestsError,
  );
  const later = now + 16 * 60_000;
  const { session } = await login(store, "A@X.test", PW, "10.0.0.2", later);
  assert.ok(await checkSession(store, session.sid));
  kv.close();
});

Deno.test("logout() and disabling a user end sessions at once", async () => {
  const { kv, store } = await setup();
  const t = await createTenant(store, SYSTEM, { name: "Acme" });
  const u = await createUser(store, SYSTEM, {
    email: "u@x.test",
    password: PW,
    role: "tenant_admin",
    tenantId: t.id,
  });
  const s1 = await login(store, "u@x.test", PW, null);
  const s2 = await login(store, "u@x.test", PW, null);
  await logout(store, s1.session);
  assert.equal(await checkSession(store, s1.session.sid), null);
  assert.ok(await checkSession(store, s2.session.sid));
  await setUserDisabled(store, SYSTEM, u.id, true);
  assert.equal(await checkSession(store, s2.session.sid), null);
  await assert.rejects(login(store, "u@x.test", PW, null), UnauthorizedError);
  kv.close();
});

Deno.test("bootstrapAdmin() creates the first admin from credentials, or a one-time setup token", async () => {
  const a = await setup();
  assert.deepEqual(
    await bootstrapAdmin(a.store, { email: "root@x.test", password: PW }),
    { created: "root@x.test" },
  );
  assert.equal(
    await bootstrapAdmin(a.store, { email: "other@x.test", password: PW }),
    null,
  );
  a.kv.close();

  const b = await setup();
  const boot = await bootstrapAdmin(b.store, {});
  assert.ok(boot?.setupToken);
  assert.equal(await setupPending(b.store), true);
  await assert.rejects(
    completeSetup(b.store, "wrong", "root@x.test", PW, null),
    UnauthorizedError,
  );
  const user = await completeSetup(
    b.store,
    boot.setupToken!,
    "root@x.test",
    PW,
    null,
  );
  assert.equal(user.role, "platform_admin");
  assert.equal(await setupPending(b.store), false);
  await assert.rejects(
    completeSetup(b.store, boot.setupToken!, "evil@x.test", PW, null),
    UnauthorizedError,
  );
  b.kv.close();
});

Deno.test("acceptInvite() is single use even when two people race for it", async () => {
  const { kv, store } = await setup();
  const t = await createTenant(store, SYSTEM, { name: "Acme" });
  const { token } = await createInvite(store, SYSTEM, {
    email: "new@x.test",
    role: "tenant_viewer",
    tenantId: t.id,
  });
  assert.ok(await findInvite(store, token));
  // Tamper with a middle character (the last one may already be "x", or
  // carry only padding bits).
  const c = token[8] === "A" ? "B" : "A";
  const tampered = token.slice(0, 8) + c + token.slice(9);
  assert.equal(await findInvite(store, tampered), null);
  const results = await Promise.allSettled([
    acceptInvite(store, token, PW, null),
    acceptInvite(store, token, PW, null),
  ]);
  assert.equal(results.filter((r) => r.status === "fulfilled").length, 1);
  assert.equal(await findInvite(store, token), null);
  kv.close();
});
