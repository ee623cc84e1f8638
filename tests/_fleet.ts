/**
 * Set-up for fleet and node tests: a real gateway (node-facing API, nodes
 * admin API, fleet registry) served on loopback over an in-memory KV, and a
 * scripted OpenAI-compatible upstream that behaves like Exo.
 */
import { Hono } from "hono";
import { testConfig } from "../config.ts";
import { createNodesAdminApi } from "../fleet/admin_api.ts";
import { createNodeFacingApi } from "../fleet/node_api.ts";
import { createFleet, type FleetRegistry } from "../fleet/registry.ts";
import { createReachability } from "../fleet/reachability.ts";
import type { AdminEnv } from "../routes/_env.ts";
import { errorBody } from "../routes/api/_json.ts";
import { ServiceError } from "../store/errors.ts";
import type { Principal } from "../store/principal.ts";
import { createStore, type Store } from "../store/store.ts";
import { log } from "../lib/log.ts";
import { parseSSE, sseFrame } from "../lib/sse.ts";
import { QUIRKS } from "./fixtures/upstream_quirks.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");
log.reload();

/** A platform admin, and a tenant admin (sent with `x-test-as: tenant`). */
export const ADMIN: Principal = {
  kind: "user",
  id: "admin-1",
  label: "root@example.com",
  role: "platform_admin",
  tenantId: null,
  ip: "127.0.0.1",
};
const TENANT_ADMIN: Principal = {
  ...ADMIN,
  id: "tadmin-1",
  role: "tenant_admin",
  tenantId: "t1",
};

/** A running gateway for tests. */
export interface TestGateway {
  url: string;
  kv: Deno.Kv;
  store: Store;
  fleet: FleetRegistry;
  /** Calls the nodes admin API. */
  admin(
    method: string,
    path: string,
    body?: unknown,
    as?: "tenant",
  ): Promise<Response>;
  close(): Promise<void>;
}

/**
 * Starts a gateway on 127.0.0.1 with a random port. Its public URL (in
 * join commands) is "http://gw", or its own URL with `ownPublicUrl`.
 */
export async function startGateway(
  opts: { allowPrivateNodeUrls?: boolean; ownPublicUrl?: boolean } = {},
): Promise<TestGateway> {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const fleet = createFleet({ store, refreshMs: 25 });
  const reachability = createReachability({ store, retryMs: 500 });
  const publicConfig = { publicUrl: "http://gw" };
  const app = new Hono();
  let url = "";
  const config = testConfig({
    allowPrivateNodeUrls: opts.allowPrivateNodeUrls ?? false,
  });
  const admin = new Hono<AdminEnv>();
  admin.use("*", async (c, next) => {
    c.set("principal", c.req.header("x-test-as") ? TENANT_ADMIN : ADMIN);
    await next();
  });
  admin.route(
    "/",
    createNodesAdminApi({ store, fleet, config: publicConfig }),
  );
  app.route("/api/admin/v1", admin as unknown as Hono);
  app.route(
    "/api/node/v1",
    createNodeFacingApi({ store, config, reachability }),
  );
  app.onError((err, c) => {
    if (err instanceof ServiceError) {
      return c.json(errorBody(err), err.status as 400);
    }
    return c.json({ error: { message: String(err) } }, 500);
  });
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: () => {} },
    app.fetch,
  );
  url = `http://127.0.0.1:${server.addr.port}`;
  if (opts.ownPublicUrl) publicConfig.publicUrl = url;
  return {
    url,
    kv,
    store,
    fleet,
    admin: (method, path, body, as) =>
      Promise.resolve(app.request(`/api/admin/v1${path}`, {
        method,
        headers: {
          ...(body === undefined ? {} : { "content-type": "application/json" }),
          ...(as ? { "x-test-as": as } : {}),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      })),
    async close() {
      await fleet.close();
      await reachability.close();
      await server.shutdown();
      kv.close();
    },
  };
}

/** Creates a join token through the admin API; returns the token. */
export async function joinToken(
  gw: TestGateway,
  body: Record<string, unknown> = {},
): Promise<string> {
  const res = await gw.admin("POST", "/join-tokens", body);
  if (res.status !== 201) throw new Error(`join token: ${res.status}`);
  return (await res.json()).token;
}

