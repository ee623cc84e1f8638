/**
 * `/playground` (platform and tenant admins): chat with a model through the
 * gateway with a tenant key pasted into the page (keys are stored only as
 * hashes, so the page must take the key; it never stores it). The gateway
 * holds the key to its own tenant, so a tenant admin tries only its keys;
 * the page lists the models of shared nodes and of its tenant's dedicated
 * ones, never another tenant's.
 */
import { Hono } from "hono";
import { Island } from "../components/Island.tsx";
import { Alert, Card } from "../components/ui.tsx";
import Playground from "../islands/Playground.tsx";
import { ForbiddenError } from "../store/errors.ts";
import { isPlatform } from "../store/principal.ts";
import type { PortalEnv } from "./_env.ts";
import type { FleetPagesDeps } from "./_fleet.ts";
import { page } from "./_page.tsx";

/** Builds `/playground`. */
export function createPlaygroundPage(deps: FleetPagesDeps): Hono<PortalEnv> {
  return new Hono<PortalEnv>().get("/", (c) => {
    const p = c.get("principal")!;
    if (!isPlatform(p) && p.role !== "tenant_admin") {
      throw new ForbiddenError("Only admins can use the playground");
    }
    const models = [
      ...new Set(
        deps.fleet.nodes().filter((n) =>
          n.state === "healthy" &&
          (isPlatform(p) || !n.dedicatedTo || n.dedicatedTo === p.tenantId)
        ).flatMap((n) =>
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
