/** Shorthands for route handlers: render a page inside the layout. */
import type { Context } from "hono";
import type { ComponentChildren } from "preact";
import { Layout } from "../components/Layout.tsx";
import type { PortalEnv } from "./_env.ts";
import { renderPage } from "./_render.tsx";

/** Renders a signed-in page. */
export function page(
  c: Context<PortalEnv>,
  title: string,
  active: string,
  children: ComponentChildren,
  status: 200 | 400 | 403 | 404 | 409 | 429 = 200,
): Response {
  const html = renderPage(
    title,
    <Layout
      title={title}
      principal={c.get("principal")!}
      csrf={c.get("csrf")}
      active={active}
      openAlerts={c.get("openAlerts")}
    >
      {children}
    </Layout>,
    c.get("islands"),
  );
  return c.html(html, status, { "cache-control": "no-store" });
}

/** Renders a page without the navigation (sign-in, setup, invites, errors). */
export function barePage(
  c: Context<PortalEnv>,
  title: string,
  children: ComponentChildren,
  status: 200 | 400 | 401 | 403 | 404 | 409 | 410 | 429 | 500 | 502 = 200,
): Response {
  const html = renderPage(
    title,
    <div class="center">
      <section class="card">{children}</section>
    </div>,
    c.get("islands"),
  );
  return c.html(html, status, { "cache-control": "no-store" });
}

/** A form value as a string ("" when absent or a file). */
export function str(v: unknown): string {
  return typeof v === "string" ? v : "";
}

/** A safe local redirect target (no open redirects). */
export function safeNext(next: string | undefined): string {
  if (
    !next || !next.startsWith("/") || next.startsWith("//") ||
    next.includes("\\")
  ) {
    return "/";
  }
  return next.slice(0, 2000);
}
