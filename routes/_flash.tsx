/**
 * One-time flash messages for POST/redirect/GET: a form post that changed
 * something answers 303 to its page and leaves what to show there (a
 * message, and at most once a new secret such as an API key) in a
 * short-lived cookie. The cookie is a JWE (`dir` + A256GCM, via jose) under
 * a key derived with HKDF from the server's session key, bound to the
 * session and to the page's path, HttpOnly, SameSite=Strict, Secure on
 * https and scoped to that path. Nothing of it is stored in KV or on disk.
 * The GET that shows it clears it, so a reload shows it no more.
 */
import type { Context } from "hono";
import { deleteCookie, getCookie, setCookie } from "hono/cookie";
import { Alert } from "../components/ui.tsx";
import { decryptJWT, encryptJWT } from "../lib/jwt.ts";
import type { PortalEnv } from "./_env.ts";
import { isHttps } from "./_middleware.ts";

/** What a page shows once after a successful form post. */
export interface Flash {
  /** The page section (its `#id`) the messages belong in; none: the top. */
  section?: string;
  ok?: string;
  warn?: string;
  /** A new API key: its secret, shown once. */
  newKey?: { key: string; name: string };
  /** A new invite link (one-time), shown once. */
  inviteLink?: string;
  /** A node's join command (holds a join token), shown once, and its expiry. */
  command?: string;
  expires?: string;
  /**
   * Set when this post repeated one already done (a double click): it did
   * nothing, and the first post's answer may never have been shown.
   */
  again?: boolean;
  /** A page's own once-shown value (see `setOnce`). */
  data?: unknown;
}

/** How long a flash waits for its page. */
export const FLASH_TTL_SECONDS = 300;
const ISS = "orchard-portal";
const AUD = "orchard-flash";
const NAME = "orchard_flash";
const AGAIN = "orchard_flash_again";
const MAX_COOKIE = 3800;

const keys = new WeakMap<Uint8Array, Promise<Uint8Array>>();

/** The flash key: HKDF-SHA-256 of the session key (its own purpose, 256 bits). */
export function flashKey(sessionKey: Uint8Array): Promise<Uint8Array> {
  let key = keys.get(sessionKey);
  if (!key) {
    key = (async () => {
      const base = await crypto.subtle.importKey(
        "raw",
        sessionKey as BufferSource,
        "HKDF",
        false,
        ["deriveBits"],
      );
      const bits = await crypto.subtle.deriveBits(
        {
          name: "HKDF",
          hash: "SHA-256",
          salt: new TextEncoder().encode("orchard-portal"),
          info: new TextEncoder().encode("orchard flash cookie v1"),
        },
        base,
        256,
      );
      return new Uint8Array(bits);
    })();
    keys.set(sessionKey, key);
  }
  return key;
}

function cookieName(c: Context, base: string): string {
  return isHttps(c) ? `__Secure-${base}` : base;
}

