/**
 * Admin endpoints for nodes (mounted under `/api/admin/v1` after admin
 * authentication, which sets the `principal` context variable): join
 * tokens, nodes, drain, removal, and link tests between nodes.
 */
import { Hono } from "hono";
import type { Config } from "../config.ts";
import type { AdminEnv } from "../routes/_env.ts";
import { ConflictError, ValidationError } from "../store/errors.ts";
import { createJoinToken, listJoinTokens } from "../store/join_tokens.ts";
import {
  getNode,
  listLinkTests,
  listNodes,
  removeNode,
  setNodeDedication,
  setNodeDrain,
} from "../store/nodes.ts";
import { modelsView } from "../store/model_overview.ts";
import {
  addPlacementRule,
  getModelAliases,
  removeModelSpan,
  removePlacementRule,
  setModelAlias,
  setModelSpan,
  setNodePlacement,
} from "../store/placement.ts";
import { requirePlatform } from "../store/principal.ts";
import {
  linkTestSchema,
  nodeDedicationSchema,
  parse,
} from "../store/schemas.ts";
import type { Store } from "../store/store.ts";
import { readJsonBody } from "../routes/api/_json.ts";
import { joinCommand } from "./join_command.ts";
import { createLinkTests, type LinkTests } from "./link_tests.ts";
import type { Fleet } from "./types.ts";

/** What the nodes admin API is built from. */
export interface NodesAdminDeps {
  store: Store;
  /** Calls nodes with a gateway-signed JWT (the registry from createFleet). */
  fleet: Pick<Fleet, "fetchNode" | "instances"> & {
    refresh?(): Promise<void>;
  };
  config: Pick<Config, "publicUrl">;
  /** The link-test runner, shared with the portal's mesh page (default: a new one). */
  links?: LinkTests;
}

const MAX_BODY = 16 * 1024;

function limit(raw: string | undefined): number | undefined {
  if (raw === undefined || raw === "") return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) {
    throw new ValidationError("limit must be a positive integer", "limit");
  }
  return n;
}

