/**
 * Test support (folder-private): a scripted OpenAI-compatible upstream on
 * loopback standing in for an external node engine, a small `Fleet` over
 * such upstreams, and a world with a tenant, keys and a served gateway.
 */
import { affinityOf, nodeHash, rendezvous } from "./affinity.ts";
import { type Config, testConfig } from "../config.ts";
import { parseSSE, sseFrame } from "../lib/sse.ts";
import type {
  Fleet,
  NodeTarget,
  NodeView,
  ServedModel,
} from "../fleet/types.ts";
import type { EngineModel } from "../protocol/engine.ts";
import { createApiKey } from "../store/api_keys.ts";
import type { Limits } from "../store/limits.ts";
import { setTenantLimits } from "../store/limits.ts";
import { SYSTEM } from "../store/principal.ts";
import { createStore, type Store } from "../store/store.ts";
import { createTenant, type Tenant } from "../store/tenants.ts";
import { silentLogger } from "../lib/log.ts";
import { createGateway, type Gateway, type GatewayOptions } from "./mod.ts";

/** How the scripted engine answers a request. */
export interface Script {
  /** Words streamed (one chunk each); default ["Hello", " world", "!"]. */
  words?: string[];
  /** Milliseconds between chunks. */
  delayMs?: number;
  /** Error the connection after this many content chunks (simulates a killed node). */
  killAfter?: number;
  /** Stop sending (but keep the connection open) after this many chunks. */
  stallAfter?: number;
  /** Answer with this status and OpenAI error body instead. */
  status?: number;
  /** The `param` of that error body (none when absent). */
  errorParam?: string;
  /** That error's code and message (default "scripted", "scripted failure"). */
  error?: { code: string; message: string };
  /** Headers of a 200 answer (an engine's notes, e.g. x-orchard-tool-grammar). */
  headers?: Record<string, string>;
  /** Wait before the first chunk (prefill). */
  prefillMs?: number;
  /** Send a tool call instead of words (id missing on purpose when `toolIdMissing`). */
  toolCall?: { name: string; args: string; idMissing?: boolean };
  /** Reasoning text (`reasoning_content`) before the answer, as reasoning engines send it. */
  reasoning?: string;
  /** Label chunks `chat.completion` and attach usage to content chunks (Exo quirks). */
  exoQuirks?: boolean;
}

/** A loopback server speaking OpenAI shapes under a script. */
export interface ScriptedUpstream {
  url: string;
  /** Requests received, with their parsed bodies. */
  requests: { path: string; body: Record<string, unknown> }[];
  /** Requests whose connection was aborted by the caller. */
  aborted: number;
  /** Request ids the gateway cancelled (`DELETE /orchard/requests/{id}`). */
  cancels: string[];
  /** The client ports requests came from: one per TCP connection the gateway opened. */
  peers: Set<number>;
  script: Script;
  close(): Promise<void>;
}

const enc = new TextEncoder();

