/**
 * What Codex CLI's Responses requests need beyond plain function tools:
 * namespace tools flattened for the model and restored on its calls,
 * built-in tools left out and reported, reasoning summaries and sealed
 * `encrypted_content` (and its way back in), `client_metadata`,
 * `reasoning.effort` as a hint, and `POST /v1/responses/input_tokens`; on
 * a gateway over a scripted upstream.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { OpenAIError } from "../protocol/openai/errors.ts";
import { decryptJWT } from "../lib/jwt.ts";
import { parseSSE } from "../lib/sse.ts";
import { createTenant } from "../store/tenants.ts";
import { SYSTEM } from "../store/principal.ts";
import {
  createWorld,
  MODELS,
  scriptedUpstream,
  type World,
} from "./_testing.ts";
import { outputOf } from "./responses_output.ts";
import {
  reasoningKey,
  sealReasoning,
  unsealReasoning,
} from "./responses_reasoning.ts";
import { chatMessages, parseResponses } from "./responses_request.ts";
import { flatName } from "./responses_tools.ts";

type Json = Record<string, unknown>;

const fn = (name: string) => ({
  type: "function",
  name,
  description: `${name} it`,
  strict: false,
  parameters: { type: "object", properties: {} },
});

/** Codex CLI 0.169.0's tools, in its shapes (tests/fixtures/agents/codex_first.json). */
const CODEX_TOOLS = [
  fn("exec_command"),
  {
    type: "namespace",
    name: "multi_agent_v1",
    description: "Tools for spawning and managing sub-agents.",
    tools: [fn("spawn_agent"), fn("close_agent")],
  },
  { type: "web_search", external_web_access: false },
];

function refused(body: Json, param: string) {
  assert.throws(
    () => parseResponses({ model: "m", input: "Hi", ...body }),
    (e: unknown) => {
      assert.ok(e instanceof OpenAIError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.param, param, e.message);
      return true;
    },
  );
}

Deno.test("parseResponses() flattens namespace tools to <namespace>__<name>, leaves built-in tools out and lists them", () => {
  const r = parseResponses({
    model: "m",
    input: "Hi",
    tools: CODEX_TOOLS,
    tool_choice: "auto",
  });
  assert.deepEqual(
    (r.chat.tools as { function: { name: string } }[]).map((t) =>
      t.function.name
    ),
    [
      "exec_command",
      "multi_agent_v1__spawn_agent",
      "multi_agent_v1__close_agent",
    ],
  );
  assert.deepEqual(r.omitted, ["web_search"]);
  assert.deepEqual(r.names.get("multi_agent_v1__close_agent"), {
    namespace: "multi_agent_v1",
    name: "close_agent",
  });
  assert.equal(r.names.has("exec_command"), false);
  // echoed as sent: the namespace with its bare names, the built-in tool too
  assert.deepEqual(r.echo.tools.map((t) => t.type), [
    "function",
    "namespace",
    "web_search",
  ]);
  assert.deepEqual(
    (r.echo.tools[1]!.tools as Json[]).map((t) => t.name),
    ["spawn_agent", "close_agent"],
  );
  // a function may be required by its flat name
  const choice = parseResponses({
    model: "m",
    input: "Hi",
    tools: CODEX_TOOLS,
    tool_choice: { type: "function", name: "multi_agent_v1__close_agent" },
  });
  assert.deepEqual(choice.chat.tool_choice, {
    type: "function",
    function: { name: "multi_agent_v1__close_agent" },
  });
  assert.equal(
    flatName("mcp__calendar__", "__create"),
    "mcp__calendar__create",
  );
});