/** Polls `check` until it returns a truthy value or `ms` pass. */
export async function until<T>(
  what: string,
  check: () => T | Promise<T>,
  ms = 3000,
): Promise<T> {
  const deadline = Date.now() + ms;
  while (true) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A scripted Exo-like upstream and what it saw. */
export interface FakeUpstream {
  url: string;
  /** Bodies of non-probe generation requests, in order. */
  requests: Record<string, unknown>[];
  /** Resolves the next `hold` request (see below). */
  release(): void;
  /** Resolves when a `hold` request has started streaming (or a `hold-head` one arrived). */
  held: Promise<void>;
  /** `hold` and `hold-head` requests open: started, not yet answered or closed by the caller. */
  holding: number;
  /** The model ids `GET /v1/models` lists (change it to change the listing). */
  models: string[];
  /** Extra fields of a model's listing entry, by id (Exo's `hugging_face_id`, …). */
  listing: Record<string, Record<string, unknown>>;
  /** Listed models that answer 404 "not running" (default: `ghost-model`). */
  unservable: Set<string>;
  /** Model ids of the chat probes (1-token requests), in order. */
  probes: string[];
  /** `GET /v1/models` calls so far (a refresh of the engine makes one). */
  listings: number;
  /** The client ports generation requests came from: one per TCP connection. */
  peers: Set<number>;
  close(): Promise<void>;
}

const enc = new TextEncoder();

/**
 * An upstream reproducing Exo's quirks: it lists a model it is not running
 * (`ghost-model`, which answers 404 with an integer error code; `models`,
 * `listing` and `unservable` change what it lists and serves, `probes` and
 * `listings` say what the engine asked), stamps each listing's `created`
 * anew, labels
 * stream chunks `chat.completion`, attaches usage to the last content chunk,
 * and gives no usage at all on legacy completions. A chat message "hold"
 * streams one chunk and waits for `release()`, "hold-head" waits for it
 * before answering anything (a long prefill); a chat whose first message
 * names a scripted quirk (tests/fixtures/upstream_quirks.ts: "exo-v1",
 * "mlx-2025", …) gets that server's answer.
 */
export function startFakeUpstream(
  opts: {
    models?: string[];
    /**
     * Answer as an Exo node: `GET /node_id` with `nodeId`, `GET /state`
     * with `state()` (tests/_exo_state.ts builds Exo 1.0's shapes).
     */
    exo?: { nodeId: string; state: () => unknown };
  } = {},
): FakeUpstream {
  const requests: Record<string, unknown>[] = [];
  let releaseHold = () => {};
  let heldStarted = () => {};
  const held = new Promise<void>((r) => heldStarted = r);
  const gate = new Promise<void>((r) => releaseHold = r);
  /** Counts a held request open; the returned function marks it ended (false if it already was). */
  const holding = () => {
    fake.holding++;
    let open = true;
    return () => {
      if (!open) return false;
      open = false;
      fake.holding--;
      return true;
    };
  };
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: () => {} },
    async (req, info) => {
      const path = new URL(req.url).pathname;
      if (req.method === "GET" && path === "/v1/models") {
        const n = ++fake.listings;
        return Response.json({
          object: "list",
          data: fake.models.map((id) => ({
            id,
            object: "model",
            created: 1_700_000_000 + n, // stamped at each call, as mlx_lm.server does
            ...fake.listing[id],
          })),
        });
      }
      if (req.method === "GET" && opts.exo && path === "/node_id") {
        return Response.json(opts.exo.nodeId);
      }
      if (req.method === "GET" && opts.exo && path === "/state") {
        return Response.json(opts.exo.state());
      }
      if (req.method === "GET") {
        return new Response("not found", { status: 404 });
      }
      const body = await req.json();
      if (body.max_tokens === 1 && path === "/v1/chat/completions") {
        fake.probes.push(String(body.model));
      }
      if (
        fake.unservable.has(body.model) || !fake.models.includes(body.model)
      ) {
        return Response.json({
          error: { message: `Model ${body.model} is not running`, code: 404 },
        }, { status: 404 });
      }
      if (path === "/v1/embeddings") {
        if (!/embed/.test(body.model)) {
          return Response.json({ detail: "not an embedding model" }, {
            status: 400,
          });
        }
        const inputs = Array.isArray(body.input) ? body.input : [body.input];
        return Response.json({
          data: inputs.map((_: unknown, i: number) => ({
            embedding: [0.5, -1, 0.25],
            index: i,
          })),
          usage: { prompt_tokens: 3, total_tokens: 3 },
        });
      }
      if (/embed/.test(body.model)) {
        return Response.json({
          error: { message: "embedding only", code: 400 },
        }, {
          status: 400,
        });
      }
      if (body.max_tokens !== 1) {
        requests.push(body);
        fake.peers.add((info.remoteAddr as Deno.NetAddr).port);
      }
      if (body.messages?.[0]?.content === "bad") {
        return Response.json(
          { error: { message: "prompt too long", code: 400 } },
          { status: 400 },
        );
      }
      const first = String(body.messages?.[0]?.content);
      const quirk = Object.hasOwn(QUIRKS, first) ? QUIRKS[first] : undefined;
      if (quirk && path === "/v1/chat/completions") {
        if (!body.stream) return Response.json(quirk.json(body.model));
        const frames = quirk.stream(body.model).map((j) => JSON.stringify(j));
        return sse([...frames, "[DONE]"]);
      }
      const hold = body.messages?.[0]?.content === "hold";
      if (body.messages?.[0]?.content === "hold-head") {
        const ended = holding();
        req.signal.addEventListener("abort", () => ended());
        heldStarted();
        await gate;
        if (!ended()) return new Response(null, { status: 499 });
      }
      if (path === "/v1/completions") {
        const chunks = ["Hello", " world"].map((t, i) => ({
          id: "cmpl-1",
          object: "text_completion",
          created: 1,
          model: body.model,
          choices: [{ text: t, index: 0, finish_reason: i ? "stop" : null }],
        }));
        return sse([...chunks.map((c) => JSON.stringify(c)), "[DONE]"]);
      }
      if (!body.stream) {
        return Response.json({
          id: "chatcmpl-x",
          object: "chat.completion",
          created: 1,
          model: body.model,
          choices: [{ message: { role: "assistant", content: "Hi there" } }],
          usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 },
        });
      }
      const chunk = (content: string, extra: Record<string, unknown> = {}) =>
        JSON.stringify({
          id: "chatcmpl-s",
          object: "chat.completion", // Exo's label
          created: 2,
          model: body.model,
          choices: [{
            index: 0,
            delta: { role: "assistant", content },
            finish_reason: extra.finish ?? null,
          }],
          ...(extra.usage ? { usage: extra.usage } : {}),
        });
      const last = chunk(" there", {
        finish: "stop",
        usage: { prompt_tokens: 4, completion_tokens: 2, total_tokens: 6 },
      });
      if (first === "late-end") {
        // Every event at once, the body's end 20 ms later (as a server
        // that writes the chunked terminator on its own does).
        return new Response(
          new ReadableStream({
            async start(ctl) {
              ctl.enqueue(enc.encode(
                [chunk("Hi"), last, "[DONE]"].map((d) => sseFrame(d)).join(""),
              ));
              await new Promise((r) => setTimeout(r, 20));
              ctl.close();
            },
          }),
          { headers: { "content-type": "text/event-stream" } },
        );
      }
      if (!hold) return sse([chunk("Hi"), last, "[DONE]"]);
      const ended = holding();
      return new Response(
        new ReadableStream({
          async start(ctl) {
            ctl.enqueue(enc.encode(sseFrame(chunk("Hi"))));
            heldStarted();
            await gate;
            if (!ended()) return;
            ctl.enqueue(enc.encode(sseFrame(last) + sseFrame("[DONE]")));
            ctl.close();
          },
          cancel: () => void ended(),
        }),
        { headers: { "content-type": "text/event-stream" } },
      );
    },
  );
  const fake: FakeUpstream = {
    url: `http://127.0.0.1:${server.addr.port}`,
    requests,
    release: () => releaseHold(),
    held,
    holding: 0,
    models: opts.models ?? ["tiny-chat", "ghost-model", "nomic-embed"],
    listing: {},
    unservable: new Set(["ghost-model"]),
    probes: [],
    listings: 0,
    peers: new Set(),
    close: async () => {
      releaseHold();
      await server.shutdown();
    },
  };
  return fake;
}

function sse(items: string[]): Response {
  return new Response(items.map((d) => sseFrame(d)).join(""), {
    headers: { "content-type": "text/event-stream" },
  });
}

/** Reads an SSE body into its events' `data` and its comment lines. */
export async function readSse(
  res: Response,
): Promise<{ data: string[]; comments: string[] }> {
  const comments: string[] = [];
  const data = parseSSE(await res.text(), {
    onComment: (c) => comments.push(`:${c}`),
  }).map((e) => e.data);
  return { data, comments };
}
