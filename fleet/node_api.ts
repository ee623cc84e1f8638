/**
 * The node-facing API (`/api/node/v1`): enrollment with a join token, and
 * heartbeats authenticated by an EdDSA JWT signed with the node's own key.
 * Both start a check that the gateway reaches the node at its advertised
 * URL when one is due; the heartbeat answer carries the last result.
 */
import { Hono } from "hono";
import type { Config } from "../config.ts";
import { importEd25519, peekClaims, verifyEdDSA } from "../lib/jwt.ts";
import { UnauthorizedError } from "../store/errors.ts";
import {
  enrollNode,
  enrollSchema,
  getNodeRecord,
  recordHeartbeat,
} from "../store/nodes.ts";
import { parse } from "../store/schemas.ts";
import type { Store } from "../store/store.ts";
import { readJsonBody } from "../routes/api/_json.ts";
import { validateNodeUrl } from "./node_url.ts";
import {
  type EnrollResponse,
  GATEWAY_AUDIENCE,
  type HeartbeatResponse,
  NODE_JWT_MAX_AGE,
} from "../protocol/node_messages.ts";
import type { ReachabilityChecker } from "./reachability.ts";

/** What the node-facing API is built from. */
export interface NodeApiDeps {
  store: Store;
  config: Pick<Config, "allowPrivateNodeUrls">;
  /** Checks that nodes are reachable at their URLs (absent: no checks). */
  reachability?: ReachabilityChecker | null;
}

const MAX_BODY = 256 * 1024;

/** Builds the node-facing sub-app (mount at `/api/node/v1`). */
export function createNodeFacingApi(deps: NodeApiDeps): Hono {
  const { store, config } = deps;
  // Imported node keys by node id and thumbprint (a re-enrolled id never reuses a key).
  const keys = new Map<string, { thumb: string; key: CryptoKey }>();

  async function authenticate(header: string | undefined): Promise<string> {
    const token = /^Bearer\s+(\S+)$/i.exec(header ?? "")?.[1];
    const nodeId = token ? peekClaims(token)?.iss : undefined;
    if (!token || !nodeId || nodeId.length > 64) {
      throw new UnauthorizedError("A node-signed bearer JWT is required");
    }
    const node = await getNodeRecord(store, nodeId);
    if (!node) throw new UnauthorizedError("Node is not enrolled");
    let cached = keys.get(nodeId);
    if (cached?.thumb !== node.keyThumbprint) {
      cached = {
        thumb: node.keyThumbprint,
        key: await importEd25519(node.publicJwk),
      };
      keys.set(nodeId, cached);
    }
    const claims = await verifyEdDSA(cached.key, token, {
      iss: nodeId,
      aud: GATEWAY_AUDIENCE,
      maxTokenAge: NODE_JWT_MAX_AGE,
    });
    if (!claims) throw new UnauthorizedError("Node JWT is not valid");
    return nodeId;
  }

  const api = new Hono();
  api.post("/enroll", async function enroll(c) {
    const input = parse(enrollSchema, await readJsonBody(c, MAX_BODY));
    input.url = validateNodeUrl(input.url, config.allowPrivateNodeUrls);
    const ip = (c.env as { remoteAddr?: Deno.NetAddr } | undefined)
      ?.remoteAddr?.hostname ?? null;
    const node = await enrollNode(store, input, ip);
    deps.reachability?.observe(node.id, node.url);
    const body: EnrollResponse = {
      nodeId: node.id,
      name: node.name,
      url: node.url,
      gatewayJwks: { keys: [store.secrets.gatewayPublicJwk] },
    };
    c.header("cache-control", "no-store");
    return c.json(body, 201);
  });
  api.post("/heartbeat", async function heartbeat(c) {
    const nodeId = await authenticate(c.req.header("authorization"));
    const body = await readJsonBody(c, MAX_BODY);
    if (typeof body.url === "string") {
      body.url = validateNodeUrl(body.url, config.allowPrivateNodeUrls);
    }
    const { drain, url, placement, span } = await recordHeartbeat(
      store,
      nodeId,
      body,
    );
    const reachability = deps.reachability?.observe(nodeId, url);
    const res: HeartbeatResponse = reachability
      ? { drain, reachability, placement, span }
      : { drain, placement, span };
    return c.json(res);
  });
  return api;
}