/** Starts a scripted upstream. */
export function scriptedUpstream(script: Script = {}): ScriptedUpstream {
  const up: ScriptedUpstream = {
    url: "",
    requests: [],
    aborted: 0,
    cancels: [],
    peers: new Set(),
    script,
    close: async () => {},
  };
  const server = Deno.serve(
    {
      port: 0,
      hostname: "127.0.0.1",
      onListen() {},
      // A scripted kill errors the response stream on purpose; without
      // this, Deno's server prints each one's stack to the test output.
      onError: () => new Response(null, { status: 500 }),
    },
    async (req, info) => {
      up.peers.add((info.remoteAddr as Deno.NetAddr).port);
      const path = new URL(req.url).pathname;
      if (req.method === "DELETE" && path.startsWith("/orchard/requests/")) {
        up.cancels.push(decodeURIComponent(path.slice(18)));
        return new Response(null, { status: 204 });
      }
      const body = await req.json().catch(() => ({}));
      up.requests.push({ path, body });
      const s = up.script;
      if (s.status) {
        return Response.json({
          error: {
            message: s.error?.message ??
              `scripted failure${s.errorParam ? ` of ${s.errorParam}` : ""}`,
            type: "server_error",
            code: s.error?.code ?? "scripted",
            ...(s.errorParam ? { param: s.errorParam } : {}),
          },
        }, {
          status: s.status,
        });
      }
      const words = s.words ?? ["Hello", " world", "!"];
      const prompt = 7;
      if (path === "/v1/embeddings") {
        const inputs =
          Array.isArray(body.input) && typeof body.input[0] !== "number"
            ? body.input.length
            : 1;
        return Response.json({
          object: "list",
          model: body.model,
          data: Array.from(
            { length: inputs },
            (_, i) => ({
              object: "embedding",
              index: i,
              embedding: [0.5, -1, 0.25],
            }),
          ),
          usage: { prompt_tokens: 3 * inputs, total_tokens: 3 * inputs },
        });
      }
      const chat = path === "/v1/chat/completions";
      if (!body.stream) {
        return Response.json(
          chat
            ? {
              id: "chatcmpl-x",
              object: "chat.completion",
              created: 1,
              model: body.model,
              choices: [{
                index: 0,
                message: {
                  role: "assistant",
                  content: words.join(""),
                  ...(s.reasoning ? { reasoning_content: s.reasoning } : {}),
                },
                finish_reason: "stop",
              }],
              usage: {
                prompt_tokens: prompt,
                completion_tokens: words.length,
                total_tokens: prompt + words.length,
              },
            }
            : {
              id: "cmpl-x",
              object: "text_completion",
              created: 1,
              model: body.model,
              choices: [{
                index: 0,
                text: words.join(""),
                finish_reason: "stop",
              }],
              usage: {
                prompt_tokens: prompt,
                completion_tokens: words.length,
                total_tokens: prompt + words.length,
              },
            },
          { headers: s.headers },
        );
      }
      const object = s.exoQuirks
        ? "chat.completion"
        : chat
        ? "chat.completion.chunk"
        : "text_completion";
      const chunk = (
        choice: Record<string, unknown>,
        extra: Record<string, unknown> = {},
      ) =>
        sseFrame({
          id: "up-1",
          object,
          created: 1,
          model: body.model,
          choices: [choice],
          ...extra,
        });
      const frames: string[] = [];
      if (chat) {
        frames.push(
          chunk({
            index: 0,
            delta: { role: "assistant", content: "" },
            finish_reason: null,
          }),
        );
      }
      if (chat && s.reasoning) {
        frames.push(chunk({
          index: 0,
          delta: { reasoning_content: s.reasoning },
          finish_reason: null,
        }));
      }
      if (s.toolCall) {
        const t = s.toolCall;
        frames.push(chunk({
          index: 0,
          delta: {
            tool_calls: [{
              index: 0,
              ...(t.idMissing ? {} : { id: "call_1", type: "function" }),
              function: { name: t.name, arguments: "" },
            }],
          },
          finish_reason: null,
        }));
        frames.push(
          chunk({
            index: 0,
            delta: {
              tool_calls: [{ index: 0, function: { arguments: t.args } }],
            },
            finish_reason: null,
          }),
        );
      } else {
        words.forEach((w, i) => {
          const extra = s.exoQuirks
            ? {
              usage: {
                prompt_tokens: prompt,
                completion_tokens: i + 1,
                total_tokens: prompt + i + 1,
              },
            }
            : {};
          frames.push(
            chat
              ? chunk(
                { index: 0, delta: { content: w }, finish_reason: null },
                extra,
              )
              : chunk({ index: 0, text: w, finish_reason: null }),
          );
        });
      }
      frames.push(
        chat
          ? chunk({
            index: 0,
            delta: {},
            finish_reason: s.toolCall ? "tool_calls" : "stop",
          })
          : chunk({ index: 0, text: "", finish_reason: "stop" }),
      );
      const n = s.toolCall ? 2 : words.length;
      frames.push(
        sseFrame({
          id: "up-1",
          object,
          created: 1,
          model: body.model,
          choices: [],
          usage: {
            prompt_tokens: prompt,
            completion_tokens: n,
            total_tokens: prompt + n,
          },
        }),
      );
      frames.push(sseFrame("[DONE]"));
      const contentStart = chat ? 1 : 0;
      let timer: ReturnType<typeof setTimeout> | undefined;
      let closed = false;
      const stream = new ReadableStream<Uint8Array>({
        async start(c) {
          const wait = (ms: number) =>
            new Promise<void>((r) => (timer = setTimeout(r, ms)));
          if (s.killAfter === 0) {
            c.error(new Error("killed"));
            return;
          }
          if (s.prefillMs) await wait(s.prefillMs);
          for (let i = 0; i < frames.length && !closed; i++) {
            const sent = i - contentStart;
            if (s.killAfter !== undefined && sent >= s.killAfter) {
              c.error(new Error("killed"));
              return;
            }
            if (s.stallAfter !== undefined && sent >= s.stallAfter) return; // never closes
            c.enqueue(enc.encode(frames[i]!));
            if (s.delayMs) await wait(s.delayMs);
          }
          if (!closed) c.close();
        },
        cancel() {
          closed = true;
          clearTimeout(timer);
          up.aborted++;
        },
      });
      return new Response(stream, {
        headers: { "content-type": "text/event-stream", ...s.headers },
      });
    },
  );
  up.url = `http://127.0.0.1:${server.addr.port}`;
  up.close = async () => {
    await server.shutdown();
  };
  return up;
}