Deno.test("parseResponses() refuses a tool_choice that requires a built-in tool, and what a namespace cannot hold", () => {
  refused(
    { tools: CODEX_TOOLS, tool_choice: { type: "web_search" } },
    "tool_choice",
  );
  refused(
    { tools: [{ type: "web_search" }], tool_choice: "required" },
    "tool_choice",
  );
  refused({
    tools: [{
      type: "namespace",
      name: "ns",
      tools: [{ type: "custom", name: "x" }],
    }],
  }, "tools[0].tools[0].type");
  refused({
    tools: [{
      type: "namespace",
      name: "n".repeat(40),
      tools: [fn("x".repeat(30))],
    }],
  }, "tools[0].tools[0].name");
  refused({
    tools: [fn("a__b"), { type: "namespace", name: "a", tools: [fn("b")] }],
  }, "tools[1].tools[0].name");
  refused(
    { tools: [{ type: "namespace", name: "a", tools: [] }] },
    "tools[0].tools",
  );
});

Deno.test("parseResponses() accepts client_metadata without echoing it, reasoning.summary and the includes it can serve", () => {
  const r = parseResponses({
    model: "m",
    input: "Hi",
    client_metadata: { session_id: "s-1", "x-codex-turn-metadata": "{}" },
    reasoning: { effort: "high", summary: "auto" },
    include: ["reasoning.encrypted_content", "web_search_call.action.sources"],
    store: false,
  });
  assert.equal(r.summary, true);
  assert.equal(r.encrypted, true);
  assert.equal(r.logprobs, false);
  assert.equal(r.effort, "high");
  assert.deepEqual(r.echo.reasoning, { effort: "high", summary: "auto" });
  assert.equal(JSON.stringify(r).includes("s-1"), false);
  assert.equal(JSON.stringify(r.chat).includes("client_metadata"), false);
});

Deno.test("chatMessages(): a namespaced call joins its flat name again; reasoning goes into the assistant turn after it", () => {
  const r = parseResponses({
    model: "m",
    input: [
      { role: "user", content: "spawn one" },
      {
        type: "reasoning",
        summary: [{ type: "summary_text", text: "shown" }],
        content: [{ type: "reasoning_text", text: "I should spawn." }],
      },
      {
        type: "function_call",
        call_id: "call_1",
        namespace: "multi_agent_v1",
        name: "spawn_agent",
        arguments: "{}",
      },
      { type: "function_call_output", call_id: "call_1", output: "ok" },
      { type: "reasoning", summary: [] }, // nothing it thought: dropped
      { role: "user", content: "thanks" },
    ],
  });
  assert.deepEqual(chatMessages(null, r.input, r.input.length), [
    { role: "user", content: "spawn one" },
    {
      role: "assistant",
      content: null,
      reasoning_content: "I should spawn.",
      tool_calls: [{
        id: "call_1",
        type: "function",
        function: { name: "multi_agent_v1__spawn_agent", arguments: "{}" },
      }],
    },
    { role: "tool", tool_call_id: "call_1", content: "ok" },
    { role: "user", content: "thanks" },
  ]);
});

Deno.test("outputOf(): a namespaced call goes back with namespace and bare name; reasoning as a summary, sealed when asked", async () => {
  const key = crypto.getRandomValues(new Uint8Array(32));
  const names = new Map([["multi_agent_v1__close_agent", {
    namespace: "multi_agent_v1",
    name: "close_agent",
  }]]);
  const { output } = await outputOf({
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: null,
        reasoning_content: "Close it.",
        tool_calls: [{
          id: "call_9",
          type: "function",
          function: { name: "multi_agent_v1__close_agent", arguments: "{}" },
        }],
      },
      finish_reason: "tool_calls",
    }],
  }, {
    names,
    summary: true,
    seal: (t) => sealReasoning(key, "tenant-a", t),
  });
  const [rs, call] = output as Json[];
  assert.deepEqual(rs!.summary, [{ type: "summary_text", text: "Close it." }]);
  assert.equal(rs!.content, undefined);
  assert.equal(
    await unsealReasoning(key, "tenant-a", rs!.encrypted_content as string),
    "Close it.",
  );
  assert.equal(
    await unsealReasoning(key, "tenant-b", rs!.encrypted_content as string),
    null,
  );
  assert.equal(call!.name, "close_agent");
  assert.equal(call!.namespace, "multi_agent_v1");
  // without a namespace nothing is added
  const plain = (await outputOf({
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: null,
        tool_calls: [{
          id: "c",
          type: "function",
          function: { name: "exec_command", arguments: "{}" },
        }],
      },
      finish_reason: "tool_calls",
    }],
  }, { names })).output[0]!;
  assert.equal(plain.name, "exec_command");
  assert.equal("namespace" in plain, false);
});

