/** Sign-in, sign-out, first-run setup and invite acceptance. */
import { Hono } from "hono";
import { Alert, Field, PostForm } from "../components/ui.tsx";
import {
  ServiceError,
  TooManyRequestsError,
  ValidationError,
} from "../store/errors.ts";
import {
  completeSetup,
  login,
  logout,
  PasswordSignInOffError,
  setupPending,
  setupTokenValid,
} from "../store/sessions.ts";
import { signInProviders } from "../store/sso_providers.ts";
import { acceptInvite, findInvite } from "../store/users.ts";
import { clientIp, type PortalEnv } from "./_env.ts";
import { clearSessionCookie, setSessionCookie } from "./_middleware.ts";
import { portalMessage } from "./_messages.ts";
import { barePage, safeNext, str } from "./_page.tsx";

/** A sign-in option through an identity provider (routes/sso.tsx). */
interface SsoButton {
  id: string;
  displayName: string;
}

function LoginForm(
  props: {
    next: string;
    email?: string;
    error?: string;
    setup: boolean;
    sso: SsoButton[];
  },
) {
  return (
    <>
      <h1>Sign in to Orchard</h1>
      <p class="sub">Private AI cluster administration</p>
      {props.setup && (
        <Alert tone="warn">
          No admin exists yet. Open the one-time setup link printed in the
          server log.
        </Alert>
      )}
      {props.error && <Alert tone="error">{props.error}</Alert>}
      <PostForm
        action={`/login?next=${encodeURIComponent(props.next)}`}
        csrf=""
      >
        <Field
          label="Email"
          name="email"
          type="email"
          value={props.email}
          required
          autocomplete="username"
        />
        <Field
          label="Password"
          name="password"
          type="password"
          required
          autocomplete="current-password"
        />
        <button class="primary" type="submit">Sign in</button>
      </PostForm>
      {props.sso.length > 0 && (
        <div class="sso-options" data-testid="sso-options">
          <p class="muted">or</p>
          {props.sso.map((p) => (
            <p key={p.id}>
              <a
                class="btn"
                href={`/sso/${encodeURIComponent(p.id)}/start?next=${
                  encodeURIComponent(props.next)
                }`}
              >
                Sign in with {p.displayName}
              </a>
            </p>
          ))}
        </div>
      )}
    </>
  );
}

