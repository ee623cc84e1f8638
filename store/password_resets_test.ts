import assert from "node:assert/strict";
import { listAudit } from "./audit.ts";
import {
  ForbiddenError,
  NotFoundError,
  UnauthorizedError,
  ValidationError,
} from "./errors.ts";
import {
  completePasswordReset,
  createPasswordReset,
  findPasswordReset,
} from "./password_resets.ts";
import { type Principal, SYSTEM } from "./principal.ts";
import { checkSession, login } from "./sessions.ts";
import { createStore } from "./store.ts";
import { createTenant } from "./tenants.ts";
import {
  acceptInvite,
  createInvite,
  createUser,
  findInvite,
  listPendingInvites,
  listUserAccounts,
  reissueInvite,
  revokeInviteById,
  setUserDisabled,
} from "./users.ts";

const PW = "twelve+ characters";
const NEW_PW = "a brand new password";

async function setup() {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const a = await createTenant(store, SYSTEM, { name: "Acme" });
  const b = await createTenant(store, SYSTEM, { name: "Globex" });
  const mk = (
    email: string,
    role: Principal["role"],
    tenantId: string | null,
  ) => createUser(store, SYSTEM, { email, password: PW, role, tenantId });
  const root = await mk("root@x.test", "platform_admin", null);
  const adminA = await mk("admin@a.test", "tenant_admin", a.id);
  const devA = await mk("dev@a.test", "tenant_viewer", a.id);
  const bossB = await mk("boss@b.test", "tenant_admin", b.id);
  const as = (u: typeof root): Principal => ({
    kind: "user",
    id: u.id,
    label: u.email,
    role: u.role,
    tenantId: u.tenantId,
    ip: null,
  });
  return { kv, store, a, b, root, adminA, devA, bossB, as };
}

Deno.test("password reset: a one-time link sets the password, ends every session, and is audited", async () => {
  const { kv, store, a, adminA, devA, as } = await setup();
  const s1 = (await login(store, devA.email, PW, null)).session;
  const s2 = (await login(store, devA.email, PW, null)).session;
  const { token, reset } = await createPasswordReset(
    store,
    as(adminA),
    devA.id,
  );
  assert.match(token, /^[0-9a-z]{26}\.[0-9A-Za-z]{32}$/);
  assert.equal(reset.email, devA.email);
  assert.equal("hash" in reset, false);
  assert.ok(Date.parse(reset.expiresAt) > Date.now() + 23 * 3600_000);
  assert.equal((await findPasswordReset(store, token))?.user.id, devA.id);
  assert.equal(await findPasswordReset(store, token + "x"), null);
  // issuing alone signs no one out
  assert.ok(await checkSession(store, s1.sid));
  await assert.rejects(
    () => completePasswordReset(store, token, "short", null),
    ValidationError,
  );
  await completePasswordReset(store, token, NEW_PW, "10.1.1.1");
  assert.equal(await checkSession(store, s1.sid), null);
  assert.equal(await checkSession(store, s2.sid), null);
  await assert.rejects(
    () => login(store, devA.email, PW, null),
    UnauthorizedError,
  );
  assert.ok(await login(store, devA.email, NEW_PW, null));
  // one time only
  assert.equal(await findPasswordReset(store, token), null);
  await assert.rejects(
    () => completePasswordReset(store, token, NEW_PW, null),
    NotFoundError,
  );
  const audit = await listAudit(kv, SYSTEM, { tenantId: a.id });
  assert.deepEqual(
    audit.items.slice(0, 2).map((e) => [e.action, e.actor.id]),
    [["user.password_reset", devA.id], [
      "user.password_reset_link",
      adminA.id,
    ]],
  );
  assert.ok(!JSON.stringify(audit).includes(token.split(".")[1]!));
  assert.ok(!JSON.stringify(audit).includes("argon2"));
  kv.close();
});

Deno.test("password reset: a newer link replaces the older; disabled users get none", async () => {
  const { kv, store, devA } = await setup();
  const first = await createPasswordReset(store, SYSTEM, devA.id);
  const second = await createPasswordReset(store, SYSTEM, devA.id);
  assert.equal(await findPasswordReset(store, first.token), null);
  assert.ok(await findPasswordReset(store, second.token));
  await setUserDisabled(store, SYSTEM, devA.id, true);
  assert.equal(await findPasswordReset(store, second.token), null);
  await assert.rejects(
    () => createPasswordReset(store, SYSTEM, devA.id),
    ValidationError,
  );
  kv.close();
});

