/**
 * Wires the whole application from a store and configuration: the portal
 * and admin API (server.tsx), the gateway (`/v1/*`, `/metrics`), the
 * node-facing API and the fleet registry. `main.ts` and the end-to-end
 * tests build Orchard through this one function.
 */
import type { Hono } from "hono";
import type { Config } from "./config.ts";
import { createNodesAdminApi } from "./fleet/admin_api.ts";
import { createLinkTests } from "./fleet/link_tests.ts";
import { createNodeFacingApi } from "./fleet/node_api.ts";
import { NODE_API_PATH } from "./protocol/node_messages.ts";
import { createFleet, type FleetRegistry } from "./fleet/registry.ts";
import { createReachability } from "./fleet/reachability.ts";
import {
  createGateway,
  type Gateway,
  type GatewayOptions,
} from "./gateway/mod.ts";
import type { IslandManifest } from "./lib/islands_build.ts";
import { alertPageRoutes, budgetPageRoutes } from "./routes/budgets.tsx";
import { createMeshPages } from "./routes/mesh.tsx";
import { createModelsPages } from "./routes/models.tsx";
import { createNodesPages } from "./routes/nodes.tsx";
import { createPlaygroundPage } from "./routes/playground.tsx";
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
  /** How often `/nodes/events` pushes node state (default 2000 ms). */
  liveIntervalMs?: number;
}

/** Builds Orchard. */
export function createOrchard(opts: OrchardOptions): Orchard {
  const { store, config } = opts;
  const fleet = createFleet({ store, refreshMs: opts.fleetRefreshMs });
  const reachability = createReachability({ store });
  const gateway = createGateway({ store, config, fleet }, opts.gateway);
  // One link-test runner, so the API and the mesh page share its progress.
  const links = createLinkTests({ store, fleet });
  const fleetPages = {
    fleet,
    links,
    liveIntervalMs: opts.liveIntervalMs,
    queued: () => gateway.core.router.queued,
  };
  const app = createOrchardApp({ store, config }, opts.islands, {
    gateway: gateway.app,
    parts: [{
      path: NODE_API_PATH,
      app: createNodeFacingApi({ store, config, reachability }),
    }],
    adminParts: [
      createNodesAdminApi({ store, fleet, config, links }),
      ...(opts.adminParts ?? []),
    ],
    portalParts: [
      { path: "/nodes", app: createNodesPages(fleetPages) },
      { path: "/mesh", app: createMeshPages(fleetPages) },
      { path: "/models", app: createModelsPages(fleetPages) },
      { path: "/playground", app: createPlaygroundPage(fleetPages) },
      { path: "/tenants", app: budgetPageRoutes },
      { path: "/alerts", app: alertPageRoutes },
      ...(opts.portalParts ?? []),
    ],
  });
  return {
    app,
    fleet,
    gateway,
    close: async () => {
      await fleet.close();
      await reachability.close();
      await gateway.close();
    },
  };
}
