/**
 * Signing in with an OpenID Connect provider: `/sso/<id>/start` sends the
 * browser to the provider with a fresh state, nonce and PKCE verifier, and
 * `/sso/<id>/callback` (the redirect URI to register at the provider)
 * completes it.
 *
 * The attempt (state, nonce, verifier, where to go next) waits for the
 * callback in a cookie: a JWE (`dir` + A256GCM, jose) under a key derived
 * from the session key, bound to the provider, 10 minutes, HttpOnly,
 * SameSite=Lax (the provider's redirect back is a cross-site top-level
 * GET), Secure on https, scoped to `/sso/`. Starting writes nothing to KV;
 * the callback marks the attempt used in KV (atomically, by its state's
 * hash) before acting, so each attempt works once.
 */
import type { Context } from "hono";
import { Hono } from "hono";
import { deleteCookie, getCookie, setCookie } from "hono/cookie";
import { Alert } from "../components/ui.tsx";
import { deriveKey256, sha256 } from "../lib/crypto.ts";
import { decryptJWT, encryptJWT } from "../lib/jwt.ts";
import { log } from "../lib/log.ts";
import {
  beginSignIn,
  finishSignIn,
  type OidcAttempt,
  OidcError,
} from "../lib/oidc.ts";
import { k } from "../store/kv_keys.ts";
import { providerForSignIn } from "../store/sso_providers.ts";
import { SsoRefusedError, ssoSignIn } from "../store/sso_sign_in.ts";
import { clientIp, type PortalEnv } from "./_env.ts";
import { isHttps, setSessionCookie } from "./_middleware.ts";
import { barePage, safeNext } from "./_page.tsx";

type C = Context<PortalEnv>;

const ATTEMPT_TTL_SECONDS = 600;
const ISS = "orchard-portal";
const AUD = "orchard-sso-attempt";
const COOKIE_PATH = "/sso/";

const keys = new WeakMap<Uint8Array, Promise<Uint8Array>>();
function attemptKey(c: C): Promise<Uint8Array> {
  const raw = c.get("deps").store.secrets.sessionKey;
  let key = keys.get(raw);
  if (!key) {
    key = deriveKey256(raw, "orchard sso attempt cookie v1");
    keys.set(raw, key);
  }
  return key;
}

function cookieName(c: C): string {
  return isHttps(c) ? "__Secure-orchard_sso" : "orchard_sso";
}

/** The redirect URI of a provider (register it at the provider). */
export function redirectUri(publicUrl: string, providerId: string): string {
  return `${publicUrl}/sso/${encodeURIComponent(providerId)}/callback`;
}

function failure(
  c: C,
  title: string,
  message: string,
  status: 400 | 403 | 404 | 410 | 502,
) {
  return barePage(
    c,
    title,
    <>
      <h1>{title}</h1>
      <Alert tone="error">
        <span data-testid="sso-error">{message}</span>
      </Alert>
      <p>
        <a href="/login">Back to sign-in</a>
      </p>
    </>,
    status,
  );
}

/** `/sso/:providerId/start` and `/sso/:providerId/callback` (signed out). */
export const ssoRoutes = new Hono<PortalEnv>()
  .get("/sso/:providerId/start", async (c) => {
    const id = c.req.param("providerId");
    const next = safeNext(c.req.query("next"));
    const store = c.get("deps").store;
    const found = await providerForSignIn(store, id);
    if (!found) {
      return failure(
        c,
        "Sign-in option not found",
        "This sign-in option does not exist or was turned off.",
        404,
      );
    }
    let begun: { url: string; attempt: OidcAttempt };
    try {
      begun = await beginSignIn(
        found.client,
        redirectUri(c.get("deps").config.publicUrl, id),
      );
    } catch (err) {
      if (!(err instanceof OidcError)) throw err;
      log.warn("sso start failed", {
        provider: id,
        failure: err.failure,
        detail: err.detail,
      });
      return failure(
        c,
        `${found.provider.displayName} is unavailable`,
        `${err.message} Try again later, or sign in with a password.`,
        502,
      );
    }
    const jwe = await encryptJWT(await attemptKey(c), {
      a: begun.attempt,
      next,
    }, { iss: ISS, aud: AUD, sub: id, ttlSeconds: ATTEMPT_TTL_SECONDS });
    setCookie(c, cookieName(c), jwe, {
      path: COOKIE_PATH,
      httpOnly: true,
      secure: isHttps(c),
      sameSite: "Lax",
      maxAge: ATTEMPT_TTL_SECONDS,
    });
    c.header("cache-control", "no-store");
    return c.redirect(begun.url, 303);
  })
  .get("/sso/:providerId/callback", async (c) => {
    const id = c.req.param("providerId");
    const store = c.get("deps").store;
    const name = cookieName(c);
    const jwe = getCookie(c, name);
    deleteCookie(c, name, { path: COOKIE_PATH, secure: isHttps(c) });
    c.header("cache-control", "no-store");
    const claims = jwe && jwe.length < 4096
      ? await decryptJWT(await attemptKey(c), jwe, {
        iss: ISS,
        aud: AUD,
        sub: id,
      })
      : null;
    const attempt = claims?.a as OidcAttempt | undefined;
    if (!claims || typeof attempt?.state !== "string") {
      return failure(
        c,
        "Sign-in expired",
        "This sign-in attempt expired or was started in another browser. Start again from the sign-in page.",
        400,
      );
    }
    // each attempt works once, whatever comes back with it
    const used = await store.kv.atomic()
      .check({
        key: k.ssoAttemptUsed(await sha256(attempt.state)),
        versionstamp: null,
      })
      .set(k.ssoAttemptUsed(await sha256(attempt.state)), true, {
        expireIn: 2 * ATTEMPT_TTL_SECONDS * 1000,
      })
      .commit();
    if (!used.ok) {
      return failure(
        c,
        "Sign-in already used",
        "This sign-in answer was already used. Start again from the sign-in page.",
        400,
      );
    }
    const found = await providerForSignIn(store, id);
    if (!found) {
      return failure(
        c,
        "Sign-in option not found",
        "This sign-in option does not exist or was turned off.",
        404,
      );
    }
    const provider = found.provider;
    try {
      const idClaims = await finishSignIn(
        found.client,
        redirectUri(c.get("deps").config.publicUrl, id),
        new URL(c.req.url),
        attempt,
      );
      const { session, user, provisioned } = await ssoSignIn(
        store,
        provider,
        idClaims,
        clientIp(c),
      );
      log.info("sso sign-in", {
        provider: id,
        userId: user.id,
        provisioned,
      });
      await setSessionCookie(c, store, session);
      return c.redirect(safeNext(String(claims.next ?? "/")), 303);
    } catch (err) {
      if (err instanceof SsoRefusedError) {
        log.info("sso sign-in refused", { provider: id, reason: err.reason });
        return failure(c, "No access to Orchard", err.message, 403);
      }
      if (!(err instanceof OidcError)) throw err;
      log.warn("sso sign-in failed", {
        provider: id,
        failure: err.failure,
        detail: err.detail,
      });
      return failure(
        c,
        `Sign-in with ${provider.displayName} failed`,
        `${err.message} Start again from the sign-in page.`,
        err.failure === "unreachable" ? 502 : 400,
      );
    }
  });
