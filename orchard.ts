/**
 * Wires the whole application from a store and configuration: the portal
 * and admin API (server.tsx), the gateway (`/v1/*`, `/metrics`), the
 * node-facing API and the fleet registry. `main.ts` and the end-to-end
 * tests build Orchard through this one function.
 */
import type { Hono } from "hono";
import type { Config } from "./config.ts";
import { createNodesAdminApi } from "./fleet/admin_api.ts";
import { createNodeFacingApi } from "./fleet/node_api.ts";
import { NODE_API_PATH } from "./fleet/protocol.ts";
import { createFleet, type FleetRegistry } from "./fleet/registry.ts";
import {
  createGateway,
  type Gateway,
  type GatewayOptions,
} from "./gateway/mod.ts";
import type { IslandManifest } from "./lib/islands_build.ts";
import { createOrchardApp, type OrchardExtras } from "./server.tsx";
import type { Store } from "./store/store.ts";

/** A running Orchard (without the HTTP listener). */
export interface Orchard {
  app: Hono;
  fleet: FleetRegistry;
  gateway: Gateway;
  /** Stops background work (fleet refresh, pending usage writes). */
  close(): Promise<void>;
}

/** Options of `createOrchard`. */
export interface OrchardOptions {
  store: Store;
  config: Config;
  islands: IslandManifest;
  gateway?: GatewayOptions;
  fleetRefreshMs?: number;
  /** Extra portal pages (dashboards). */
  portalParts?: OrchardExtras["portalParts"];
  adminParts?: OrchardExtras["adminParts"];
}

/** Builds Orchard. */
export function createOrchard(opts: OrchardOptions): Orchard {
  const { store, config } = opts;
  const fleet = createFleet({ store, refreshMs: opts.fleetRefreshMs });
  const gateway = createGateway({ store, config, fleet }, opts.gateway);
  const app = createOrchardApp({ store, config }, opts.islands, {
    gateway: gateway.app,
    parts: [{
      path: NODE_API_PATH,
      app: createNodeFacingApi({ store, config }),
    }],
    adminParts: [
      createNodesAdminApi({ store, fleet, config }),
      ...(opts.adminParts ?? []),
    ],
    portalParts: opts.portalParts,
  });
  return {
    app,
    fleet,
    gateway,
    close: async () => {
      await fleet.close();
      await gateway.idle();
    },
  };
}
