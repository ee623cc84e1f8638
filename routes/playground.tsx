/**
 * `/playground` (platform admins only): chat with a model through the
 * gateway with a tenant key pasted into the page (keys are stored only as
 * hashes, so the page must take the key; it never stores it).
 */
import { Hono } from "hono";
import { Island } from "../components/Island.tsx";
import { Alert, Card } from "../components/ui.tsx";
import Playground from "../islands/Playground.tsx";
import { requirePlatform } from "../store/principal.ts";
import type { PortalEnv } from "./_env.ts";
import type { FleetPagesDeps } from "./_fleet.ts";
import { page } from "./_page.tsx";

/** Builds `/playground`. */
export function createPlaygroundPage(deps: FleetPagesDeps): Hono<PortalEnv> {
  return new Hono<PortalEnv>().get("/", (c) => {
    requirePlatform(c.get("principal")!);
    const models = [
      ...new Set(
        deps.fleet.nodes().filter((n) => n.state === "healthy").flatMap((n) =>
          n.models.filter((m) => m.kind === "chat" && m.servable !== false)
            .map((m) => m.id)
        ),
      ),
    ].sort();
    return page(
      c,
      "Playground",
      "/playground",
      (
        <>
          <h1>Playground</h1>
          <p class="sub">
            The quickest check of the whole path: key, limits, routing, node,
            streaming and metering. Requests count as the key's tenant usage.
          </p>
          <Alert tone="warn">
            Keys are shown only once and stored as hashes, so paste one here. It
            stays in this browser tab's memory and goes only to the gateway.
          </Alert>
          <Card>
            <Island
              name="Playground"
              component={Playground}
              props={{ models }}
            />
          </Card>
        </>
      ),
    );
  });
}
