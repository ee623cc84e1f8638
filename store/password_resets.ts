/**
 * Password resets issued by an admin: a one-time link (`/reset/<id>.<secret>`,
 * only a keyed hash stored, like invites) that the admin passes on. It
 * expires after a day, a newer one replaces it, and using it sets the new
 * password and ends all of the user's sessions.
 */
import { hmac, randomBase62, safeEqual } from "../lib/crypto.ts";
import { addAudit } from "./audit.ts";
import { ConflictError, NotFoundError, ValidationError } from "./errors.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { hashPassword } from "./passwords.ts";
import { isPlatform, type Principal, requireTenantWrite } from "./principal.ts";
import { parse, password } from "./schemas.ts";
import {
  passwordSignInAllowed,
  PasswordSignInOffError,
} from "./sign_in_policy.ts";
import type { Store } from "./store.ts";
import { endUserSessions, type User, userView } from "./users.ts";

/** A pending reset (the secret is stored only as a keyed hash). */
export interface PasswordReset {
  id: string;
  hash: string;
  userId: string;
  email: string;
  expiresAt: string;
  createdBy: string;
}

/** How long a reset link works. */
export const PASSWORD_RESET_TTL_MS = 24 * 3600_000;

/**
 * Issues a reset link for a user the principal may change (tenant admins:
 * their tenant's members; platform admins: everyone). Returns the token for
 * the link, shown once.
 */
export async function createPasswordReset(
  store: Store,
  p: Principal,
  userId: string,
): Promise<{ token: string; reset: Omit<PasswordReset, "hash"> }> {
  const u = userId.length <= 64
    ? (await store.kv.get<User>(k.user(userId))).value
    : null;
  if (!u) throw new NotFoundError("User");
  if (u.tenantId) requireTenantWrite(p, u.tenantId, "User");
  else if (!isPlatform(p)) throw new NotFoundError("User");
  if (u.disabled) {
    throw new ValidationError(
      "This user is disabled; enable them first",
      "userId",
    );
  }
  if (!(await passwordSignInAllowed(store, u.tenantId))) {
    throw new ValidationError(
      "This user's organisation signs in with single sign-on only: a password would not let them in",
      "userId",
    );
  }
  const previous = await store.kv.get<string>(k.userPasswordReset(userId));
  const id = newId();
  const secret = randomBase62(32);
  const reset: PasswordReset = {
    id,
    hash: await hmac(store.secrets.pepper, secret),
    userId,
    email: u.email,
    expiresAt: new Date(Date.now() + PASSWORD_RESET_TTL_MS).toISOString(),
    createdBy: p.id,
  };
  const { hash: _h, ...shown } = reset;
  const op = store.kv.atomic().check(previous)
    .set(k.passwordReset(id), reset, { expireIn: PASSWORD_RESET_TTL_MS })
    .set(k.userPasswordReset(userId), id, { expireIn: PASSWORD_RESET_TTL_MS });
  if (previous.value) op.delete(k.passwordReset(previous.value));
  addAudit(op, p, {
    action: "user.password_reset_link",
    target: { type: "user", id: userId, label: u.email },
    tenantId: u.tenantId,
    after: { resetId: id, expiresAt: reset.expiresAt },
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("Another reset was issued meanwhile; try again");
  }
  return { token: `${id}.${secret}`, reset: shown };
}

/** Looks up a usable reset by its token (null if unknown, used, expired or the user is gone). */
export async function findPasswordReset(
  store: Store,
  token: string,
): Promise<{ reset: PasswordReset; user: User } | null> {
  const [id, secret] = token.split(".");
  if (!id || !secret || id.length > 64 || secret.length > 64) return null;
  const reset = (await store.kv.get<PasswordReset>(k.passwordReset(id))).value;
  if (!reset || Date.parse(reset.expiresAt) <= Date.now()) return null;
  if (!safeEqual(reset.hash, await hmac(store.secrets.pepper, secret))) {
    return null;
  }
  const user = (await store.kv.get<User>(k.user(reset.userId))).value;
  if (!user || user.disabled) return null;
  return { reset, user };
}

/**
 * Sets the new password through a reset link, consumes the link, and ends
 * all of the user's sessions. Returns the updated user.
 */
export async function completePasswordReset(
  store: Store,
  token: string,
  newPassword: string,
  ip: string | null,
): Promise<User> {
  const found = await findPasswordReset(store, token);
  if (!found) throw new NotFoundError("Reset link");
  const passwordHash = await hashPassword(parse(password, newPassword));
  const [resetEntry, userEntry] = await store.kv.getMany<[PasswordReset, User]>(
    [k.passwordReset(found.reset.id), k.user(found.user.id)],
  );
  const u = userEntry.value;
  if (!resetEntry.value || !u || u.disabled) {
    throw new NotFoundError("Reset link");
  }
  if (!(await passwordSignInAllowed(store, u.tenantId))) {
    throw new PasswordSignInOffError();
  }
  const after: User = { ...u, passwordHash };
  const op = store.kv.atomic().check(resetEntry).check(userEntry)
    .delete(k.passwordReset(found.reset.id))
    .delete(k.userPasswordReset(u.id))
    .set(k.user(u.id), after);
  addAudit(op, {
    kind: "user",
    id: u.id,
    label: u.email,
    role: u.role,
    tenantId: u.tenantId,
    ip,
  }, {
    action: "user.password_reset",
    target: { type: "user", id: u.id, label: u.email },
    tenantId: u.tenantId,
    after: userView(after),
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("This reset link was already used");
  }
  await endUserSessions(store, u.id);
  return after;
}
