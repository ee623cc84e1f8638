/**
 * Composes the whole HTTP surface on one Hono app: the portal (pages), the
 * admin API, the gateway (`/v1/*`, `/metrics`) and the node-facing API.
 * Each part is a sub-app built by a factory from the same dependencies.
 */
import { Hono } from "hono";
import type { Config } from "./config.ts";
import type { Store } from "./store/store.ts";

/** What every part of the app is built from. */
export interface AppDeps {
  store: Store;
  config: Config;
}

/** A part of the app: a factory returning a Hono sub-app and where to mount it. */
export interface AppPart {
  path: string;
  app: Hono;
}

/** Builds the app from its dependencies and parts (mounted in order). */
export function composeApp(parts: AppPart[]): Hono {
  const app = new Hono();
  for (const part of parts) app.route(part.path, part.app);
  return app;
}