Deno.test("sealReasoning() makes a compact JWE (dir, A256GCM) that jose opens, and that does not open once altered", async () => {
  const key = crypto.getRandomValues(new Uint8Array(32));
  const sealed = await sealReasoning(key, "t1", "secret thought");
  const parts = sealed.split(".");
  assert.equal(parts.length, 5);
  assert.equal(parts[1], "");
  assert.deepEqual(JSON.parse(atob(parts[0]!)), {
    alg: "dir",
    enc: "A256GCM",
    typ: "JWT",
  });
  const claims = await decryptJWT(key, sealed, {
    iss: "orchard",
    aud: "orchard:reasoning",
    sub: "t1",
  });
  assert.equal(claims?.r, "secret thought");
  assert.ok(claims!.exp > claims!.iat);
  const c = parts[3]!;
  const flipped = (c[0] === "A" ? "B" : "A") + c.slice(1);
  const tampered = [...parts.slice(0, 3), flipped, parts[4]].join(".");
  assert.equal(await unsealReasoning(key, "t1", tampered), null);
  const other = crypto.getRandomValues(new Uint8Array(32));
  assert.equal(await unsealReasoning(other, "t1", sealed), null);
});

/** A streamed Codex-like turn through the gateway: its events. */
async function codexTurn(w: World, extra: Json = {}) {
  const res = await w.post("/v1/responses", {
    model: "tiny",
    input: [{ type: "message", role: "user", content: "hi" }],
    tools: CODEX_TOOLS,
    tool_choice: "auto",
    parallel_tool_calls: true,
    reasoning: { effort: "medium", summary: "auto" },
    store: false,
    include: ["reasoning.encrypted_content"],
    prompt_cache_key: "session-1",
    client_metadata: { session_id: "session-1" },
    stream: true,
    ...extra,
  });
  const raw = await res.text();
  assert.equal(res.status, 200, raw.slice(0, 400));
  const events = parseSSE(raw).map((e) => JSON.parse(e.data) as Json);
  return { res, events };
}

