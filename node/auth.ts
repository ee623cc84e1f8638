/**
 * Authentication of gateway→node calls: a short-lived EdDSA JWT signed by
 * the gateway (`iss` "orchard-gateway", `aud` = this node's id), verified
 * with the gateway public keys received at enrollment. Verified tokens are
 * remembered until they expire, since the gateway reuses each for seconds.
 */
import type { MiddlewareHandler } from "hono";
import { importEd25519, verifyEdDSA } from "../lib/jwt.ts";
import { openAIErrorResponse } from "../protocol/openai/errors.ts";
import {
  GATEWAY_AUDIENCE,
  NODE_JWT_MAX_AGE,
} from "../protocol/node_messages.ts";

/** Verifies gateway JWTs for one node. */
export interface GatewayVerifier {
  /** Whether `token` is a valid gateway JWT for this node. */
  verify(token: string): Promise<boolean>;
}

/** Builds a verifier from the gateway's JWKs and this node's id. */
export async function createGatewayVerifier(
  jwks: { keys: JsonWebKey[] },
  nodeId: string,
): Promise<GatewayVerifier> {
  const keys = await Promise.all(jwks.keys.map((j) => importEd25519(j)));
  if (keys.length === 0) {
    throw new Error("Cannot authenticate the gateway: no gateway keys");
  }
  const seen = new Map<string, number>(); // token → exp (ms)
  return {
    async verify(token) {
      const now = Date.now();
      const exp = seen.get(token);
      if (exp !== undefined) {
        if (exp > now) return true;
        seen.delete(token);
      }
      for (const key of keys) {
        const claims = await verifyEdDSA(key, token, {
          iss: GATEWAY_AUDIENCE,
          aud: nodeId,
          maxTokenAge: NODE_JWT_MAX_AGE,
        });
        if (claims) {
          if (seen.size > 1000) {
            for (const [t, e] of seen) if (e <= now) seen.delete(t);
            if (seen.size > 1000) seen.clear();
          }
          seen.set(token, claims.exp * 1000);
          return true;
        }
      }
      return false;
    },
  };
}

/** Middleware answering 401 (OpenAI shape) unless a valid gateway JWT is present. */
export function requireGateway(v: GatewayVerifier): MiddlewareHandler {
  return async function requireGateway(c, next) {
    const token = /^Bearer\s+(\S+)$/i.exec(c.req.header("authorization") ?? "")
      ?.[1];
    if (!token || token.length > 4096 || !(await v.verify(token))) {
      return openAIErrorResponse(
        401,
        "invalid_api_key",
        "This node only answers its gateway",
        { headers: { "www-authenticate": 'Bearer realm="orchard-node"' } },
      );
    }
    await next();
  };
}
