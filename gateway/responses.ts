/**
 * OpenAI's Responses API on the chat pipeline, as gateway/anthropic.ts
 * serves Anthropic Messages: `POST /v1/responses` authenticates (scope
 * chat), validates and translates the request (responses_request.ts),
 * resolves the model, admits it against every limit, and calls a node's
 * `/v1/chat/completions` with prefix affinity, failover and cancellation
 * as chat has; the answer comes back as a response object
 * (responses_output.ts) or its events (responses_stream.ts), metered as
 * endpoint "responses". With `store` (the default) the response and the
 * conversation before it are kept per tenant (store/responses.ts) for
 * `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`; another
 * tenant's response is not found (404). Sealed reasoning
 * (responses_reasoning.ts) is opened on the way in and made on the way
 * out. `POST /v1/responses/input_tokens` counts the same translated
 * prompt's tokens without generating.
 *
 * Reported in response headers: `x-orchard-tools-omitted` (built-in tool
 * types left out of the prompt) and `x-orchard-reasoning-effort`
 * (`passed` to an engine that has a reasoning control, or
 * `not_applicable`).
 */
import { tenantRetention } from "../store/retention.ts";
import { OpenAIError, unsupportedParam } from "../protocol/openai/errors.ts";
import {
  DAY_MS,
  deleteResponse,
  loadResponse,
  saveResponse,
  type StoredResponse,
} from "../store/responses.ts";
import { affinityOf } from "./affinity.ts";
import { countPromptTokens, tokenCountHeaders } from "./count_tokens.ts";
import { routeTenant } from "./router.ts";
import type { AuthContext } from "./auth.ts";
import {
  Exchange,
  type GatewayCore,
  type ResolvedModel,
  storeDown,
} from "./core.ts";
import {
  ChunkNormaliser,
  malformed,
  normaliseCompletion,
} from "./normalise.ts";
import { fail, readBody } from "./openai.ts";
import {
  itemId,
  outputOf,
  responseObject,
  type ResponseShell,
  responseUsage,
} from "./responses_output.ts";
import {
  chatMessages,
  type Item,
  parseResponses,
  RESPONSE_ID,
  type ResponsesRequest,
} from "./responses_request.ts";
import {
  hasSealed,
  openReasoning,
  reasoningKey,
  sealReasoning,
} from "./responses_reasoning.ts";
import { ResponsesSink } from "./responses_stream.ts";
import { effortReaches } from "./effort.ts";
import { flatName } from "./responses_tools.ts";
import { relayStream } from "./stream.ts";
import { parseChat } from "./validate.ts";

function notFound(id: string): OpenAIError {
  return new OpenAIError(
    404,
    null,
    `Response with id '${id.slice(0, 160)}' not found.`,
    { type: "invalid_request_error" },
  );
}

/** A tenant's stored response (null when there is none); 503 when KV fails. */
async function load(
  core: GatewayCore,
  tenantId: string,
  id: string,
): Promise<StoredResponse | null> {
  if (!RESPONSE_ID.test(id)) return null;
  try {
    return await loadResponse(core.deps.store, tenantId, id);
  } catch (e) {
    throw storeDown(e);
  }
}

function json(
  body: unknown,
  headers: Record<string, string>,
): Response {
  return new Response(JSON.stringify(body), {
    headers: { "content-type": "application/json", ...headers },
  });
}

/** Reasoning tokens of a chat usage object (0 when it does not say). */
function reasoningTokens(usage: unknown): number {
  const n = (usage as {
    completion_tokens_details?: { reasoning_tokens?: unknown };
  } | null)?.completion_tokens_details?.reasoning_tokens;
  return Number.isSafeInteger(n) && (n as number) >= 0 ? n as number : 0;
}

/**
 * A response's output as items of the next turn's conversation: messages'
 * text, function calls (the model's flat names again, without ids,
 * statuses and logprobs) and reasoning as its text.
 */
function turn(output: Item[]): Item[] {
  const out: Item[] = [];
  for (const item of output) {
    if (item.type === "message") {
      out.push({
        type: "message",
        role: "assistant",
        content: (item.content as Item[]).map((p) =>
          p.type === "output_text"
            ? { type: "output_text", text: p.text, annotations: [] }
            : p
        ),
      });
    } else if (item.type === "function_call") {
      const { call_id, name, namespace, arguments: args } = item;
      out.push({
        type: "function_call",
        call_id,
        name: typeof namespace === "string"
          ? flatName(namespace, name as string)
          : name,
        arguments: args,
      });
    } else if (item.type === "reasoning") {
      const parts = [
        ...(item.content as Item[] ?? []),
        ...(item.summary as Item[] ?? []),
      ];
      const text = parts.map((p) => p.text).join("");
      if (text) out.push({ type: "reasoning", text });
    }
  }
  return out;
}

/** What a Responses request becomes: the chat body for a node and the conversation. */
interface Translated {
  body: Record<string, unknown>;
  /** The conversation: earlier turns' items, then this request's. */
  items: Item[];
  /** The reasoning key, when reasoning is sealed or opened. */
  key: Uint8Array | null;
}

