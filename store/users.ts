/** Admin users of the portal, their roles, and one-time invites. */
import { hmac, randomBase62, safeEqual } from "../lib/crypto.ts";
import { addAudit } from "./audit.ts";
import { ConflictError, NotFoundError, ValidationError } from "./errors.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { listPage, type Page, type PageOptions } from "./pagination.ts";
import { hashPassword } from "./passwords.ts";
import {
  isPlatform,
  type Principal,
  requirePlatform,
  requireTenantRead,
  requireTenantWrite,
  type Role,
} from "./principal.ts";
import {
  email as emailSchema,
  inviteSchema,
  parse,
  password,
} from "./schemas.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";

/** A portal user. */
export interface User {
  id: string;
  email: string;
  passwordHash: string;
  role: Role;
  tenantId: string | null;
  disabled: boolean;
  createdAt: string;
}

/** A user as shown (no hash). */
export type UserView = Omit<User, "passwordHash">;

/** A pending one-time invite (the token is stored only as a keyed hash). */
export interface Invite {
  id: string;
  hash: string;
  email: string;
  role: Role;
  tenantId: string | null;
  expiresAt: string;
  createdBy: string;
}

const INVITE_TTL_MS = 7 * 24 * 3600_000;

/** Strips the password hash. */
export function userView(u: User): UserView {
  const { passwordHash: _h, ...rest } = u;
  return rest;
}

/** Reads a user by id (no access check; used by sessions). */
export async function getUserRaw(
  store: Store,
  id: string,
): Promise<User | null> {
  return (await store.kv.get<User>(k.user(id))).value;
}

/** Reads a user by email (no access check; used by login). */
export async function getUserByEmail(
  store: Store,
  email: string,
): Promise<User | null> {
  const e = email.trim().toLowerCase();
  if (e.length > 254) return null;
  const id = (await store.kv.get<string>(k.userByEmail(e))).value;
  return id ? getUserRaw(store, id) : null;
}