/** A fleet over fixed nodes (each an upstream URL); `fetchNode` calls the URL directly. */
export class StaticFleet implements Fleet {
  readonly list: NodeView[] = [];
  nodes(): NodeView[] {
    return this.list;
  }
  aliases = new Map<string, string>();

  /** Adds a node serving `models` with `slots` slots. */
  add(id: string, url: string, models: EngineModel[], slots = 8): NodeView {
    const n: NodeView = {
      id,
      name: id,
      url,
      engine: "openai",
      state: "healthy",
      models,
      stats: {
        inFlight: 0,
        queued: 0,
        slots,
        tokensPerSecond: 0,
        healthy: true,
      },
      lastHeartbeatAt: new Date().toISOString(),
      enrolledAt: new Date().toISOString(),
      dedicatedTo: null,
    };
    this.list.push(n);
    for (const m of models) {
      for (const a of m.aliases ?? []) this.aliases.set(a, m.id);
    }
    return n;
  }

  hasDedicated(tenantId: string): boolean {
    return this.list.some((n) => n.dedicatedTo === tenantId);
  }

  candidates(model: string): NodeView[] {
    const id = this.resolveModel(model);
    return this.list.filter((n) =>
      n.state === "healthy" &&
      n.models.some((m) => m.id === id && m.servable !== false)
    );
  }

  servedModels() {
    const out = new Map<string, ServedModel & { nodeIds: string[] }>();
    for (const n of this.list) {
      if (n.state !== "healthy") continue;
      for (const m of n.models) {
        if (m.servable === false) continue;
        const e = out.get(m.id) ??
          {
            id: m.id,
            aliases: m.aliases ?? [],
            kind: m.kind,
            contextLength: m.contextLength,
            nodeIds: [] as string[],
          };
        e.nodeIds.push(n.id);
        out.set(m.id, e);
      }
    }
    return [...out.values()];
  }

  resolveModel(model: string): string {
    return this.aliases.get(model) ?? model;
  }

  knownModel(model: string): boolean {
    const id = this.resolveModel(model);
    return this.list.some((n) => n.models.some((m) => m.id === id));
  }

  nodeTarget(nodeId: string): Promise<NodeTarget> {
    const n = this.list.find((x) => x.id === nodeId);
    if (!n) return Promise.reject(new Error(`unknown node ${nodeId}`));
    return Promise.resolve({ url: n.url, headers: {} });
  }

  fetchNode(
    nodeId: string,
    path: string,
    init: RequestInit,
  ): Promise<Response> {
    const n = this.list.find((x) => x.id === nodeId);
    if (!n) return Promise.reject(new Error(`unknown node ${nodeId}`));
    return fetch(n.url + path, init);
  }
}

/** The models the scripted upstream serves by default. */
export const MODELS: EngineModel[] = [
  {
    id: "tiny-chat",
    loaded: true,
    kind: "chat",
    contextLength: 2048,
    aliases: ["tiny"],
  },
  { id: "tiny-embed", loaded: true, kind: "embedding" },
];

