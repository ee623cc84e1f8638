/**
 * The gateway: OpenAI-compatible `/v1/*` (with the Responses API,
 * `/v1/responses`, and Anthropic's `/v1/messages`)
 * plus Prometheus `/metrics`, as a Hono app the composition root mounts at
 * "/". Every response carries `x-request-id`.
 */
import { Hono } from "hono";
import type { AppDeps } from "../app.ts";
import type { Fleet } from "../fleet/types.ts";
import { OpenAIError } from "../protocol/openai/errors.ts";
import { countTokens, messages } from "./anthropic.ts";
import { GatewayCore, type GatewayOptions } from "./core.ts";
import { metricsAllowed } from "./metrics_route.ts";
import { completions, embeddings, models } from "./openai.ts";
import {
  countInputTokens,
  createResponse,
  deleteStored,
  retrieveResponse,
} from "./responses.ts";

export type { GatewayOptions } from "./core.ts";

/** A gateway instance: its app, plus hooks for tests and shutdown. */
export interface Gateway {
  app: Hono;
  core: GatewayCore;
  /** Resolves once settlements and usage writes in progress are done. */
  idle(): Promise<void>;
  /** Registers this gateway instance and reclaims what its previous incarnation held (see GatewayCore.start). */
  start(): Promise<void>;
  /** Idles, then stops this instance's heartbeat (see GatewayCore.close). */
  close(): Promise<void>;
  /**
   * Ends every node call in progress, telling each node to stop its work,
   * and answers new ones 503: a graceful stop whose drain time is up.
   */
  stopCalls(): void;
}

type Env = { Variables: { requestId: string } };

let counter = 0;
const PREFIX = crypto.randomUUID().slice(0, 8);
/** A unique request id (`req_<instance>_<seq>_<time>`), cheap to make. */
function requestId(): string {
  return `req_${PREFIX}${(counter++).toString(36)}${Date.now().toString(36)}`;
}

function clientIp(env: unknown): string | null {
  return (env as { remoteAddr?: Deno.NetAddr } | undefined)?.remoteAddr
    ?.hostname ?? null;
}

/** Builds the gateway with its shared state. */
export function createGateway(
  deps: AppDeps & { fleet: Fleet },
  opts: GatewayOptions = {},
): Gateway {
  const core = new GatewayCore(deps, opts);
  const app = new Hono<Env>();
  // Every handler puts the id on its response itself: reading a response's
  // headers back here would cost each request Deno's native header path.
  app.use("*", function requestIdHeader(c, next) {
    c.set("requestId", requestId());
    return next();
  });
  app.get(
    "/v1/models",
    (c) => models(core, c.req.raw, c.get("requestId"), null),
  );
  app.get(
    "/v1/models/:id{.+}",
    (c) => models(core, c.req.raw, c.get("requestId"), c.req.param("id")),
  );
  app.post(
    "/v1/chat/completions",
    (c) => completions(core, c.req.raw, c.get("requestId"), "chat"),
  );
  app.post(
    "/v1/completions",
    (c) => completions(core, c.req.raw, c.get("requestId"), "completions"),
  );
  app.post(
    "/v1/embeddings",
    (c) => embeddings(core, c.req.raw, c.get("requestId")),
  );
  app.post(
    "/v1/messages",
    (c) => messages(core, c.req.raw, c.get("requestId")),
  );
  app.post(
    "/v1/messages/count_tokens",
    (c) => countTokens(core, c.req.raw, c.get("requestId")),
  );
  app.post(
    "/v1/responses",
    (c) => createResponse(core, c.req.raw, c.get("requestId")),
  );
  app.post(
    "/v1/responses/input_tokens",
    (c) => countInputTokens(core, c.req.raw, c.get("requestId")),
  );
  app.get(
    "/v1/responses/:id",
    (c) =>
      retrieveResponse(core, c.req.raw, c.get("requestId"), c.req.param("id")),
  );
  app.delete(
    "/v1/responses/:id",
    (c) => deleteStored(core, c.req.raw, c.get("requestId"), c.req.param("id")),
  );
  app.all(
    "/v1/*",
    (c) =>
      new OpenAIError(
        404,
        "unknown_url",
        `Unknown request URL: ${c.req.method} ${
          new URL(c.req.url).pathname.slice(0, 200)
        }`,
      )
        .toResponse({ "x-request-id": c.get("requestId") }),
  );
  app.get("/metrics", async (c) => {
    if (
      !(await metricsAllowed(
        deps.store,
        c.req.raw,
        clientIp(c.env),
        deps.config.metricsAllow,
      ))
    ) {
      return c.text("Forbidden\n", 403, {
        "x-request-id": c.get("requestId"),
      });
    }
    const body = core.metrics.render(
      deps.fleet,
      (id) => core.router.inFlight(id),
      core.router.queued,
    );
    return c.body(body, 200, {
      "content-type": "text/plain; version=0.0.4; charset=utf-8",
      "x-request-id": c.get("requestId"),
    });
  });
  app.onError((e, c) => {
    core.log.error("unhandled gateway error", {
      requestId: c.get("requestId"),
      error: String(e),
    });
    return new OpenAIError(
      500,
      "internal_error",
      "The gateway failed to handle the request",
      { type: "server_error" },
    )
      .toResponse({ "x-request-id": c.get("requestId") ?? "" });
  });
  return {
    app: app as unknown as Hono,
    core,
    idle: () => core.idle(),
    start: () => core.start(),
    close: () => core.close(),
    stopCalls: () => core.upstream.stop(),
  };
}

/** The gateway's Hono app (routes `/v1/*` and `/metrics`), mounted at the root. */
export function createGatewayApp(
  deps: AppDeps & { fleet: Fleet },
  opts: GatewayOptions = {},
): Hono {
  return createGateway(deps, opts).app;
}