/** Builds the nodes admin sub-app (platform admins only). */
export function createNodesAdminApi(deps: NodesAdminDeps): Hono<AdminEnv> {
  const { store } = deps;
  const links = deps.links ?? createLinkTests(deps);
  const api = new Hono<AdminEnv>();

  api.post("/join-tokens", async (c) => {
    const { token, joinToken } = await createJoinToken(
      store,
      c.get("principal"),
      await readJsonBody(c, MAX_BODY),
    );
    c.header("cache-control", "no-store");
    // `command`: enroll, then run as a service (fleet/join_command.ts).
    return c.json({
      ...joinToken,
      token,
      ...joinCommand(deps.config.publicUrl, token, c.req.url),
    }, 201);
  });
  api.get("/join-tokens", async (c) =>
    c.json(
      await listJoinTokens(store, c.get("principal"), {
        cursor: c.req.query("cursor"),
        limit: limit(c.req.query("limit")),
      }),
    ));

  api.get(
    "/nodes",
    async (c) => c.json({ items: await listNodes(store, c.get("principal")) }),
  );
  api.get(
    "/nodes/:id",
    async (c) =>
      c.json(await getNode(store, c.get("principal"), c.req.param("id"))),
  );
  api.post("/nodes/:id/drain", async (c) =>
    c.json(
      await setNodeDrain(store, c.get("principal"), c.req.param("id"), true),
    ));
  api.post("/nodes/:id/undrain", async (c) =>
    c.json(
      await setNodeDrain(store, c.get("principal"), c.req.param("id"), false),
    ));
  // Dedicates a node to a tenant (`{"tenantId": "…"}`) or shares it again
  // (`{"tenantId": null}`); this gateway routes by it before answering.
  api.put("/nodes/:id/dedication", async (c) => {
    const { tenantId } = parse(
      nodeDedicationSchema,
      await readJsonBody(c, MAX_BODY),
    );
    const node = await setNodeDedication(
      store,
      c.get("principal"),
      c.req.param("id"),
      tenantId,
    );
    await deps.fleet.refresh?.();
    return c.json(node);
  });
  // The spanning instances the nodes report (fleet/instances.ts): members,
  // who serves, whether it is available and why not.
  api.get("/instances", (c) => {
    requirePlatform(c.get("principal"));
    return c.json({ items: deps.fleet.instances?.() ?? [] });
  });
  // Model placement and aliases (store/placement.ts); nodes learn their
  // desired models from their next heartbeat's answer.
  api.get("/models", async (c) => {
    const v = await modelsView(store, c.get("principal"));
    return c.json({
      items: v.models,
      mismatches: v.mismatches,
      placement: v.placement,
      aliases: v.aliases,
      desired: v.desired,
    });
  });
  api.put("/nodes/:id/placement", async (c) =>
    c.json(
      await setNodePlacement(
        store,
        c.get("principal"),
        c.req.param("id"),
        await readJsonBody(c, MAX_BODY),
      ),
    ));
  // A model across several nodes (head first): ggml RPC, instance rpc:<id>
  api.put("/models/:id/span", async (c) => {
    const span = await setModelSpan(
      store,
      c.get("principal"),
      c.req.param("id"),
      await readJsonBody(c, MAX_BODY),
    );
    return c.json({ ...span, instance: `rpc:${span.id}` });
  });
  api.delete("/models/:id/span", async (c) => {
    await removeModelSpan(store, c.get("principal"), c.req.param("id"));
    return c.json({ model: c.req.param("id"), removed: true });
  });
  api.post("/placement/rules", async (c) =>
    c.json(
      await addPlacementRule(
        store,
        c.get("principal"),
        await readJsonBody(c, MAX_BODY),
      ),
      201,
    ));
  api.delete("/placement/rules/:rule", async (c) => {
    await removePlacementRule(store, c.get("principal"), c.req.param("rule"));
    return c.json({ id: c.req.param("rule"), removed: true });
  });
  api.get("/model-aliases", async (c) => {
    requirePlatform(c.get("principal"));
    return c.json(await getModelAliases(store));
  });
  api.put("/model-aliases/:alias", async (c) => {
    const next = await setModelAlias(
      store,
      c.get("principal"),
      c.req.param("alias"),
      await readJsonBody(c, MAX_BODY),
    );
    await deps.fleet.refresh?.();
    return c.json(next);
  });
  api.delete("/model-aliases/:alias", async (c) => {
    const next = await setModelAlias(
      store,
      c.get("principal"),
      c.req.param("alias"),
      null,
    );
    await deps.fleet.refresh?.();
    return c.json(next);
  });
  api.delete("/nodes/:id", async (c) => {
    await removeNode(store, c.get("principal"), c.req.param("id"));
    return c.json({ id: c.req.param("id"), removed: true });
  });

  api.post("/links/test", async (c) => {
    const p = c.get("principal");
    requirePlatform(p);
    const { a, b } = parse(linkTestSchema, await readJsonBody(c, MAX_BODY));
    await getNode(store, p, a);
    await getNode(store, p, b);
    return c.json(await links.testPair(p, a, b));
  });
  api.post("/links/test-all", async (c) => {
    const p = c.get("principal");
    requirePlatform(p);
    const nodes = await listNodes(store, p);
    const ids = nodes.filter((n) => n.state === "healthy").map((n) => n.id);
    if (!links.startAll(p, ids)) {
      throw new ConflictError("A link test run is already in progress");
    }
    return c.json(links.progress(), 202);
  });
  api.get("/links", async (c) =>
    c.json({
      items: await listLinkTests(store, c.get("principal")),
      progress: links.progress(),
    }));
  api.get("/links/progress", (c) => {
    requirePlatform(c.get("principal"));
    return c.json(links.progress());
  });
  return api;
}