Deno.test("POST /v1/responses stream: Codex's tools and reasoning, the call restored, reasoning summarised and sealed, hints reported", async () => {
  const w = await createWorld({
    script: {
      reasoning: "The user greets; close the agent.",
      toolCall: { name: "multi_agent_v1__close_agent", args: '{"target":"a"}' },
    },
  });
  try {
    // a llama-engine model whose template has no reasoning control
    w.fleet.nodes().forEach((n) => (n.engine = "llama"));
    const { res, events } = await codexTurn(w);
    assert.equal(res.headers.get("x-orchard-tools-omitted"), "web_search");
    assert.equal(
      res.headers.get("x-orchard-reasoning-effort"),
      "not_applicable",
    );
    // what the node was asked: flat tools, no built-in, no effort, no client metadata
    const sent = w.up.requests.at(-1)!.body;
    assert.deepEqual(
      (sent.tools as { function: { name: string } }[]).map((t) =>
        t.function.name
      ),
      [
        "exec_command",
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__close_agent",
      ],
    );
    assert.equal(sent.reasoning_effort, undefined);
    assert.equal(sent.prompt_cache_key, "session-1");
    assert.equal(JSON.stringify(sent).includes("client_metadata"), false);
    const types = events.map((e) => e.type);
    assert.deepEqual(types.slice(0, 9), [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.reasoning_summary_part.added",
      "response.reasoning_summary_text.delta",
      "response.reasoning_summary_text.done",
      "response.reasoning_summary_part.done",
      "response.output_item.done",
      "response.output_item.added",
    ]);
    assert.deepEqual(
      events.map((e) => e.sequence_number),
      events.map((_, i) => i),
    );
    const done = events.filter((e) => e.type === "response.output_item.done")
      .map((e) => e.item as Json);
    const [rs, call] = done;
    assert.equal(rs!.type, "reasoning");
    assert.deepEqual(rs!.summary, [{
      type: "summary_text",
      text: "The user greets; close the agent.",
    }]);
    const key = await reasoningKey(w.store);
    assert.equal(
      await unsealReasoning(key, w.tenant.id, rs!.encrypted_content as string),
      "The user greets; close the agent.",
    );
    assert.equal(call!.type, "function_call");
    assert.equal(call!.name, "close_agent");
    assert.equal(call!.namespace, "multi_agent_v1");
    const added = events.filter((e) => e.type === "response.output_item.added")
      .map((e) => e.item as Json);
    assert.equal(added[1]!.namespace, "multi_agent_v1");
    const final = events.at(-1)!;
    assert.equal(final.type, "response.completed");
    const response = final.response as Json;
    assert.deepEqual(response.output, done);
    assert.deepEqual(response.reasoning, { effort: "medium", summary: "auto" });
    assert.equal("client_metadata" in response, false);

    // the next turn sends it all back: the reasoning opens into the assistant turn
    await codexTurn(w, {
      input: [
        { type: "message", role: "user", content: "hi" },
        rs,
        call,
        { type: "function_call_output", call_id: call!.call_id, output: "ok" },
      ],
    });
    const next = w.up.requests.at(-1)!.body.messages as Json[];
    assert.deepEqual(next[1], {
      role: "assistant",
      content: null,
      reasoning_content: "The user greets; close the agent.",
      tool_calls: [{
        id: "call_1",
        type: "function",
        function: {
          name: "multi_agent_v1__close_agent",
          arguments: '{"target":"a"}',
        },
      }],
    });
  } finally {
    await w.close();
  }
});

Deno.test("POST /v1/responses: sealed reasoning that was altered or is another organization's is a 400 naming input[i].encrypted_content", async () => {
  const w = await createWorld({ script: { reasoning: "mine" } });
  try {
    const key = await reasoningKey(w.store);
    const other = await createTenant(w.store, SYSTEM, { name: "Other" });
    const sealed = await sealReasoning(key, w.tenant.id, "mine");
    const parts = sealed.split(".");
    const c = parts[3]!;
    parts[3] = (c[0] === "A" ? "B" : "A") + c.slice(1);
    for (
      const bad of [
        parts.join("."),
        await sealReasoning(key, other.id, "theirs"),
        "not-a-jwe",
      ]
    ) {
      const res = await w.post("/v1/responses", {
        model: "tiny",
        store: false,
        input: [
          { role: "user", content: "hi" },
          { type: "reasoning", summary: [], encrypted_content: bad },
          { role: "assistant", content: "hello" },
          { role: "user", content: "again" },
        ],
      });
      const body = await res.json();
      assert.equal(res.status, 400, JSON.stringify(body));
      assert.equal(body.error.param, "input[1].encrypted_content");
      assert.equal(body.error.type, "invalid_request_error");
    }
    // the real one passes, and a non-stream answer seals its reasoning too
    const res = await w.post("/v1/responses", {
      model: "tiny",
      store: false,
      include: ["reasoning.encrypted_content"],
      input: [
        { role: "user", content: "hi" },
        { type: "reasoning", summary: [], encrypted_content: sealed },
        { role: "assistant", content: "hello" },
        { role: "user", content: "again" },
      ],
    });
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.deepEqual(
      (w.up.requests.at(-1)!.body.messages as Json[])[1],
      { role: "assistant", content: "hello", reasoning_content: "mine" },
    );
    const rs = body.output[0];
    assert.equal(rs.type, "reasoning");
    assert.deepEqual(rs.content, [{ type: "reasoning_text", text: "mine" }]);
    assert.equal(
      await unsealReasoning(key, w.tenant.id, rs.encrypted_content),
      "mine",
    );
  } finally {
    await w.close();
  }
});

