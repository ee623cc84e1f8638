/**
 * One-time form tokens against double submission. Every portal form carries
 * a random `_once` token; its first post claims it atomically here (keyed by
 * the session and the token) and, once done, records only where it
 * redirected. A second post with the same token does not act again: it
 * finds the claim and goes where the first went. Nothing else (no message,
 * no secret) is stored, and claims expire on their own.
 */
import { k } from "./kv_keys.ts";
import type { Store } from "./store.ts";

/** A claimed token: in progress, or done with where it redirected. */
export interface OnceClaim {
  state: "pending" | "done";
  location: string | null;
  at: number;
}

/** How long a claim is kept (a form older than this may act again). */
export const ONCE_TTL_MS = 15 * 60_000;

/** What a valid token looks like (random base62 / base64url). */
export const ONCE_RE = /^[0-9A-Za-z_-]{16,64}$/;

/**
 * Claims `token` for this post: true when it is ours, else the claim found
 * (null when it was released meanwhile: try again).
 */
export async function claimOnce(
  store: Store,
  scope: string,
  token: string,
): Promise<true | OnceClaim | null> {
  const key = k.formOnce(scope, token);
  const claim: OnceClaim = { state: "pending", location: null, at: Date.now() };
  const res = await store.kv.atomic()
    .check({ key, versionstamp: null })
    .set(key, claim, { expireIn: ONCE_TTL_MS })
    .commit();
  if (res.ok) return true;
  return (await store.kv.get<OnceClaim>(key)).value;
}

/** Records that the post done under `token` redirected to `location`. */
export async function finishOnce(
  store: Store,
  scope: string,
  token: string,
  location: string,
): Promise<void> {
  const claim: OnceClaim = { state: "done", location, at: Date.now() };
  await store.kv.set(k.formOnce(scope, token), claim, {
    expireIn: ONCE_TTL_MS,
  });
}

/** Releases a claim whose post changed nothing (an error): it may be sent again. */
export async function releaseOnce(
  store: Store,
  scope: string,
  token: string,
): Promise<void> {
  await store.kv.delete(k.formOnce(scope, token));
}