Deno.test("password reset: only who may change the user can issue one", async () => {
  const { kv, store, root, adminA, devA, bossB, as } = await setup();
  await assert.rejects(
    () => createPasswordReset(store, as(adminA), bossB.id),
    NotFoundError,
  );
  await assert.rejects(
    () => createPasswordReset(store, as(adminA), root.id),
    NotFoundError,
  );
  await assert.rejects(
    () => createPasswordReset(store, as(devA), adminA.id),
    ForbiddenError,
  );
  await assert.rejects(
    () => createPasswordReset(store, SYSTEM, "nope"),
    NotFoundError,
  );
  assert.ok(await createPasswordReset(store, as(root), bossB.id));
  kv.close();
});

Deno.test("disabling a user ends their sessions, so enabling them again does not revive them", async () => {
  const { kv, store, adminA, devA, as } = await setup();
  const { session } = await login(store, devA.email, PW, null);
  await setUserDisabled(store, as(adminA), devA.id, true);
  await setUserDisabled(store, as(adminA), devA.id, false);
  assert.equal(await checkSession(store, session.sid), null);
  assert.ok(await login(store, devA.email, PW, null));
  kv.close();
});

Deno.test("listUserAccounts(): last sign-in; tenant admins see their members, platform admins everyone", async () => {
  const { kv, store, a, adminA, devA, as } = await setup();
  await login(store, devA.email, PW, null);
  const mine = await listUserAccounts(store, as(adminA), a.id);
  assert.deepEqual(
    mine.items.map((u) => [u.email, u.lastSignInAt !== null]).sort(),
    [["admin@a.test", false], ["dev@a.test", true]],
  );
  assert.equal(JSON.stringify(mine).includes("argon2"), false);
  const all = await listUserAccounts(store, SYSTEM, null);
  assert.equal(all.items.length, 4);
  await assert.rejects(
    () => listUserAccounts(store, as(adminA), null),
    ForbiddenError,
  );
  kv.close();
});

Deno.test("invites: pending ones are listed per tenant, can be revoked or reissued (old link dead)", async () => {
  const { kv, store, a, b, adminA, devA, as } = await setup();
  const invA = await createInvite(store, as(adminA), {
    email: "new@a.test",
    role: "tenant_viewer",
    tenantId: a.id,
  });
  const invB = await createInvite(store, SYSTEM, {
    email: "new@b.test",
    role: "tenant_viewer",
    tenantId: b.id,
  });
  const listA = await listPendingInvites(store, as(adminA), a.id);
  assert.deepEqual(listA.items.map((i) => i.email), ["new@a.test"]);
  assert.equal(JSON.stringify(listA).includes("hash"), false);
  assert.equal((await listPendingInvites(store, SYSTEM, null)).items.length, 2);
  await assert.rejects(
    () => listPendingInvites(store, as(adminA), b.id),
    NotFoundError,
  );
  await assert.rejects(
    () => revokeInviteById(store, as(adminA), invB.invite.id),
    NotFoundError,
  );
  await assert.rejects(
    () => revokeInviteById(store, as(devA), invA.invite.id),
    ForbiddenError,
  );
  const again = await reissueInvite(store, as(adminA), invA.invite.id);
  assert.equal(await findInvite(store, invA.token), null);
  assert.equal((await findInvite(store, again.token))?.email, "new@a.test");
  await revokeInviteById(store, as(adminA), again.invite.id);
  await assert.rejects(
    () => acceptInvite(store, again.token, PW, null),
    NotFoundError,
  );
  assert.deepEqual(
    (await listPendingInvites(store, as(adminA), a.id)).items,
    [],
  );
  const actions = (await listAudit(kv, SYSTEM, { tenantId: a.id })).items.map(
    (e) => e.action,
  );
  // Newest first: the revoke, the reissue (a new invite replacing the old
  // one: its audit entry holds the old one as `before`), the first invite.
  assert.deepEqual(actions.slice(0, 3), [
    "invite.revoke",
    "user.invite",
    "user.invite",
  ]);
  kv.close();
});