/** Creates a user; a taken email is a 409. */
export async function createUser(
  store: Store,
  p: Principal,
  input: {
    email: string;
    password: string;
    role: Role;
    tenantId: string | null;
  },
): Promise<UserView> {
  const email = parse(emailSchema, input.email);
  const pw = parse(password, input.password);
  if (input.role === "platform_admin") requirePlatform(p);
  else {
    if (!input.tenantId) {
      throw new ValidationError("Tenant users need a tenant", "tenantId");
    }
    requireTenantWrite(p, input.tenantId);
  }
  const user: User = {
    id: newId(),
    email,
    passwordHash: await hashPassword(pw),
    role: input.role,
    tenantId: input.role === "platform_admin" ? null : input.tenantId,
    disabled: false,
    createdAt: new Date().toISOString(),
  };
  const op = store.kv.atomic()
    .check({ key: k.userByEmail(email), versionstamp: null })
    .set(k.user(user.id), user)
    .set(k.userByEmail(email), user.id);
  if (user.tenantId) op.set(k.tenantUser(user.tenantId, user.id), user.id);
  addAudit(op, p, {
    action: "user.create",
    target: { type: "user", id: user.id, label: email },
    tenantId: user.tenantId,
    after: userView(user),
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError(
      `A user with email ${email} already exists`,
      "email",
    );
  }
  return userView(user);
}

/** Lists a tenant's members (or, for platform admins with no tenant, all users). */
export function listUsers(
  store: Store,
  p: Principal,
  tenantId: string | null,
  opts: PageOptions = {},
): Promise<Page<UserView>> {
  if (tenantId === null) {
    requirePlatform(p);
    return listPage<User, UserView>(
      store.kv,
      { prefix: k.userPrefix() },
      opts,
      userView,
    );
  }
  requireTenantRead(p, tenantId);
  return listPage<string, UserView>(
    store.kv,
    { prefix: k.tenantUserPrefix(tenantId) },
    opts,
    async (id) => {
      const u = await getUserRaw(store, id);
      return u ? userView(u) : null;
    },
  );
}

/** Disables or re-enables a user; sessions of a disabled user stop at once. */
export async function setUserDisabled(
  store: Store,
  p: Principal,
  userId: string,
  disabled: boolean,
): Promise<UserView> {
  const entry = await store.kv.get<User>(k.user(userId));
  const u = entry.value;
  if (!u) throw new NotFoundError("User");
  if (u.tenantId) requireTenantWrite(p, u.tenantId, "User");
  else if (!isPlatform(p)) throw new NotFoundError("User");
  if (u.id === p.id) {
    throw new ValidationError("You cannot disable yourself", "userId");
  }
  const after = { ...u, disabled };
  const op = store.kv.atomic().check(entry).set(k.user(userId), after);
  addAudit(op, p, {
    action: disabled ? "user.disable" : "user.enable",
    target: { type: "user", id: userId, label: u.email },
    tenantId: u.tenantId,
    before: userView(u),
    after: userView(after),
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The user changed meanwhile; try again");
  }
  // Sessions would otherwise come back to life if the user is enabled again.
  if (disabled) await endUserSessions(store, userId);
  return userView(after);
}

/** Ends every session of a user at once (disable, password reset); returns how many. */
export async function endUserSessions(
  store: Store,
  userId: string,
): Promise<number> {
  let ended = 0;
  for (;;) {
    const sids: string[] = [];
    for await (
      const e of store.kv.list<string>(
        { prefix: k.userSessionPrefix(userId) },
        {
          limit: 100,
        },
      )
    ) sids.push(e.value);
    if (sids.length === 0) return ended;
    const op = store.kv.atomic();
    for (const sid of sids) {
      op.delete(k.session(sid)).delete(k.userSession(userId, sid));
    }
    await op.commit();
    ended += sids.length;
  }
}

/** A user as the user administration page lists it. */
export type UserAccount = UserView & { lastSignInAt: string | null };

/**
 * Lists users with their last sign-in: a tenant's members, or (platform
 * admins, `tenantId` null) everyone. Same access rules as `listUsers`.
 */
export async function listUserAccounts(
  store: Store,
  p: Principal,
  tenantId: string | null,
  opts: PageOptions = {},
): Promise<Page<UserAccount>> {
  const page = await listUsers(store, p, tenantId, opts);
  const signIns = await Promise.all(
    page.items.map((u) => store.kv.get<string>(k.userLastSignIn(u.id))),
  );
  return {
    items: page.items.map((u, i) => ({
      ...u,
      lastSignInAt: signIns[i]!.value,
    })),
    cursor: page.cursor,
  };
}

/** A pending invite as listed (no hash). */
export type InviteView = Omit<Invite, "hash">;

/**
 * Lists pending (unused, unexpired) invites: a tenant's, or (platform
 * admins, `tenantId` null) all of them. Tenant members may read their
 * tenant's, like its member list.
 */
export async function listPendingInvites(
  store: Store,
  p: Principal,
  tenantId: string | null,
  opts: PageOptions = {},
): Promise<Page<InviteView>> {
  if (tenantId === null) requirePlatform(p);
  else requireTenantRead(p, tenantId);
  const now = Date.now();
  return await listPage<Invite, InviteView>(
    store.kv,
    { prefix: k.invitePrefix() },
    opts,
    (inv) => {
      if (tenantId !== null && inv.tenantId !== tenantId) return null;
      if (Date.parse(inv.expiresAt) <= now) return null;
      const { hash: _h, ...shown } = inv;
      return shown;
    },
  );
}

/**
 * Revokes a pending invite by id, whatever its tenant (the user
 * administration page and API): a tenant's through `revokeInvite`, the
 * platform's (platform admins only) here. 404 when unknown, used or expired.
 */
export async function revokeInviteById(
  store: Store,
  p: Principal,
  id: string,
): Promise<InviteView> {
  const e = id.length <= 64 ? await store.kv.get<Invite>(k.invite(id)) : null;
  const inv = e?.value;
  if (!inv || Date.parse(inv.expiresAt) <= Date.now()) {
    throw new NotFoundError("Invite");
  }
  if (inv.tenantId) return await revokeInvite(store, p, inv.tenantId, id);
  if (!isPlatform(p)) throw new NotFoundError("Invite");
  const byEmail = await store.kv.get<string>(k.inviteByEmail(inv.email));
  const op = store.kv.atomic().check(e!).delete(k.invite(id));
  if (byEmail.value === id) op.check(byEmail).delete(byEmail.key);
  const { hash: _h, ...shown } = inv;
  addAudit(op, p, {
    action: "invite.revoke",
    target: { type: "invite", id, label: inv.email },
    tenantId: null,
    before: shown,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("This invite was used or changed meanwhile");
  }
  return shown;
}

/**
 * Resends an invite: a new link (valid 7 days again) for the same email,
 * role and tenant, which replaces the old one (see `createInvite`); the new
 * link is shown once.
 */
export async function reissueInvite(
  store: Store,
  p: Principal,
  id: string,
): Promise<{ token: string; invite: InviteView }> {
  const e = id.length <= 64 ? await store.kv.get<Invite>(k.invite(id)) : null;
  const inv = e?.value;
  if (!inv || Date.parse(inv.expiresAt) <= Date.now()) {
    throw new NotFoundError("Invite");
  }
  if (inv.tenantId) requireTenantWrite(p, inv.tenantId, "Invite");
  else if (!isPlatform(p)) throw new NotFoundError("Invite");
  const { token, invite } = await createInvite(store, p, {
    email: inv.email,
    role: inv.role,
    tenantId: inv.tenantId,
  });
  return { token, invite };
}

/**
 * Creates a one-time invite; returns the token to put in the link (shown
 * once). A pending invite for the same email is replaced: its link stops
 * working (`replaced` says so).
 */
export async function createInvite(
  store: Store,
  p: Principal,
  input: unknown,
): Promise<
  { token: string; invite: InviteView; replaced: InviteView | null }
> {
  const data = parse(inviteSchema, input);
  if (data.role === "platform_admin") {
    requirePlatform(p);
    data.tenantId = null;
  } else {
    if (!data.tenantId) {
      throw new ValidationError("Choose a tenant", "tenantId");
    }
    requireTenantWrite(p, data.tenantId);
    if (p.role !== "platform_admin" && p.role !== "tenant_admin") {
      throw new NotFoundError("Tenant");
    }
    if (!(await getTenantRaw(store, data.tenantId))) {
      throw new NotFoundError("Tenant");
    }
  }
  if (await getUserByEmail(store, data.email)) {
    throw new ConflictError(
      `A user with email ${data.email} already exists`,
      "email",
    );
  }
  const byEmail = await store.kv.get<string>(k.inviteByEmail(data.email));
  const previous = byEmail.value
    ? await store.kv.get<Invite>(k.invite(byEmail.value))
    : null;
  const old = previous?.value ?? null;
  if (old && old.tenantId !== data.tenantId && !isPlatform(p)) {
    // another tenant's (or the platform's) pending invite is not ours to replace
    throw new ConflictError(
      `${data.email} has a pending invite elsewhere`,
      "email",
    );
  }
  const id = newId();
  const secret = randomBase62(32);
  const invite: Invite = {
    id,
    hash: await hmac(store.secrets.pepper, secret),
    email: data.email,
    role: data.role,
    tenantId: data.tenantId,
    expiresAt: new Date(Date.now() + INVITE_TTL_MS).toISOString(),
    createdBy: p.id,
  };
  const { hash: _h, ...shown } = invite;
  const op = store.kv.atomic().check(byEmail)
    .set(k.invite(id), invite, { expireIn: INVITE_TTL_MS })
    .set(k.inviteByEmail(invite.email), id, { expireIn: INVITE_TTL_MS });
  if (invite.tenantId) {
    op.set(k.tenantInvite(invite.tenantId, id), id, {
      expireIn: INVITE_TTL_MS,
    });
  }
  let replaced: InviteView | null = null;
  if (old && previous) {
    op.check(previous).delete(k.invite(old.id));
    if (old.tenantId) op.delete(k.tenantInvite(old.tenantId, old.id));
    const { hash: _oh, ...oldShown } = old;
    if (Date.parse(old.expiresAt) > Date.now()) replaced = oldShown;
  }
  addAudit(op, p, {
    action: "user.invite",
    target: { type: "invite", id, label: data.email },
    tenantId: data.tenantId,
    ...(replaced ? { before: replaced } : {}),
    after: shown,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError(
      `An invite for ${data.email} was just made; try again`,
      "email",
    );
  }
  return { token: `${id}.${secret}`, invite: shown, replaced };
}

/** A tenant's pending (unused, unexpired) invites, oldest first. */
export async function listInvites(
  store: Store,
  p: Principal,
  tenantId: string,
): Promise<InviteView[]> {
  requireTenantRead(p, tenantId);
  const out: InviteView[] = [];
  const now = Date.now();
  for await (
    const e of store.kv.list<string>({
      prefix: k.tenantInvitePrefix(tenantId),
    }, { limit: 200 })
  ) {
    const inv = (await store.kv.get<Invite>(k.invite(e.value))).value;
    if (!inv || inv.tenantId !== tenantId) continue;
    if (Date.parse(inv.expiresAt) <= now) continue;
    const { hash: _h, ...shown } = inv;
    out.push(shown);
  }
  return out;
}

/** Revokes a tenant's pending invite: its link stops working. */
export async function revokeInvite(
  store: Store,
  p: Principal,
  tenantId: string,
  inviteId: string,
): Promise<InviteView> {
  requireTenantWrite(p, tenantId);
  if (p.role !== "platform_admin" && p.role !== "tenant_admin") {
    throw new NotFoundError("Invite");
  }
  const entry = await store.kv.get<Invite>(k.invite(inviteId.slice(0, 64)));
  const inv = entry.value;
  if (!inv || inv.tenantId !== tenantId) throw new NotFoundError("Invite");
  const byEmail = await store.kv.get<string>(k.inviteByEmail(inv.email));
  const op = store.kv.atomic().check(entry)
    .delete(k.invite(inv.id))
    .delete(k.tenantInvite(tenantId, inv.id));
  if (byEmail.value === inv.id) op.check(byEmail).delete(byEmail.key);
  const { hash: _h, ...shown } = inv;
  addAudit(op, p, {
    action: "invite.revoke",
    target: { type: "invite", id: inv.id, label: inv.email },
    tenantId,
    before: shown,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The invite changed meanwhile; try again");
  }
  return shown;
}

/** Looks up a valid invite by its token (null if unknown, used or expired). */
export async function findInvite(
  store: Store,
  token: string,
): Promise<Invite | null> {
  const [id, secret] = token.split(".");
  if (!id || !secret || id.length > 64 || secret.length > 64) return null;
  const inv = (await store.kv.get<Invite>(k.invite(id))).value;
  if (!inv || Date.parse(inv.expiresAt) <= Date.now()) return null;
  return safeEqual(inv.hash, await hmac(store.secrets.pepper, secret))
    ? inv
    : null;
}

/** Accepts an invite: creates the user and consumes the invite in one atomic op. */
export async function acceptInvite(
  store: Store,
  token: string,
  pw: string,
  ip: string | null,
): Promise<UserView> {
  const inv = await findInvite(store, token);
  if (!inv) throw new NotFoundError("Invite");
  const passwordHash = await hashPassword(parse(password, pw));
  const user: User = {
    id: newId(),
    email: inv.email,
    passwordHash,
    role: inv.role,
    tenantId: inv.tenantId,
    disabled: false,
    createdAt: new Date().toISOString(),
  };
  const inviteEntry = await store.kv.get(k.invite(inv.id));
  const byEmail = await store.kv.get<string>(k.inviteByEmail(inv.email));
  const op = store.kv.atomic().check(inviteEntry)
    .check({ key: k.userByEmail(user.email), versionstamp: null })
    .delete(k.invite(inv.id))
    .set(k.user(user.id), user)
    .set(k.userByEmail(user.email), user.id);
  if (inv.tenantId) op.delete(k.tenantInvite(inv.tenantId, inv.id));
  if (byEmail.value === inv.id) op.check(byEmail).delete(byEmail.key);
  if (user.tenantId) op.set(k.tenantUser(user.tenantId, user.id), user.id);
  addAudit(op, {
    kind: "user",
    id: user.id,
    label: user.email,
    role: user.role,
    tenantId: user.tenantId,
    ip,
  }, {
    action: "user.accept_invite",
    target: { type: "user", id: user.id, label: user.email },
    tenantId: user.tenantId,
    after: userView(user),
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("This invite was already used");
  }
  return userView(user);
}
