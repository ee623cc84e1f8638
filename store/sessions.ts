/**
 * Portal sign-in: password check with throttling, KV session records (so
 * logout and disabling a user take effect at once), and the first-run setup.
 */
import { hmac, randomBase62, safeEqual } from "../lib/crypto.ts";

import { TooManyRequestsError, UnauthorizedError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import { verifyPassword } from "./passwords.ts";
import type { Principal } from "./principal.ts";
import {
  passwordSignInAllowed,
  PasswordSignInOffError,
} from "./sign_in_policy.ts";

export { PasswordSignInOffError };
import type { Store } from "./store.ts";
import { createUser, getUserByEmail, getUserRaw, type User } from "./users.ts";

/** A signed-in session. */
export interface Session {
  sid: string;
  userId: string;
  createdAt: string;
  expiresAt: string;
  ip: string | null;
  /** How the user proved who they are (sessions from before this field: a password). */
  via?: "password" | "sso";
}

/** Session lifetime. */
export const SESSION_TTL_MS = 12 * 3600_000;
/** Failed attempts allowed per window before throttling. */
export const LOGIN_MAX_FAILURES = { account: 5, ip: 20 } as const;
const WINDOW_MS = 15 * 60_000;

function windowId(now: number): string {
  return String(Math.floor(now / WINDOW_MS));
}

async function failures(
  store: Store,
  scope: "ip" | "account",
  subject: string,
  now: number,
): Promise<number> {
  const e = await store.kv.get<Deno.KvU64>(
    k.loginFailures(scope, subject, windowId(now)),
  );
  return e.value ? Number(e.value.value) : 0;
}

/**
 * Checks email and password, throttled per account and per IP (15-minute
 * windows, no permanent lockout), and opens a session; refused (403) for a
 * tenant whose password sign-in is off.
 */
export async function login(
  store: Store,
  email: string,
  password: string,
  ip: string | null,
  now = Date.now(),
): Promise<{ session: Session; user: User }> {
  const account = email.trim().toLowerCase().slice(0, 254);
  const ipKey = (ip ?? "unknown").slice(0, 64);
  const [acc, byIp] = await Promise.all([
    failures(store, "account", account, now),
    failures(store, "ip", ipKey, now),
  ]);
  if (acc >= LOGIN_MAX_FAILURES.account || byIp >= LOGIN_MAX_FAILURES.ip) {
    const retryAfter = Math.ceil((WINDOW_MS - (now % WINDOW_MS)) / 1000);
    throw new TooManyRequestsError(
      `Too many failed sign-ins. Try again in ${
        Math.ceil(retryAfter / 60)
      } minutes.`,
      retryAfter,
    );
  }
  const user = await getUserByEmail(store, account);
  const ok = await verifyPassword(
    password.slice(0, 256),
    user?.passwordHash ?? null,
  );
  if (!ok || !user || user.disabled) {
    const w = windowId(now);
    await store.kv.atomic()
      .sum(k.loginFailures("account", account, w), 1n)
      .sum(k.loginFailures("ip", ipKey, w), 1n)
      .commit();
    // Expiry is only garbage collection: the window is part of the key.
    await Promise.all([
      touchExpiry(store, k.loginFailures("account", account, w)),
      touchExpiry(store, k.loginFailures("ip", ipKey, w)),
    ]);
    throw new UnauthorizedError("Wrong email or password");
  }
  // Said only after the password checked out, so it reveals nothing to
  // someone guessing which accounts exist.
  if (!(await passwordSignInAllowed(store, user.tenantId))) {
    throw new PasswordSignInOffError();
  }
  return { session: await startSession(store, user, ip, now), user };
}

/**
 * Opens a session for a user whose identity was proven another way (a
 * password just checked, or just set through a one-time link).
 */
export async function startSession(
  store: Store,
  user: User,
  ip: string | null,
  now = Date.now(),
  via: "password" | "sso" = "password",
): Promise<Session> {
  const session: Session = {
    sid: randomBase62(32),
    userId: user.id,
    createdAt: new Date(now).toISOString(),
    expiresAt: new Date(now + SESSION_TTL_MS).toISOString(),
    ip,
    via,
  };
  await store.kv.atomic()
    .set(k.session(session.sid), session, { expireIn: SESSION_TTL_MS })
    .set(k.userSession(user.id, session.sid), session.sid, {
      expireIn: SESSION_TTL_MS,
    })
    .set(k.userLastSignIn(user.id), session.createdAt)
    .commit();
  return session;
}

async function touchExpiry(store: Store, key: Deno.KvKey): Promise<void> {
  const e = await store.kv.get(key);
  if (e.value !== null) {
    await store.kv.atomic().check(e).set(key, e.value, {
      expireIn: WINDOW_MS * 2,
    }).commit();
  }
}

/** Resolves a session id to its user; null if logged out, expired or disabled. */
export async function checkSession(
  store: Store,
  sid: string,
): Promise<{ session: Session; user: User } | null> {
  if (!sid || sid.length > 64) return null;
  const session = (await store.kv.get<Session>(k.session(sid))).value;
  if (!session || Date.parse(session.expiresAt) <= Date.now()) return null;
  const user = await getUserRaw(store, session.userId);
  if (!user || user.disabled) return null;
  // Turning a tenant's password sign-in off ends its password sessions at
  // once, not when they run out.
  if (
    session.via !== "sso" && user.tenantId &&
    !(await passwordSignInAllowed(store, user.tenantId))
  ) {
    return null;
  }
  return { session, user };
}

/** Ends a session at once. */
export async function logout(store: Store, session: Session): Promise<void> {
  await store.kv.atomic().delete(k.session(session.sid))
    .delete(k.userSession(session.userId, session.sid)).commit();
}

/** The principal of a signed-in user. */
export function userPrincipal(user: User, ip: string | null): Principal {
  return {
    kind: "user",
    id: user.id,
    label: user.email,
    role: user.role,
    tenantId: user.tenantId,
    ip,
  };
}

/** Whether any platform admin exists yet. */
async function hasUsers(store: Store): Promise<boolean> {
  for await (
    const _ of store.kv.list({ prefix: k.userPrefix() }, { limit: 1 })
  ) {
    return true;
  }
  return false;
}

/**
 * First run: creates the first platform admin from the given credentials,
 * or (without them) a one-time setup token to print as a link. Returns what
 * happened; does nothing once any user exists.
 */
export async function bootstrapAdmin(
  store: Store,
  creds: { email?: string; password?: string },
): Promise<{ created?: string; setupToken?: string } | null> {
  if (await hasUsers(store)) return null;
  const system: Principal = {
    kind: "system",
    id: "system",
    label: "first run",
    role: "platform_admin",
    tenantId: null,
    ip: null,
  };
  if (creds.email && creds.password) {
    const u = await createUser(store, system, {
      email: creds.email,
      password: creds.password,
      role: "platform_admin",
      tenantId: null,
    });
    return { created: u.email };
  }
  const token = randomBase62(32);
  await store.kv.set(k.setupToken(), {
    hash: await hmac(store.secrets.pepper, token),
  }, { expireIn: 24 * 3600_000 });
  return { setupToken: token };
}

/** Completes first-run setup with the printed token; creates the first admin. */
export async function completeSetup(
  store: Store,
  token: string,
  email: string,
  password: string,
  ip: string | null,
): Promise<User> {
  const entry = await store.kv.get<{ hash: string }>(k.setupToken());
  if (
    !entry.value || token.length > 64 ||
    !safeEqual(entry.value.hash, await hmac(store.secrets.pepper, token))
  ) {
    throw new UnauthorizedError(
      "This setup link is invalid or was already used",
    );
  }
  if (await hasUsers(store)) {
    await store.kv.delete(k.setupToken());
    throw new UnauthorizedError("Setup is already complete");
  }
  const system: Principal = {
    kind: "system",
    id: "system",
    label: "first-run setup",
    role: "platform_admin",
    tenantId: null,
    ip,
  };
  const view = await createUser(store, system, {
    email,
    password,
    role: "platform_admin",
    tenantId: null,
  });
  await store.kv.delete(k.setupToken());
  return (await getUserRaw(store, view.id))!;
}

/** Whether `token` is the pending setup link's (unused, unexpired, no user yet). */
export async function setupTokenValid(
  store: Store,
  token: string,
): Promise<boolean> {
  if (!token || token.length > 64 || await hasUsers(store)) return false;
  const entry = await store.kv.get<{ hash: string }>(k.setupToken());
  return entry.value !== null &&
    safeEqual(entry.value.hash, await hmac(store.secrets.pepper, token));
}

/** Whether first-run setup is pending (a setup token exists and no user does). */
export async function setupPending(store: Store): Promise<boolean> {
  return !(await hasUsers(store)) &&
    (await store.kv.get(k.setupToken())).value !== null;
}