/** The path part of a local location (`/tenants/x#keys` → `/tenants/x`). */
export function pathOf(location: string): string {
  const path = location.split(/[?#]/)[0] || "/";
  return path.startsWith("/") && !path.startsWith("//") ? path : "/";
}

/** The session (or, signed out, nothing) a flash is bound to. */
function subjectOf(c: Context<PortalEnv>): string {
  return c.get("session")?.sid ?? "anonymous";
}

async function put(
  c: Context<PortalEnv>,
  base: string,
  path: string,
  data: Flash,
): Promise<void> {
  const key = await flashKey(c.get("deps").store.secrets.sessionKey);
  const jwe = await encryptJWT(key, { f: data, p: path }, {
    iss: ISS,
    aud: AUD,
    sub: subjectOf(c),
    ttlSeconds: FLASH_TTL_SECONDS,
  });
  if (jwe.length > MAX_COOKIE) {
    throw new Error(`Cannot set flash cookie: ${jwe.length} bytes is too long`);
  }
  const https = isHttps(c);
  setCookie(c, cookieName(c, base), jwe, {
    path,
    httpOnly: true,
    secure: https,
    sameSite: "Strict",
    maxAge: FLASH_TTL_SECONDS,
  });
}

/**
 * Answers a successful form post: 303 to `location` (a local path, with its
 * `#section`), leaving `flash` for that page to show once.
 */
export async function redirectWithFlash(
  c: Context<PortalEnv>,
  location: string,
  flash: Flash,
): Promise<Response> {
  await put(c, NAME, pathOf(location), flash);
  c.header("cache-control", "no-store");
  return c.redirect(location, 303);
}

/**
 * Leaves a page's own value for its next GET at `path` (a new admin token,
 * a reset link): the same encrypted one-time cookie as a flash; the caller
 * redirects there. `takeOnce` reads it back.
 */
export async function setOnce(
  c: Context<PortalEnv>,
  path: string,
  value: unknown,
): Promise<void> {
  await put(c, NAME, path, { data: value });
  c.header("cache-control", "no-store");
}

/** Takes (and clears) the value `setOnce` left for this page; null if none. */
export async function takeOnce<T>(c: Context<PortalEnv>): Promise<T | null> {
  const f = await takeFlash(c);
  return (f.data as T | undefined) ?? null;
}

/** Answers a repeated post (already done): 303 to where the first went, saying so. */
export async function redirectAgain(
  c: Context<PortalEnv>,
  location: string,
): Promise<Response> {
  const section = location.split("#")[1];
  await put(c, AGAIN, pathOf(location), {
    again: true,
    ...(section ? { section } : {}),
  });
  c.header("cache-control", "no-store");
  return c.redirect(location, 303);
}

async function read(
  c: Context<PortalEnv>,
  base: string,
): Promise<Flash | null> {
  const name = cookieName(c, base);
  const jwe = getCookie(c, name);
  if (!jwe) return null;
  const path = c.req.path;
  deleteCookie(c, name, { path, secure: isHttps(c) });
  if (jwe.length > 4096) return null;
  const key = await flashKey(c.get("deps").store.secrets.sessionKey);
  const claims = await decryptJWT(key, jwe, {
    iss: ISS,
    aud: AUD,
    sub: subjectOf(c),
  });
  if (!claims || claims.p !== path) return null;
  const f = claims.f;
  return f && typeof f === "object" ? f as Flash : null;
}

/**
 * The flash left for this page, if any, and clears it (a reload shows
 * nothing). `again` is set when a repeated post pointed here.
 */
export async function takeFlash(c: Context<PortalEnv>): Promise<Flash> {
  const [first, again] = await Promise.all([read(c, NAME), read(c, AGAIN)]);
  const { again: _ignored, ...flash } = first ?? {};
  if (!again) return flash;
  return { section: again.section, ...flash, again: true };
}

/** What a page says when a repeated post did nothing. */
export const AGAIN_MESSAGE =
  "Already done by your first click, so it was not done again.";

/** Added when the first click's answer (with any secret) was not shown. */
export const AGAIN_SECRET_HINT =
  "If that click made something shown only once (a new key, invite link or join command) and you did not see it, revoke it and make a new one.";

/**
 * The flash's messages (what was done, warnings, a repeated click) when
 * they belong in `section` (none: the top of the page).
 */
export function FlashMessages(props: { flash: Flash; section?: string }) {
  const f = props.flash;
  if ((f.section ?? "") !== (props.section ?? "")) return null;
  const first = Boolean(f.ok || f.newKey || f.inviteLink || f.command);
  return (
    <>
      {f.ok && <Alert tone="ok">{f.ok}</Alert>}
      {f.warn && <Alert tone="warn">{f.warn}</Alert>}
      {f.again && (
        <Alert tone={first ? "ok" : "warn"}>
          <span data-testid="again">
            {AGAIN_MESSAGE}
            {first ? "" : ` ${AGAIN_SECRET_HINT}`}
          </span>
        </Alert>
      )}
    </>
  );
}