Deno.test("POST /v1/responses: reasoning.effort reaches an engine with a reasoning control (openai nodes) and is reported", async () => {
  const w = await createWorld();
  try {
    assert.ok(w.fleet.nodes().every((n) => n.engine === "openai"));
    const res = await w.post("/v1/responses", {
      model: "tiny",
      input: "hi",
      reasoning: { effort: "low" },
    });
    await res.body?.cancel();
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("x-orchard-reasoning-effort"), "passed");
    assert.equal(w.up.requests.at(-1)!.body.reasoning_effort, "low");
    assert.equal(res.headers.get("x-orchard-tools-omitted"), null);
  } finally {
    await w.close();
  }
});

Deno.test("POST /v1/responses: reasoning.effort is passed to a llama node whose model reports a reasoning control, and not where one candidate lacks it", async () => {
  const w = await createWorld({ script: { reasoning: "think first" } });
  try {
    const node = w.fleet.nodes()[0]!;
    node.engine = "llama";
    node.models = node.models.map((m) => ({
      ...m,
      reasoning: { control: "enable_thinking" as const, parses: true },
    }));
    const res = await w.post("/v1/responses", {
      model: "tiny",
      input: "hi",
      store: false,
      include: ["reasoning.encrypted_content"],
      reasoning: { effort: "none" },
    });
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.equal(res.headers.get("x-orchard-reasoning-effort"), "passed");
    assert.equal(w.up.requests.at(-1)!.body.reasoning_effort, "none");
    // the reasoning item's jose-sealed content goes back as input next turn
    const rs = body.output.find((i: { type: string }) =>
      i.type === "reasoning"
    );
    assert.equal(rs.encrypted_content.split(".").length, 5);
    const next = await w.post("/v1/responses", {
      model: "tiny",
      store: false,
      input: [
        { role: "user", content: "hi" },
        ...body.output,
        { role: "user", content: "and?" },
      ],
    });
    await next.body?.cancel();
    assert.equal(next.status, 200);
    const sent = w.up.requests.at(-1)!.body.messages as {
      role: string;
      reasoning_content?: string;
    }[];
    assert.equal(sent[1]!.role, "assistant");
    assert.equal(sent[1]!.reasoning_content, "think first");
    // a second node serving the model without a control: not passed
    w.fleet.add("node-b", w.up.url, [{
      id: "tiny-chat",
      loaded: true,
      kind: "chat",
      reasoning: { control: null, parses: false },
    }]);
    w.fleet.nodes()[1]!.engine = "llama";
    const mixed = await w.post("/v1/responses", {
      model: "tiny",
      input: "hi",
      reasoning: { effort: "high" },
    });
    await mixed.body?.cancel();
    assert.equal(
      mixed.headers.get("x-orchard-reasoning-effort"),
      "not_applicable",
    );
  } finally {
    await w.close();
  }
});

Deno.test("POST /v1/responses/input_tokens: the translated prompt counted as count_tokens counts it", async () => {
  const w = await createWorld();
  try {
    const count = async (body: Json) => {
      const res = await w.post("/v1/responses/input_tokens", body);
      const j = await res.json();
      assert.equal(res.status, 200, JSON.stringify(j));
      assert.deepEqual(Object.keys(j).sort(), ["input_tokens", "object"]);
      assert.equal(j.object, "response.input_tokens");
      assert.ok(Number.isInteger(j.input_tokens) && j.input_tokens > 0);
      return j.input_tokens as number;
    };
    const short = await count({ model: "tiny", input: "Hi" });
    const long = await count({ model: "tiny", input: "Hi ".repeat(400) });
    assert.ok(long > short + 200, `${long} vs ${short}`);
    const withTools = await count({
      model: "tiny",
      input: "Hi",
      tools: CODEX_TOOLS,
    });
    assert.ok(withTools > short);
    // the same estimate /v1/messages/count_tokens gives the same prompt
    const anthropic = await w.post("/v1/messages/count_tokens", {
      model: "tiny",
      messages: [{ role: "user", content: "Hi ".repeat(400) }],
    });
    assert.equal((await anthropic.json()).input_tokens, long);
    assert.equal(
      w.up.requests.filter((r) => r.path !== "/orchard/count_tokens").length,
      0,
      "nothing generated",
    );
    const bad = await w.post("/v1/responses/input_tokens", {
      model: "tiny",
      input: "Hi",
      tool_choice: { type: "web_search" },
      tools: [{ type: "web_search" }],
    });
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).error.param, "tool_choice");
  } finally {
    await w.close();
  }
});

