/**
 * Portal middleware: session from a signed cookie (checked against KV on
 * every request), CSRF protection for every mutation, and the page guard.
 */
import type { Context, MiddlewareHandler } from "hono";
import { deleteCookie, getCookie, setCookie } from "hono/cookie";
import { hmac, safeEqual } from "../lib/crypto.ts";
import { signHS256, verifyHS256 } from "../lib/jwt.ts";
import { ForbiddenError } from "../store/errors.ts";
import {
  checkSession,
  type Session,
  SESSION_TTL_MS,
  userPrincipal,
} from "../store/sessions.ts";
import type { Store } from "../store/store.ts";
import { clientIp, type PortalEnv } from "./_env.ts";

const ISS = "orchard-portal";
const SECURE_COOKIE = "__Host-orchard_session";
const PLAIN_COOKIE = "orchard_session";

/** Whether the browser reached this server over https (directly or via a trusted proxy). */
export function isHttps(c: Context): boolean {
  if (new URL(c.req.url).protocol === "https:") return true;
  return Deno.env.get("ORCHARD_TRUST_PROXY") === "1" &&
    c.req.header("x-forwarded-proto") === "https";
}

/** Sets the session cookie: `__Host-`, Secure on https; plain only on http (localhost). */
export async function setSessionCookie(
  c: Context,
  store: Store,
  session: Session,
): Promise<void> {
  const jwt = await signHS256(store.secrets.sessionKey, { sid: session.sid }, {
    iss: ISS,
    aud: ISS,
    sub: session.userId,
    ttlSeconds: SESSION_TTL_MS / 1000,
  });
  const https = isHttps(c);
  setCookie(c, https ? SECURE_COOKIE : PLAIN_COOKIE, jwt, {
    path: "/",
    httpOnly: true,
    secure: https,
    sameSite: "Lax",
    maxAge: SESSION_TTL_MS / 1000,
  });
}

/** Clears the session cookie. */
export function clearSessionCookie(c: Context): void {
  deleteCookie(c, SECURE_COOKIE, { path: "/", secure: true });
  deleteCookie(c, PLAIN_COOKIE, { path: "/" });
}

/** The CSRF token bound to a session. */
export function csrfToken(store: Store, sid: string): Promise<string> {
  return hmac(store.secrets.pepper, `csrf:${sid}`);
}

/** Loads the session (if any) into the context. */
export function sessionMiddleware(): MiddlewareHandler<PortalEnv> {
  return async function session(c, next) {
    const store = c.get("deps").store;
    c.set("principal", null);
    c.set("user", null);
    c.set("session", null);
    c.set("csrf", "");
    const jwt = getCookie(c, SECURE_COOKIE) ?? getCookie(c, PLAIN_COOKIE);
    if (jwt && jwt.length < 4096) {
      const claims = await verifyHS256(store.secrets.sessionKey, jwt, {
        iss: ISS,
        aud: ISS,
      });
      const sid = typeof claims?.sid === "string" ? claims.sid : null;
      const found = sid ? await checkSession(store, sid) : null;
      if (found && found.user.id === claims?.sub) {
        c.set("user", found.user);
        c.set("session", found.session);
        c.set("principal", userPrincipal(found.user, clientIp(c)));
        c.set("csrf", await csrfToken(store, found.session.sid));
      }
    }
    await next();
  };
}

/**
 * Rejects cross-site mutations (Sec-Fetch-Site / Origin) and, for
 * signed-in users, form posts without the session's CSRF token.
 */
export function csrfMiddleware(): MiddlewareHandler<PortalEnv> {
  return async function csrf(c, next) {
    const method = c.req.method;
    if (method === "GET" || method === "HEAD" || method === "OPTIONS") {
      return await next();
    }
    const site = c.req.header("sec-fetch-site");
    if (site && site !== "same-origin" && site !== "none") {
      throw new ForbiddenError("Cross-site request refused");
    }
    const origin = c.req.header("origin");
    if (origin && origin !== "null") {
      const host = c.req.header("x-forwarded-host") &&
          Deno.env.get("ORCHARD_TRUST_PROXY") === "1"
        ? c.req.header("x-forwarded-host")
        : new URL(c.req.url).host;
      let originHost = "";
      try {
        originHost = new URL(origin).host;
      } catch { /* invalid origin: refused below */ }
      if (!host || originHost !== host) {
        throw new ForbiddenError("Cross-origin request refused");
      }
    } else if (origin === "null" && site !== "same-origin") {
      // Browsers send "null" for privacy-sensitive contexts; only Sec-Fetch-Site can vouch then.
      throw new ForbiddenError("Cross-origin request refused");
    }
    const session = c.get("session");
    if (session) {
      const type = c.req.header("content-type") ?? "";
      let token = c.req.header("x-csrf-token") ?? "";
      if (!token && (type.includes("form"))) {
        const body = await c.req.parseBody();
        token = typeof body._csrf === "string" ? body._csrf : "";
      }
      if (!safeEqual(token, c.get("csrf"))) {
        throw new ForbiddenError(
          "This form has expired. Reload the page and try again.",
        );
      }
    }
    await next();
  };
}

/** Redirects to sign-in when no one is signed in. */
export function requireSignIn(): MiddlewareHandler<PortalEnv> {
  return async function signedIn(c, next) {
    if (!c.get("principal")) {
      const url = new URL(c.req.url);
      const nextPath = url.pathname + url.search;
      return c.redirect(`/login?next=${encodeURIComponent(nextPath)}`, 303);
    }
    await next();
  };
}