/**
 * Translates a validated Responses request into a chat body: loads the
 * earlier turns (`previous_response_id`), opens sealed reasoning, and
 * gives `reasoning.effort` its local meaning (see `effortReaches`).
 */
async function translate(
  core: GatewayCore,
  ctx: AuthContext,
  r: ResponsesRequest,
  m: ResolvedModel,
): Promise<Translated> {
  let history: Item[] = [];
  if (r.previousId) {
    const prev = await load(core, ctx.tenant.id, r.previousId);
    if (!prev) {
      throw new OpenAIError(
        404,
        "previous_response_not_found",
        `Previous response with id '${r.previousId}' not found.`,
        { param: "previous_response_id", type: "invalid_request_error" },
      );
    }
    history = [...prev.input, ...turn(prev.response.output as Item[])];
  }
  const key = r.encrypted || hasSealed(r.input)
    ? await reasoningKey(core.deps.store)
    : null;
  const input = key && hasSealed(r.input)
    ? await openReasoning(key, ctx.tenant.id, r.input)
    : r.input;
  const items = [...history, ...input];
  const body: Record<string, unknown> = {
    ...r.chat,
    model: m.id,
    messages: chatMessages(r.instructions, items, input.length),
    stream: r.stream,
  };
  if (r.effort !== null && effortReaches(core, m.id)) {
    body.reasoning_effort = r.effort;
  }
  return { body, items, key };
}

/** The headers that report how hints were taken (see the module comment). */
function reportHeaders(
  r: ResponsesRequest,
  body: Record<string, unknown>,
): Record<string, string> {
  const h: Record<string, string> = {};
  if (r.omitted.length > 0) h["x-orchard-tools-omitted"] = r.omitted.join(", ");
  if (r.effort !== null) {
    h["x-orchard-reasoning-effort"] = body.reasoning_effort === undefined
      ? "not_applicable"
      : "passed";
  }
  return h;
}

/** `POST /v1/responses`. */
export async function createResponse(
  core: GatewayCore,
  req: Request,
  requestId: string,
): Promise<Response> {
  const ex = new Exchange(core, requestId, "responses");
  let paths: string[] = [];
  try {
    const ctx = await ex.authenticate(req, "chat");
    const r = parseResponses(await readBody(core, req));
    paths = r.toolPaths;
    const m = core.resolveModel(ctx, r.model, "chat");
    const { body, items, key } = await translate(core, ctx, r, m);
    const p = parseChat(body);
    ex.model = m.id; // metered from here on, as chat is once validated
    const cap = await ex.admit(ctx, p, m);
    const unclamped = p.maxTokens ?? m.contextLength;
    if (unclamped === null || cap < unclamped) body.max_tokens = cap;
    if (p.stream) body.stream_options = { include_usage: true };
    const up = await core.upstream.call(
      m.id,
      "/v1/chat/completions",
      JSON.stringify(body),
      p.stream,
      req.signal,
      requestId,
      affinityOf(body),
      routeTenant(ctx),
    );
    ex.routed(up.slot, up.notes);
    const shell: ResponseShell = {
      id: itemId("resp_"),
      createdAt: Math.floor(ex.startedAt / 1000),
      model: m.id,
      echo: r.echo,
      names: r.names,
      summary: r.summary,
      seal: key && r.encrypted
        ? (text) => sealReasoning(key, ctx.tenant.id, text)
        : null,
    };
    const tenantId = ctx.tenant.id;
    // kept for the tenant's retention period (store/retention.ts)
    const save = r.store
      ? async (response: Record<string, unknown>) =>
        saveResponse(
          core.deps.store,
          tenantId,
          shell.id,
          {
            response,
            input: items,
          },
          (await tenantRetention(core.deps.store, tenantId)).responses * DAY_MS,
        )
      : null;
    ex.report(reportHeaders(r, body));
    const headers = { ...ex.headers, "x-request-id": requestId };
    if (up.kind === "stream") {
      return relayStream(
        ex,
        up,
        new ResponsesSink(new ChunkNormaliser("chat", m.id), ex, shell, save),
        headers,
      );
    }
    up.close();
    if (p.stream) throw malformed("stream (not text/event-stream)");
    const n = normaliseCompletion(up.json, "chat", m.id);
    ex.firstToken();
    ex.bill(n.reported, n.counted, Math.ceil(n.counted / 4));
    const { output, ending } = await outputOf(up.json, shell);
    const response = responseObject(shell, {
      status: ending.status,
      output,
      usage: responseUsage(ex, reasoningTokens(up.json.usage)),
      reason: ending.reason,
    });
    ex.finish();
    if (save) {
      try {
        await save(response);
      } catch (e) {
        response.store = false; // said, not pretended
        core.log.error("a response was not stored", {
          requestId,
          error: String(e),
        });
      }
    }
    return json(response, {
      ...headers,
      ...(ex.usageBasis ? { "x-orchard-usage": ex.usageBasis } : {}),
    });
  } catch (e) {
    return fail(ex, e instanceof OpenAIError ? inResponsesTerms(e, paths) : e);
  }
}