Deno.test("prompt_cache_key: a session's chat and Responses requests all reach the same one of two nodes", async () => {
  const w = await createWorld();
  const b = scriptedUpstream();
  try {
    w.fleet.add("node-b", b.url, MODELS);
    const seen = new Map<string, Set<string>>();
    for (let k = 0; k < 12; k++) {
      const key = `session-${k}`;
      for (let turn = 0; turn < 3; turn++) {
        const res = turn % 2
          ? await w.post("/v1/chat/completions", {
            model: "tiny",
            prompt_cache_key: key,
            messages: [{ role: "user", content: `turn ${turn}` }],
          })
          : await w.post("/v1/responses", {
            model: "tiny",
            prompt_cache_key: key,
            store: false,
            input: `turn ${turn}`,
          });
        await res.body?.cancel();
        assert.equal(res.status, 200);
        const node = b.requests.some((r) =>
            r.body.prompt_cache_key === key &&
            JSON.stringify(r.body.messages).includes(`turn ${turn}`)
          )
          ? "b"
          : "a";
        seen.set(key, (seen.get(key) ?? new Set()).add(node));
      }
    }
    for (const [key, nodes] of seen) assert.equal(nodes.size, 1, key);
    const used = new Set([...seen.values()].map((s) => [...s][0]));
    assert.equal(used.size, 2, "sessions spread over both nodes");
  } finally {
    await b.close();
    await w.close();
  }
});

Deno.test("POST /v1/responses: a node's 400 about a chat tool names the tool where the request put it", async () => {
  const w = await createWorld({
    script: { status: 400, errorParam: "tools[2].function.parameters" },
  });
  try {
    const res = await w.post("/v1/responses", {
      model: "tiny",
      input: "Hi",
      tools: [{ type: "web_search" }, ...CODEX_TOOLS],
    });
    const { error } = await res.json();
    assert.equal(res.status, 400);
    // chat tool 2 is the namespace's second function: tools[2].tools[1]
    assert.equal(error.param, "tools[2].tools[1].parameters");
  } finally {
    await w.close();
  }
});

Deno.test("the openai SDK's stream helper reads summarised, sealed reasoning and a namespaced call into the final response", async () => {
  const w = await createWorld({
    script: {
      reasoning: "Think.",
      toolCall: { name: "multi_agent_v1__spawn_agent", args: "{}" },
    },
  });
  try {
    const client = new OpenAI({
      apiKey: w.key,
      baseURL: `${w.url}/v1`,
      maxRetries: 0,
    });
    const stream = client.responses.stream({
      model: "tiny",
      input: "hi",
      tools: CODEX_TOOLS as OpenAI.Responses.Tool[],
      reasoning: { summary: "detailed" },
      include: ["reasoning.encrypted_content"],
      store: false,
    });
    const deltas: string[] = [];
    stream.on("response.reasoning_summary_text.delta", (e) => {
      deltas.push(e.delta);
    });
    const final = await stream.finalResponse();
    assert.deepEqual(deltas, ["Think."]);
    const [rs, call] = final.output as unknown as Json[];
    assert.deepEqual(rs!.summary, [{ type: "summary_text", text: "Think." }]);
    assert.equal(typeof rs!.encrypted_content, "string");
    assert.equal(call!.namespace, "multi_agent_v1");
    assert.equal(call!.name, "spawn_agent");
  } finally {
    await w.close();
  }
});
