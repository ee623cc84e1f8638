/**
 * A chat request's prompt tokens as a generation of it would bill them: a
 * node serving the model renders (chat template, tools) and tokenizes the
 * request (`POST /orchard/count_tokens`, node/server.ts), with the same
 * gateway-signed call as any node request but no slot taken. Only when no
 * node answers is the gateway's byte estimate given instead, and the
 * answer says so (`x-orchard-token-count`).
 *
 * `/v1/messages/count_tokens` and `/v1/responses/input_tokens` both count
 * through `countPromptTokens`.
 */
import { OpenAIError } from "../protocol/openai/errors.ts";
import type { GatewayCore } from "./core.ts";
import { nodeError } from "./upstream.ts";

/** How long one node may take to count (a model not loaded yet loads first). */
const COUNT_TIMEOUT_MS = 30_000;
/** Nodes tried before falling back to the estimate. */
const COUNT_TRIES = 2;
/** Largest count answer read. */
const MAX_ANSWER_BYTES = 64 * 1024;

/** A prompt's token count. */
export interface PromptTokenCount {
  /** Prompt tokens: exact (a node counted them), else the estimate. */
  tokens: number;
  /** Whether a node counted (false: no node answered; `tokens` is the estimate). */
  exact: boolean;
  /** The context per request of the node that counted, tokens (null when none did). */
  contextLength: number | null;
}

/** What `countPromptTokens` needs. */
export interface CountRequest {
  /** The model id (resolved: `core.resolveModel`). */
  model: string;
  /** The `/v1/chat/completions` body the request would be sent to a node as. */
  body: Record<string, unknown>;
  /** The gateway's estimate, answered when no node can count. */
  estimate: number;
  /** The tenant, so a node dedicated to another tenant is never asked. */
  tenantId: string | null;
  signal: AbortSignal;
  requestId: string;
}

/**
 * Counts `req.body`'s prompt tokens on a node serving `req.model` (the
 * least busy first, a second one if it fails); a 4xx from the node (a
 * template that refuses the messages) is thrown as it is, since every node
 * would say the same.
 */
export async function countPromptTokens(
  core: GatewayCore,
  req: CountRequest,
): Promise<PromptTokenCount> {
  const nodes = core.fleet.candidates(req.model)
    .filter((n) => !n.dedicatedTo || n.dedicatedTo === req.tenantId)
    .sort((a, b) => core.router.inFlight(a.id) - core.router.inFlight(b.id))
    .slice(0, COUNT_TRIES);
  const payload = JSON.stringify({ ...req.body, model: req.model });
  for (const node of nodes) {
    req.signal.throwIfAborted();
    const signal = AbortSignal.any([
      req.signal,
      AbortSignal.timeout(COUNT_TIMEOUT_MS),
    ]);
    try {
      const target = await core.fleet.nodeTarget(node.id);
      const res = await core.upstream.client.request(
        target.url,
        "/orchard/count_tokens",
        {
          method: "POST",
          headers: {
            ...target.headers,
            "content-type": "application/json",
            "x-request-id": req.requestId,
          },
          body: payload,
          signal,
        },
      );
      if (res.status >= 400 && res.status < 500 && res.status !== 404) {
        throw await nodeError(res, MAX_ANSWER_BYTES);
      }
      if (res.status !== 200) {
        res.cancel();
        continue; // an engine that cannot count, or a node in trouble
      }
      const got = JSON.parse(await res.text(MAX_ANSWER_BYTES)) as {
        prompt_tokens?: unknown;
        context_length?: unknown;
      };
      if (!Number.isSafeInteger(got.prompt_tokens)) continue;
      return {
        tokens: got.prompt_tokens as number,
        exact: true,
        contextLength: Number.isSafeInteger(got.context_length)
          ? got.context_length as number
          : null,
      };
    } catch (e) {
      if (e instanceof OpenAIError) throw e;
      if (req.signal.aborted) throw e;
      // unreachable, timed out, or an unreadable answer: the next node
    }
  }
  return { tokens: req.estimate, exact: false, contextLength: null };
}

/** The header telling a client how its count was made. */
export function tokenCountHeaders(c: PromptTokenCount): Record<string, string> {
  return {
    "x-orchard-token-count": c.exact
      ? "exact"
      : "estimate; no node serving the model could count",
  };
}
