/**
 * What a form post has to show exactly once (a new secret, a link, a
 * confirmation) carried across POST → redirect → GET: encrypted to the
 * session (AES-GCM, key derived from the pepper and the session id) in a
 * short-lived HttpOnly cookie scoped to the page, which the GET clears. A
 * reload, or a copy of the page's URL, shows nothing again, and nothing
 * of it is stored on the server.
 */
import type { Context } from "hono";
import { deleteCookie, getCookie, setCookie } from "hono/cookie";
import { fromBase64Url, hmac, toBase64Url } from "../lib/crypto.ts";
import type { PortalEnv } from "./_env.ts";

const COOKIE = "orchard_once";
const MAX_AGE_S = 120;

async function key(c: Context<PortalEnv>, sid: string): Promise<CryptoKey> {
  const raw = fromBase64Url(
    await hmac(c.get("deps").store.secrets.pepper, `once:${sid}`),
  );
  return crypto.subtle.importKey(
    "raw",
    raw as BufferSource,
    { name: "AES-GCM" },
    false,
    ["encrypt", "decrypt"],
  );
}

function https(c: Context): boolean {
  if (new URL(c.req.url).protocol === "https:") return true;
  return Deno.env.get("ORCHARD_TRUST_PROXY") === "1" &&
    c.req.header("x-forwarded-proto") === "https";
}

/** Sets what the next GET of `path` shows once (the caller then redirects there). */
export async function setOnce(
  c: Context<PortalEnv>,
  path: string,
  value: unknown,
): Promise<void> {
  const session = c.get("session");
  if (!session) return;
  const iv = crypto.getRandomValues(new Uint8Array(12));
  const ct = new Uint8Array(
    await crypto.subtle.encrypt(
      { name: "AES-GCM", iv },
      await key(c, session.sid),
      new TextEncoder().encode(JSON.stringify(value)),
    ),
  );
  const blob = new Uint8Array(iv.length + ct.length);
  blob.set(iv);
  blob.set(ct, iv.length);
  setCookie(c, COOKIE, toBase64Url(blob), {
    path,
    httpOnly: true,
    secure: https(c),
    sameSite: "Strict",
    maxAge: MAX_AGE_S,
  });
}

/** Takes (and clears) what this page has to show once; null if nothing. */
export async function takeOnce<T>(
  c: Context<PortalEnv>,
  path: string,
): Promise<T | null> {
  const raw = getCookie(c, COOKIE);
  const session = c.get("session");
  if (!raw) return null;
  deleteCookie(c, COOKIE, { path, secure: https(c) });
  if (!session || raw.length > 8192) return null;
  try {
    const blob = fromBase64Url(raw);
    const plain = await crypto.subtle.decrypt(
      { name: "AES-GCM", iv: blob.slice(0, 12) as BufferSource },
      await key(c, session.sid),
      blob.slice(12) as BufferSource,
    );
    return JSON.parse(new TextDecoder().decode(plain)) as T;
  } catch {
    return null;
  }
}