/** Routes for signing in and out. */
export const authRoutes = new Hono<PortalEnv>()
  .get("/login", async (c) => {
    const next = safeNext(c.req.query("next"));
    if (c.get("principal")) return c.redirect(next, 303);
    const store = c.get("deps").store;
    const [setup, sso] = await Promise.all([
      setupPending(store),
      signInProviders(store),
    ]);
    return barePage(
      c,
      "Sign in",
      <LoginForm next={next} setup={setup} sso={sso} />,
    );
  })
  .post("/login", async (c) => {
    const body = await c.req.parseBody();
    const next = safeNext(c.req.query("next"));
    const email = str(body.email).slice(0, 254);
    const store = c.get("deps").store;
    try {
      const { session } = await login(
        store,
        email,
        str(body.password),
        clientIp(c),
      );
      await setSessionCookie(c, store, session);
      return c.redirect(next, 303);
    } catch (err) {
      if (!(err instanceof ServiceError)) throw err;
      const status = err instanceof TooManyRequestsError
        ? 429
        : err instanceof PasswordSignInOffError
        ? 403
        : 401;
      if (err instanceof TooManyRequestsError) {
        c.header("retry-after", String(err.retryAfter));
      }
      return barePage(
        c,
        "Sign in",
        <LoginForm
          next={next}
          email={email}
          error={err.message}
          setup={false}
          sso={await signInProviders(store)}
        />,
        status,
      );
    }
  })
  .post("/logout", async (c) => {
    const session = c.get("session");
    if (session) await logout(c.get("deps").store, session);
    clearSessionCookie(c);
    return c.redirect("/login", 303);
  })
  // a plain GET of the sign-out address asks (signing out on a GET would
  // let any page sign people out)
  .get("/logout", (c) => {
    const p = c.get("principal");
    if (!p) return c.redirect("/login", 303);
    return barePage(
      c,
      "Sign out",
      <>
        <h1>Sign out of Orchard?</h1>
        <p class="sub">Signed in as {p.label}.</p>
        <PostForm action="/logout" csrf={c.get("csrf")} class="row">
          <button class="primary" type="submit">Sign out</button>
          <a class="btn" href="/">Stay signed in</a>
        </PostForm>
      </>,
    );
  })
  .get("/setup", async (c) => {
    const token = (c.req.query("token") ?? "").slice(0, 100);
    const store = c.get("deps").store;
    if (c.get("principal")) return c.redirect("/", 303);
    if (!(await setupPending(store))) {
      return barePage(
        c,
        "Setup",
        <Alert tone="error">
          Setup is already complete or the link expired.{" "}
          <a href="/login">Sign in</a>
        </Alert>,
        410,
      );
    }
    if (!(await setupTokenValid(store, token))) {
      return barePage(
        c,
        "Setup",
        <Alert tone="error">
          This setup link is invalid or was already used. Open the newest setup
          link printed in the server log.
        </Alert>,
        410,
      );
    }
    return barePage(c, "Set up Orchard", <SetupForm token={token} />);
  })
  .post("/setup", async (c) => {
    const body = await c.req.parseBody();
    const token = str(body.token);
    const store = c.get("deps").store;
    try {
      await completeSetup(
        store,
        token,
        str(body.email),
        str(body.password),
        clientIp(c),
      );
      const { session } = await login(
        store,
        str(body.email),
        str(body.password),
        clientIp(c),
      );
      await setSessionCookie(c, store, session);
      return c.redirect("/", 303);
    } catch (err) {
      if (!(err instanceof ServiceError)) throw err;
      return barePage(
        c,
        "Set up Orchard",
        <SetupForm
          token={token}
          email={str(body.email)}
          error={portalMessage(err)}
        />,
        err instanceof ValidationError ? 400 : 401,
      );
    }
  })
  .get("/invite/:token", async (c) => {
    const token = c.req.param("token");
    const inv = await findInvite(c.get("deps").store, token);
    if (!inv) {
      return barePage(
        c,
        "Invite",
        <Alert tone="error">
          This invite link is invalid, expired or was already used.
        </Alert>,
        410,
      );
    }
    return barePage(
      c,
      "Accept invite",
      <InviteForm token={token} email={inv.email} role={inv.role} />,
    );
  })
  .post("/invite/:token", async (c) => {
    const token = c.req.param("token");
    const body = await c.req.parseBody();
    const store = c.get("deps").store;
    const inv = await findInvite(store, token);
    if (!inv) {
      return barePage(
        c,
        "Invite",
        <Alert tone="error">
          This invite link is invalid, expired or was already used.
        </Alert>,
        410,
      );
    }
    try {
      const user = await acceptInvite(
        store,
        token,
        str(body.password),
        clientIp(c),
      );
      const { session } = await login(
        store,
        user.email,
        str(body.password),
        clientIp(c),
      );
      await setSessionCookie(c, store, session);
      return c.redirect("/", 303);
    } catch (err) {
      if (!(err instanceof ServiceError)) throw err;
      return barePage(
        c,
        "Accept invite",
        <InviteForm
          token={token}
          email={inv.email}
          role={inv.role}
          error={portalMessage(err)}
        />,
        400,
      );
    }
  });

function SetupForm(props: { token: string; email?: string; error?: string }) {
  return (
    <>
      <h1>Create the first admin</h1>
      <p class="sub">This one-time link makes you the platform admin.</p>
      {props.error && <Alert tone="error">{props.error}</Alert>}
      <PostForm action="/setup" csrf="">
        <input type="hidden" name="token" value={props.token} />
        <Field
          label="Email"
          name="email"
          type="email"
          value={props.email}
          required
          autocomplete="username"
        />
        <Field
          label="Password"
          name="password"
          type="password"
          hint="at least 12 characters"
          required
          autocomplete="new-password"
        />
        <button class="primary" type="submit">Create admin</button>
      </PostForm>
    </>
  );
}

function InviteForm(
  props: { token: string; email: string; role: string; error?: string },
) {
  return (
    <>
      <h1>Join Orchard</h1>
      <p class="sub">
        You were invited as <b>{props.role.replace("_", " ")}</b>{" "}
        ({props.email}). Choose a password.
      </p>
      {props.error && <Alert tone="error">{props.error}</Alert>}
      <PostForm action={`/invite/${props.token}`} csrf="">
        <Field
          label="Password"
          name="password"
          type="password"
          hint="at least 12 characters"
          required
          autocomplete="new-password"
        />
        <button class="primary" type="submit">Create account</button>
      </PostForm>
    </>
  );
}
