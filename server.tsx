/**
 * Builds the complete Orchard HTTP app: portal pages, admin API, and the
 * parts other modules contribute (gateway, node-facing API), with errors
 * rendered in one place per protocol.
 */
import { type Context, Hono } from "hono";
import { serveStatic } from "hono/deno";
import { secureHeaders } from "hono/secure-headers";
import type { AppDeps, AppPart } from "./app.ts";
import { Alert } from "./components/ui.tsx";
import type { IslandManifest } from "./lib/islands_build.ts";
import { log } from "./lib/log.ts";
import { ServiceError, TooManyRequestsError } from "./store/errors.ts";
import { isPlatform } from "./store/principal.ts";
import type { AdminEnv, PortalEnv } from "./routes/_env.ts";
import {
  csrfMiddleware,
  requireSignIn,
  sessionMiddleware,
} from "./routes/_middleware.ts";
import { barePage } from "./routes/_page.tsx";
import { portalMessage } from "./routes/_messages.ts";
import { onceMiddleware } from "./routes/_once.tsx";
import { createAdminApi } from "./routes/api/admin.ts";
import { createAccountsAdminApi } from "./routes/api/accounts.ts";
import { adminTokenRoutes } from "./routes/admin_tokens.tsx";
import { passwordResetRoutes } from "./routes/password_reset.tsx";
import { userRoutes } from "./routes/users.tsx";
import { errorBody } from "./routes/api/_json.ts";
import { auditRoutes } from "./routes/audit.tsx";
import { chargebackRoutes } from "./routes/chargeback.tsx";
import { alertBadge } from "./routes/budgets.tsx";
import { authRoutes } from "./routes/auth.tsx";
import { tenantDetailRoutes } from "./routes/tenant.tsx";
import { tenantRoutes } from "./routes/tenants.tsx";
import { settingsRoutes } from "./routes/settings.tsx";
import { ssoRoutes } from "./routes/sso.tsx";
import { ssoSettingsRoutes } from "./routes/sso_settings.tsx";
import { statementRoutes } from "./routes/statements.tsx";
import { keyRoutes } from "./routes/keys.tsx";
import { requestLogRoutes } from "./routes/requests.tsx";
import { usageRoutes } from "./routes/usage.tsx";
import { capacityRoutes } from "./routes/capacity.tsx";

/** Extra pieces mounted next to the portal and admin API. */
export interface OrchardExtras {
  /** The gateway app, handed `/v1/*` and `/metrics` requests whole (its errors stay OpenAI-shaped). */
  gateway?: Hono;
  /** Sub-apps mounted at the root before the portal (gateway `/v1`, `/metrics`, `/api/node/v1`). */
  parts?: AppPart[];
  /** Sub-apps mounted under `/api/admin/v1` after admin authentication. */
  adminParts?: Hono<AdminEnv>[];
  /** Portal sub-apps (signed-in pages) mounted at the given paths. */
  portalParts?: { path: string; app: Hono<PortalEnv> }[];
}

