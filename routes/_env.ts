/** Typed context shared by portal routes and the admin API. */
import type { AppDeps } from "../app.ts";
import type { IslandManifest } from "../lib/islands_build.ts";
import type { Principal } from "../store/principal.ts";
import type { Session } from "../store/sessions.ts";
import type { User } from "../store/users.ts";

/** Hono environment of the portal. */
export interface PortalEnv {
  Variables: {
    deps: AppDeps;
    islands: IslandManifest;
    principal: Principal | null;
    user: User | null;
    session: Session | null;
    /** The CSRF token for forms on this page (empty when signed out). */
    csrf: string;
    /** Budget alerts not acknowledged yet, for the navigation's badge. */
    openAlerts?: number;
  };
}

/** Hono environment of the admin API. */
export interface AdminEnv {
  Variables: {
    deps: AppDeps;
    principal: Principal;
  };
}

/** The client IP as seen by this server (proxies are not trusted by default). */
export function clientIp(
  c: { env: unknown; req: { header(name: string): string | undefined } },
): string | null {
  const info = (c.env as { remoteAddr?: Deno.NetAddr } | undefined)?.remoteAddr;
  if (Deno.env.get("ORCHARD_TRUST_PROXY") === "1") {
    const fwd = c.req.header("x-forwarded-for")?.split(",")[0]?.trim();
    if (fwd) return fwd.slice(0, 64);
  }
  return info?.hostname ?? null;
}