/** A gateway over a scripted upstream, served on loopback, with one tenant and key. */
export interface World {
  kv: Deno.Kv;
  store: Store;
  gw: Gateway;
  fleet: StaticFleet;
  up: ScriptedUpstream;
  tenant: Tenant;
  key: string;
  keyId: string;
  /** Base URL of the served gateway (`…/v1` is the OpenAI base URL). */
  url: string;
  /** Creates another key on `tenant` (or a new tenant). */
  newKey(
    input?: Record<string, unknown>,
    tenantId?: string,
  ): Promise<{ key: string; id: string }>;
  /** POSTs JSON with the default key. */
  post(
    path: string,
    body: unknown,
    headers?: Record<string, string>,
  ): Promise<Response>;
  close(): Promise<void>;
}

/** Builds a world; `limits` become the tenant's limits. */
export async function createWorld(
  opts: {
    limits?: Partial<Limits>;
    script?: Script;
    gateway?: GatewayOptions;
    maxBodyBytes?: number;
    /** More configuration (e.g. `kvUrl`: the gateway acts as on a remote KV). */
    config?: Partial<Config>;
    /** Sees the KV before anything uses it (to wrap it in a test double). */
    onKv?: (kv: Deno.Kv) => void;
  } = {},
): Promise<World> {
  const kv = await Deno.openKv(":memory:");
  opts.onKv?.(kv);
  const store = await createStore(kv);
  const tenant = await createTenant(store, SYSTEM, { name: "Acme" });
  if (opts.limits) await setTenantLimits(store, SYSTEM, tenant.id, opts.limits);
  const created = await createApiKey(store, SYSTEM, tenant.id, {
    name: "test",
  });
  const up = scriptedUpstream(opts.script);
  const fleet = new StaticFleet();
  fleet.add("node-a", up.url, MODELS);
  const gw = createGateway(
    {
      store,
      config: testConfig({
        maxBodyBytes: opts.maxBodyBytes ?? 64 * 1024,
        ...opts.config,
      }),
      fleet,
    },
    { logger: silentLogger, ...opts.gateway },
  );
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    gw.app.fetch,
  );
  const url = `http://127.0.0.1:${server.addr.port}`;
  const world: World = {
    kv,
    store,
    gw,
    fleet,
    up,
    tenant,
    key: created.key,
    keyId: created.apiKey.id,
    url,
    async newKey(input = {}, tenantId = tenant.id) {
      const r = await createApiKey(store, SYSTEM, tenantId, {
        name: "k",
        ...input,
      });
      return { key: r.key, id: r.apiKey.id };
    },
    post(path, body, headers = {}) {
      return fetch(url + path, {
        method: "POST",
        headers: {
          authorization: `Bearer ${created.key}`,
          "content-type": "application/json",
          ...headers,
        },
        body: typeof body === "string" ? body : JSON.stringify(body),
      });
    },
    async close() {
      await server.shutdown();
      await gw.idle();
      await up.close();
      kv.close();
    },
  };
  return world;
}

/** Reads an SSE response into its events' `data` and a count of its comments. */
export async function readSSE(
  res: Response,
): Promise<{ data: string[]; comments: number; raw: string }> {
  const raw = await res.text();
  let comments = 0;
  const data = parseSSE(raw, { onComment: () => comments++ }).map((e) =>
    e.data
  );
  return { data, comments, raw };
}

/**
 * Waits until at least `ms` remain in the current UTC minute, so a test of a
 * per-minute window does not straddle two windows (each with its own limit).
 */
export async function awayFromMinuteEdge(ms = 5000): Promise<void> {
  const left = 60_000 - (Date.now() % 60_000);
  if (left < ms) await new Promise((r) => setTimeout(r, left + 50));
}

/**
 * A chat request body whose conversation the router sends to `nodeId`
 * first among `nodeIds` (its prefix affinity: gateway/affinity.ts), for
 * tests that need to know which of equal nodes gets a request.
 */
export function pinnedTo(
  nodeId: string,
  nodeIds: string[],
  body: { model: string } & Record<string, unknown>,
): Record<string, unknown> {
  for (let i = 0;; i++) {
    const messages = [{ role: "user", content: `Hi ${i}` }];
    const a = affinityOf({ model: body.model, messages })!;
    const best = nodeIds.reduce((x, y) =>
      rendezvous(a, nodeHash(y)) > rendezvous(a, nodeHash(x)) ? y : x
    );
    if (best === nodeId) return { ...body, messages };
  }
}