/**
 * `POST /v1/responses/input_tokens`: the tokens of the prompt the same
 * request to `/v1/responses` would send, counted as
 * `/v1/messages/count_tokens` counts them: rendered and tokenized by a node
 * serving the model, exactly as it would be billed, or estimated when no
 * node can count (`x-orchard-token-count` says which):
 * `{"object":"response.input_tokens","input_tokens":N}`.
 */
export async function countInputTokens(
  core: GatewayCore,
  req: Request,
  requestId: string,
): Promise<Response> {
  const ex = new Exchange(core, requestId, "responses");
  let paths: string[] = [];
  try {
    const ctx = await ex.authenticate(req, "chat");
    const r = parseResponses(await readBody(core, req));
    paths = r.toolPaths;
    const m = core.resolveModel(ctx, r.model, "chat");
    const { body } = await translate(core, ctx, { ...r, stream: false }, m);
    const p = parseChat(body);
    const n = await countPromptTokens(core, {
      model: m.id,
      body: p.body,
      estimate: p.prompt.estimate,
      tenantId: ctx.tenant.id,
      signal: req.signal,
      requestId,
    });
    return json(
      { object: "response.input_tokens", input_tokens: n.tokens },
      {
        ...reportHeaders(r, body),
        ...tokenCountHeaders(n),
        "x-request-id": requestId,
      },
    );
  } catch (e) {
    return fail(ex, e instanceof OpenAIError ? inResponsesTerms(e, paths) : e);
  }
}

/** Chat params (of the translated request, or a node's 400) → the Responses params they came from. */
const PARAMS: [RegExp, string][] = [
  [/^tools\[(\d+)\]\.function\./, "tools[$1]."], // (paths: see inResponsesTerms)
  [/^tool_choice\.function\.name$/, "tool_choice.name"],
  [/^response_format\.json_schema\b/, "text.format"],
  [/^response_format\b/, "text.format"],
  [/^max_tokens$/, "max_output_tokens"],
  [/^reasoning_effort$/, "reasoning.effort"],
  [/^logprobs$/, "include"],
  [/^messages$/, "input"], // too many, with the earlier turns
];

/**
 * A 400 about a chat param, renamed to the Responses param it came from;
 * a chat tool's index becomes its path in the request (`toolPaths`:
 * namespaces flattened and built-in tools left out move the indices).
 */
function inResponsesTerms(
  e: OpenAIError,
  toolPaths: readonly string[] = [],
): OpenAIError {
  const param = e.param;
  if (e.status !== 400 || param === null) return e;
  for (const [re, to] of PARAMS) {
    if (!re.test(param)) continue;
    const tool = /^tools\[(\d+)\]\.function\./.exec(param);
    const renamed = tool
      ? param.replace(
        tool[0],
        `${toolPaths[Number(tool[1])] ?? `tools[${tool[1]}]`}.`,
      )
      : param.replace(re, to);
    return new OpenAIError(
      e.status,
      e.code,
      e.message.replaceAll(param, renamed),
      { type: e.type, param: renamed, headers: e.headers },
    );
  }
  return e;
}

/** Refuses query parameters that ask for what is not served (a replayed stream). */
function checkQuery(req: Request): void {
  for (const [key, value] of new URL(req.url).searchParams) {
    if (key === "stream" && value === "false") continue;
    throw unsupportedParam(
      key.slice(0, 64),
      `${
        key.slice(0, 64)
      } is not supported: a stored response is returned whole`,
    );
  }
}

/** `GET /v1/responses/{id}`: a stored response of the key's tenant. */
export async function retrieveResponse(
  core: GatewayCore,
  req: Request,
  requestId: string,
  id: string,
): Promise<Response> {
  const ex = new Exchange(core, requestId, "responses");
  try {
    const ctx = await ex.authenticate(req, "chat");
    checkQuery(req);
    const stored = await load(core, ctx.tenant.id, id);
    if (!stored) throw notFound(id);
    return json(stored.response, { "x-request-id": requestId });
  } catch (e) {
    return fail(ex, e);
  }
}

/** `DELETE /v1/responses/{id}`. */
export async function deleteStored(
  core: GatewayCore,
  req: Request,
  requestId: string,
  id: string,
): Promise<Response> {
  const ex = new Exchange(core, requestId, "responses");
  try {
    const ctx = await ex.authenticate(req, "chat");
    let deleted = false;
    if (RESPONSE_ID.test(id)) {
      try {
        deleted = await deleteResponse(core.deps.store, ctx.tenant.id, id);
      } catch (e) {
        throw storeDown(e);
      }
    }
    if (!deleted) throw notFound(id);
    return json(
      { id, object: "response", deleted: true },
      { "x-request-id": requestId },
    );
  } catch (e) {
    return fail(ex, e);
  }
}
