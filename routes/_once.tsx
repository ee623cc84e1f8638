/**
 * Double-submission guard for every portal form (see store/form_once.ts):
 * the first post with a form's `_once` token acts; a repeat (a double
 * click, a resent form) waits briefly for the first to finish and then
 * redirects where it went, with a note that it was already done, instead of
 * acting twice. A post that fails (renders an error, changes nothing)
 * releases its token so the form can be sent again. Posts without a token
 * (API-like clients) and signed-out posts (sign-in, setup, invites: no
 * session to key a claim by, and a repeat of them fails harmlessly) are not
 * guarded, so no one signed out can make the server write claims.
 */
import type { MiddlewareHandler } from "hono";
import { Alert } from "../components/ui.tsx";
import {
  claimOnce,
  finishOnce,
  ONCE_RE,
  releaseOnce,
} from "../store/form_once.ts";
import type { PortalEnv } from "./_env.ts";
import { redirectAgain } from "./_flash.tsx";
import { barePage, safeNext, str } from "./_page.tsx";

/** How long a repeat waits for the first post to finish. */
const WAIT_MS = 10_000;
const POLL_MS = 50;

/** The guard, mounted after the session and CSRF middleware. */
export function onceMiddleware(
  opts: { waitMs?: number } = {},
): MiddlewareHandler<PortalEnv> {
  const waitMs = opts.waitMs ?? WAIT_MS;
  return async function once(c, next) {
    const session = c.get("session");
    if (c.req.method !== "POST" || !session) return await next();
    const type = c.req.header("content-type") ?? "";
    if (!type.includes("form")) return await next();
    const token = str((await c.req.parseBody())._once);
    if (!ONCE_RE.test(token)) return await next();
    const store = c.get("deps").store;
    const scope = session.sid;
    const deadline = Date.now() + waitMs;
    for (;;) {
      const claim = await claimOnce(store, scope, token);
      if (claim === true) break;
      if (claim?.state === "done" && claim.location) {
        return await redirectAgain(c, claim.location);
      }
      if (Date.now() >= deadline) {
        const back = c.req.header("referer");
        let href = "/";
        try {
          const u = new URL(back ?? "/", c.req.url);
          if (u.origin === new URL(c.req.url).origin) {
            href = safeNext(u.pathname + u.search);
          }
        } catch { /* keep "/" */ }
        return barePage(
          c,
          "Still working",
          <>
            <Alert tone="warn">
              Your first click is still being handled, so this one did nothing.
            </Alert>
            <p>
              <a href={href}>Back to the page</a> to see the result.
            </p>
          </>,
          409,
        );
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
    try {
      await next();
    } catch (err) {
      await releaseOnce(store, scope, token);
      throw err;
    }
    const location = c.res.headers.get("location");
    if (c.res.status >= 300 && c.res.status < 400 && location) {
      await finishOnce(store, scope, token, location);
    } else {
      await releaseOnce(store, scope, token);
    }
  };
}
