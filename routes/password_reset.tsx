/**
 * `/reset/:token`: a user sets a new password through the one-time link an
 * admin issued (store/password_resets.ts); all their sessions end, and
 * they are signed in afresh.
 */
import { Hono } from "hono";
import { Alert, Field, PostForm } from "../components/ui.tsx";
import { ServiceError } from "../store/errors.ts";
import {
  completePasswordReset,
  findPasswordReset,
} from "../store/password_resets.ts";
import { startSession } from "../store/sessions.ts";
import { clientIp, type PortalEnv } from "./_env.ts";
import { setSessionCookie } from "./_middleware.ts";
import { barePage, str } from "./_page.tsx";

const INVALID = "This reset link is invalid, expired or was already used.";

function ResetForm(
  props: { token: string; email: string; csrf: string; error?: string },
) {
  return (
    <>
      <h1>Choose a new password</h1>
      <p class="sub">
        For <b>{props.email}</b>. Saving it signs you out everywhere else.
      </p>
      {props.error && <Alert tone="error">{props.error}</Alert>}
      <PostForm action={`/reset/${props.token}`} csrf={props.csrf}>
        <input
          type="email"
          name="username"
          value={props.email}
          autocomplete="username"
          hidden
          readOnly
        />
        <Field
          label="New password"
          name="password"
          type="password"
          hint="at least 12 characters"
          required
          autocomplete="new-password"
        />
        <button class="primary" type="submit">Set password</button>
      </PostForm>
    </>
  );
}

/** Public routes of the password reset link. */
export const passwordResetRoutes = new Hono<PortalEnv>()
  .get("/reset/:token", async (c) => {
    const found = await findPasswordReset(
      c.get("deps").store,
      c.req.param("token"),
    );
    if (!found) {
      return barePage(
        c,
        "Reset password",
        <Alert tone="error">{INVALID}</Alert>,
        410, // gone, as a used invite or setup link
      );
    }
    return barePage(
      c,
      "Reset password",
      <ResetForm
        token={c.req.param("token")}
        email={found.user.email}
        csrf={c.get("csrf")}
      />,
    );
  })
  .post("/reset/:token", async (c) => {
    const token = c.req.param("token");
    const store = c.get("deps").store;
    const body = await c.req.parseBody();
    const found = await findPasswordReset(store, token);
    if (!found) {
      return barePage(
        c,
        "Reset password",
        <Alert tone="error">{INVALID}</Alert>,
        404,
      );
    }
    try {
      const user = await completePasswordReset(
        store,
        token,
        str(body.password),
        clientIp(c),
      );
      // Proven by the link (a sign-in here could be throttled by the
      // failed attempts that made the reset necessary).
      const session = await startSession(store, user, clientIp(c));
      await setSessionCookie(c, store, session);
      return c.redirect("/", 303);
    } catch (err) {
      if (!(err instanceof ServiceError)) throw err;
      if (err.status === 404 || err.status === 409) {
        return barePage(
          c,
          "Reset password",
          <Alert tone="error">{INVALID}</Alert>,
          404,
        );
      }
      return barePage(
        c,
        "Reset password",
        <ResetForm
          token={token}
          email={found.user.email}
          csrf={c.get("csrf")}
          error={err.message}
        />,
        400,
      );
    }
  });