/** Builds the app. */
export function createOrchardApp(
  deps: AppDeps,
  islands: IslandManifest,
  extras: OrchardExtras = {},
): Hono {
  const app = new Hono();
  app.use("*", async (c, next) => {
    const ctx = asPortal(c);
    ctx.set("deps", deps);
    ctx.set("islands", islands);
    await next();
  });
  const gateway = extras.gateway;
  if (gateway) {
    const toGateway = (c: Context) => gateway.fetch(c.req.raw, c.env);
    app.all("/v1/*", toGateway);
    app.all("/v1", toGateway);
    app.get("/metrics", toGateway);
  }
  for (const part of extras.parts ?? []) app.route(part.path, part.app);

  // for load balancers and process supervisors: 200 while this process
  // serves and its store answers, 503 otherwise (no auth, no details)
  app.get("/healthz", async (c) => {
    try {
      await deps.store.kv.get(["healthz"], { consistency: "eventual" });
      return c.json({ status: "ok" }, 200, { "cache-control": "no-store" });
    } catch {
      return c.json({ status: "store_unreachable" }, 503, {
        "cache-control": "no-store",
      });
    }
  });

  const admin = createAdminApi();
  admin.route("/", createAccountsAdminApi());
  for (const extra of extras.adminParts ?? []) admin.route("/", extra);
  // an unknown admin path, once authenticated, is a JSON 404 (not the portal's sign-in page)
  admin.all("*", (c) =>
    c.json({
      error: {
        message: `No admin API route ${c.req.method} ${c.req.path}`,
        code: "not_found",
        field: null,
      },
    }, 404));
  app.route("/api/admin/v1", admin as unknown as Hono);

  const portal = new Hono<PortalEnv>();
  portal.use(
    "*",
    secureHeaders({
      contentSecurityPolicy: {
        defaultSrc: ["'self'"],
        scriptSrc: ["'self'"],
        styleSrc: ["'self'", "'unsafe-inline'"],
        imgSrc: ["'self'", "data:"],
        connectSrc: ["'self'"],
        frameAncestors: ["'none'"],
        formAction: ["'self'"],
      },
    }),
  );
  portal.use("*", sessionMiddleware(), csrfMiddleware(), onceMiddleware());
  portal.route("/", authRoutes);
  portal.route("/", passwordResetRoutes);
  portal.route("/", ssoRoutes);
  const signedIn = new Hono<PortalEnv>();
  signedIn.use("*", requireSignIn(), alertBadge());
  signedIn.get("/", (c) => {
    const p = c.get("principal")!;
    return c.redirect(
      isPlatform(p) ? "/tenants" : `/tenants/${p.tenantId}`,
      303,
    );
  });
  signedIn.route("/tenants", tenantRoutes);
  signedIn.route("/tenants", tenantDetailRoutes);
  signedIn.route("/tenants", statementRoutes);
  signedIn.route("/tenants", keyRoutes);
  signedIn.route("/tenants", requestLogRoutes);
  signedIn.route("/audit", auditRoutes);
  signedIn.route("/usage", usageRoutes);
  signedIn.route("/settings/sso", ssoSettingsRoutes);
  signedIn.route("/capacity", capacityRoutes);
  signedIn.route("/settings", settingsRoutes);
  signedIn.route("/chargeback", chargebackRoutes);
  signedIn.route("/admin-tokens", adminTokenRoutes);
  signedIn.route("/users", userRoutes);
  for (const part of extras.portalParts ?? []) {
    signedIn.route(part.path, part.app);
  }
  portal.route("/", signedIn);

  app.use(
    "/static/build/*",
    async (c, next) => {
      await next();
      if (c.res.status === 200) {
        c.header("cache-control", "public, max-age=31536000, immutable");
      }
    },
  );
  app.use("/static/*", serveStatic({ root: "./" }));
  // browsers ask for /favicon.ico whatever the page links; the icon is an SVG
  app.get("/favicon.ico", (c) => c.redirect("/static/favicon.svg", 301));
  app.route("/", portal as unknown as Hono);

  app.notFound((c) => {
    if (c.req.path.startsWith("/api/")) {
      return c.json({
        error: { message: "Not found", code: "not_found", field: null },
      }, 404);
    }
    return barePage(
      asPortal(c),
      "Not found",
      <>
        <h1>Not found</h1>
        <p>
          <a href="/">Back to Orchard</a>
        </p>
      </>,
      404,
    );
  });
  app.onError((err, c) => {
    const api = c.req.path.startsWith("/api/");
    if (err instanceof ServiceError) {
      if (err instanceof TooManyRequestsError) {
        c.header("retry-after", String(err.retryAfter));
      }
      if (api) {
        return c.json(errorBody(err), err.status as 400);
      }
      if (err.status === 401) return c.redirect("/login", 303);
      return barePage(
        asPortal(c),
        err.status === 404 ? "Not found" : "Not allowed",
        <>
          <Alert tone="error">{portalMessage(err)}</Alert>
          <p>
            <a href="/">Back to Orchard</a>
          </p>
        </>,
        err.status as 404,
      );
    }
    log.error("unhandled error", {
      path: c.req.path,
      method: c.req.method,
      error: String(err),
      stack: (err as Error)?.stack,
    });
    if (api) {
      return c.json({
        error: { message: "Internal error", code: "internal", field: null },
      }, 500);
    }
    return barePage(
      asPortal(c),
      "Error",
      <Alert tone="error">Something went wrong. It was logged.</Alert>,
      500,
    );
  });
  return app;
}

/** Views a root context as the portal's typed context (the root sets its variables first). */
function asPortal(c: Context): Context<PortalEnv> {
  return c as unknown as Context<PortalEnv>;
}
