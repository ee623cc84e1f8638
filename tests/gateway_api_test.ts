/** The gateway's OpenAI surface against a scripted upstream: shapes, auth, scopes, models, headers. */
import assert from "node:assert/strict";
import {
  awayFromMinuteEdge,
  createWorld,
  readSSE,
} from "../gateway/_testing.ts";
import { getApiKey, revokeApiKey } from "../store/api_keys.ts";
import { setTenantLimits } from "../store/limits.ts";
import { SYSTEM } from "../store/principal.ts";
import { createTenant, updateTenant } from "../store/tenants.ts";
import { usageTotals } from "../store/usage.ts";
import { writeUsage } from "../store/usage_rollups.ts";

const chat = (extra: Record<string, unknown> = {}) => ({
  model: "tiny-chat",
  messages: [{ role: "user", content: "Hi" }],
  ...extra,
});

Deno.test("chat completion returns an exact chat.completion with billed usage and a request id", async () => {
  const w = await createWorld();
  try {
    const res = await w.post(
      "/v1/chat/completions",
      chat({ max_completion_tokens: 50, tools: [], user: "u-1" }),
    );
    assert.equal(res.status, 200);
    assert.match(res.headers.get("x-request-id") ?? "", /^req_/);
    const body = await res.json();
    assert.equal(body.object, "chat.completion");
    assert.equal(body.choices[0].message.content, "Hello world!");
    assert.deepEqual(body.usage, {
      prompt_tokens: 7,
      completion_tokens: 3,
      total_tokens: 10,
    });
    const sent = w.up.requests[0]!.body;
    assert.equal(sent.max_tokens, 50);
    assert.equal(sent.max_completion_tokens, undefined);
    assert.equal(sent.user, "u-1");
  } finally {
    await w.close();
  }
});

Deno.test("chat stream strips the node's usage chunk unless include_usage is asked", async () => {
  const w = await createWorld({ script: { exoQuirks: true } });
  try {
    const plain = await readSSE(
      await w.post("/v1/chat/completions", chat({ stream: true })),
    );
    assert.equal(plain.data.at(-1), "[DONE]");
    const chunks = plain.data.slice(0, -1).map((d) => JSON.parse(d));
    assert.ok(
      chunks.every((c) =>
        c.object === "chat.completion.chunk" && !("usage" in c) &&
        c.choices.length === 1
      ),
    );
    assert.equal(new Set(chunks.map((c) => c.id)).size, 1);
    const withUsage = await readSSE(
      await w.post(
        "/v1/chat/completions",
        chat({ stream: true, stream_options: { include_usage: true } }),
      ),
    );
    const last = JSON.parse(withUsage.data.at(-2)!);
    assert.deepEqual(last.choices, []);
    assert.deepEqual(last.usage, {
      prompt_tokens: 7,
      completion_tokens: 3,
      total_tokens: 10,
    });
    assert.equal(withUsage.data.at(-1), "[DONE]");
  } finally {
    await w.close();
  }
});

Deno.test("streams reuse the gateway's connection to the node: one TCP connection for 20 sequential streams", async () => {
  const w = await createWorld();
  try {
    for (let i = 0; i < 20; i++) {
      const res = await w.post("/v1/chat/completions", chat({ stream: true }));
      assert.equal(res.status, 200);
      const { data } = await readSSE(res);
      assert.equal(data.at(-1), "[DONE]");
    }
    // The node body's end is read after [DONE], so the connection goes back
    // to the pool; closing it cost a connect and a teardown per stream.
    assert.equal(w.up.peers.size, 1);
  } finally {
    await w.close();
  }
});

Deno.test("the first delta of a tool call carries id, type and function.name", async () => {
  const w = await createWorld({
    script: {
      toolCall: {
        name: "get_weather",
        args: '{"city":"Oslo"}',
        idMissing: true,
      },
    },
  });
  try {
    const s = await readSSE(
      await w.post("/v1/chat/completions", chat({ stream: true })),
    );
    const calls = s.data.slice(0, -1).map((d) => JSON.parse(d)).flatMap((c) =>
      c.choices[0]?.delta?.tool_calls ?? []
    );
    assert.match(calls[0].id, /^call_/);
    assert.equal(calls[0].type, "function");
    assert.equal(calls[0].function.name, "get_weather");
    assert.equal(
      calls.map((c: { function: { arguments: string } }) =>
        c.function.arguments
      ).join(""),
      '{"city":"Oslo"}',
    );
  } finally {
    await w.close();
  }
});

Deno.test("a long prefill gets ': ping' comments before the first chunk", async () => {
  const w = await createWorld({
    script: { prefillMs: 400 },
    gateway: { proxy: { pingDelayMs: 50, pingIntervalMs: 100 } },
  });
  try {
    const s = await readSSE(
      await w.post("/v1/chat/completions", chat({ stream: true })),
    );
    assert.ok(s.comments >= 2, `pings: ${s.comments}`);
    assert.equal(s.data.at(-1), "[DONE]");
  } finally {
    await w.close();
  }
});

Deno.test("completions and embeddings (float and base64) have OpenAI shapes", async () => {
  const w = await createWorld();
  try {
    const c =
      await (await w.post("/v1/completions", { model: "tiny", prompt: "Say" }))
        .json();
    assert.equal(c.object, "text_completion");
    assert.equal(c.choices[0].text, "Hello world!");
    const f = await (await w.post("/v1/embeddings", {
      model: "tiny-embed",
      input: ["a", "b"],
    })).json();
    assert.equal(f.object, "list");
    assert.deepEqual(f.data[1], {
      object: "embedding",
      index: 1,
      embedding: [0.5, -1, 0.25],
    });
    const b = await (await w.post("/v1/embeddings", {
      model: "tiny-embed",
      input: "a",
      encoding_format: "base64",
    })).json();
    const bytes = Uint8Array.from(
      atob(b.data[0].embedding),
      (ch) => ch.charCodeAt(0),
    );
    assert.deepEqual([...new Float32Array(bytes.buffer)], [0.5, -1, 0.25]);
    assert.equal(b.usage.prompt_tokens, 3);
  } finally {
    await w.close();
  }
});

Deno.test("auth: missing, malformed, revoked keys give 401 invalid_api_key; x-api-key works", async () => {
  const w = await createWorld();
  try {
    const none = await fetch(w.url + "/v1/models");
    assert.equal(none.status, 401);
    assert.equal((await none.json()).error.code, "invalid_api_key");
    const bad = await w.post("/v1/chat/completions", chat(), {
      authorization: "Bearer orch_nope",
    });
    assert.equal(bad.status, 401);
    await bad.body?.cancel();
    const viaHeader = await fetch(w.url + "/v1/models", {
      headers: { "x-api-key": w.key },
    });
    assert.equal(viaHeader.status, 200);
    await viaHeader.body?.cancel();
    const k2 = await w.newKey();
    const ok = await fetch(w.url + "/v1/models", {
      headers: { authorization: `Bearer ${k2.key}` },
    });
    assert.equal(ok.status, 200);
    await ok.body?.cancel();
    await revokeApiKey(w.store, SYSTEM, k2.id);
    const deadline = Date.now() + 1500;
    let status = 200;
    while (status === 200 && Date.now() < deadline) {
      const r = await fetch(w.url + "/v1/models", {
        headers: { authorization: `Bearer ${k2.key}` },
      });
      status = r.status;
      await r.body?.cancel();
    }
    assert.equal(status, 401, "revocation took effect within ~1 s");
  } finally {
    await w.close();
  }
});

Deno.test("scopes give 403, model allow-lists and unknown models give 404 model_not_found", async () => {
  const w = await createWorld();
  try {
    const embOnly = await w.newKey({ scopes: ["embeddings"] });
    const r1 = await w.post("/v1/chat/completions", chat(), {
      authorization: `Bearer ${embOnly.key}`,
    });
    assert.equal(r1.status, 403);
    assert.equal((await r1.json()).error.type, "permission_error");
    const limited = await w.newKey({ models: ["tiny-embed"] });
    const r2 = await w.post("/v1/chat/completions", chat(), {
      authorization: `Bearer ${limited.key}`,
    });
    assert.equal(r2.status, 404);
    assert.equal((await r2.json()).error.code, "model_not_found");
    const list = await (await fetch(w.url + "/v1/models", {
      headers: { authorization: `Bearer ${limited.key}` },
    })).json();
    assert.deepEqual(list.data.map((m: { id: string }) => m.id), [
      "tiny-embed",
    ]);
    const r3 = await w.post("/v1/chat/completions", chat({ model: "nope" }));
    assert.equal(r3.status, 404);
    await r3.body?.cancel();
    const one = await fetch(w.url + "/v1/models/tiny", {
      headers: { authorization: `Bearer ${w.key}` },
    });
    assert.equal((await one.json()).id, "tiny-chat");
  } finally {
    await w.close();
  }
});

Deno.test("a model whose only node is draining or down is 503 with retry-after, not 404", async () => {
  const w = await createWorld();
  try {
    for (const state of ["draining", "unhealthy"] as const) {
      w.fleet.list[0]!.state = state;
      const res = await w.post("/v1/chat/completions", chat());
      assert.equal(res.status, 503, state);
      assert.equal(res.headers.get("retry-after"), "5");
      assert.equal((await res.json()).error.code, "model_unavailable");
    }
    const unknown = await w.post(
      "/v1/chat/completions",
      chat({ model: "nope" }),
    );
    assert.equal(unknown.status, 404, "a model no node lists is still unknown");
    await unknown.body?.cancel();
  } finally {
    await w.close();
  }
});

Deno.test("a suspended tenant gets 403 and another tenant's keys see only their own usage", async () => {
  const w = await createWorld();
  try {
    const other = await createTenant(w.store, SYSTEM, { name: "Globex" });
    const b = await w.newKey({}, other.id);
    const rb = await w.post("/v1/chat/completions", chat(), {
      authorization: `Bearer ${b.key}`,
    });
    assert.equal(rb.status, 200);
    await rb.body?.cancel();
    await updateTenant(w.store, SYSTEM, other.id, { status: "suspended" });
    w.gw.core.keys.clear();
    const rs = await w.post("/v1/chat/completions", chat(), {
      authorization: `Bearer ${b.key}`,
    });
    assert.equal(rs.status, 403);
    await rs.body?.cancel();
    await w.gw.idle();
    const day = {
      granularity: "day" as const,
      from: Date.now() - 86_400_000,
      to: Date.now(),
    };
    assert.equal(
      (await usageTotals(w.store, { tenantId: w.tenant.id, ...day })).requests,
      0,
    );
    // The refused request never got past authentication: only the served one is metered.
    assert.equal(
      (await usageTotals(w.store, { tenantId: other.id, ...day })).requests,
      1,
    );
  } finally {
    await w.close();
  }
});

Deno.test("sequential requests see x-ratelimit-remaining-requests drop by exactly one", async () => {
  await awayFromMinuteEdge();
  const w = await createWorld({ limits: { rpm: 1000, tpm: 1_000_000 } });
  try {
    const seen: number[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await w.post("/v1/chat/completions", chat({ max_tokens: 10 }));
      assert.equal(r.status, 200);
      assert.equal(r.headers.get("x-ratelimit-limit-requests"), "1000");
      assert.ok(r.headers.get("x-ratelimit-reset-requests"));
      assert.ok(r.headers.get("x-ratelimit-remaining-tokens"));
      seen.push(Number(r.headers.get("x-ratelimit-remaining-requests")));
      await r.body?.cancel();
    }
    // Each step drops by exactly one (a minute boundary restarts the window at 999).
    for (let i = 1; i < seen.length; i++) {
      assert.ok(seen[i] === seen[i - 1]! - 1 || seen[i] === 999, `${seen}`);
    }
    assert.equal(seen[0], 999);
  } finally {
    await w.close();
  }
});

Deno.test("an exhausted daily quota is 429 insufficient_quota with x-should-retry: false; a request over the whole quota is too large; rpm is rate_limit_exceeded", async () => {
  await awayFromMinuteEdge();
  const w = await createWorld();
  try {
    // 98 tokens used today, before a daily quota of 100 was set
    await writeUsage(w.store, [{
      id: crypto.randomUUID(),
      at: new Date().toISOString(),
      requestId: "earlier",
      tenantId: w.tenant.id,
      keyId: w.keyId,
      model: "tiny-chat",
      nodeId: null,
      endpoint: "chat",
      promptTokens: 90,
      completionTokens: 8,
      latencyMs: 1,
      ttftMs: null,
      status: 200,
      outcome: "ok",
    }]);
    await setTenantLimits(w.store, SYSTEM, w.tenant.id, { tokensPerDay: 100 });
    const r = await w.post("/v1/chat/completions", chat({ max_tokens: 5 }));
    assert.equal(r.status, 429);
    assert.equal(r.headers.get("x-should-retry"), "false");
    assert.ok(Number(r.headers.get("retry-after")) > 0);
    const { error } = await r.json();
    assert.equal(error.code, "insufficient_quota");
    assert.match(error.message, /has 2 tokens left; this request needs up to/);
    // more than the whole quota: it can never fit, and says so
    const big = await w.post("/v1/chat/completions", chat({ max_tokens: 500 }));
    assert.equal(big.status, 429);
    assert.equal(big.headers.get("x-should-retry"), "false");
    assert.equal(big.headers.get("retry-after"), null);
    assert.match(
      (await big.json()).error.message,
      /^Request too large for tiny-chat for your organization on tokens per day \(TPD\): Limit 100, Requested \d+\./,
    );
  } finally {
    await w.close();
  }
  const w2 = await createWorld({ limits: { rpm: 1 } });
  try {
    (await w2.post("/v1/chat/completions", chat())).body?.cancel();
    const r = await w2.post("/v1/chat/completions", chat());
    assert.equal(r.status, 429);
    assert.equal(r.headers.get("x-should-retry"), null);
    assert.equal((await r.json()).error.code, "rate_limit_exceeded");
  } finally {
    await w2.close();
  }
});

Deno.test("KV failure fails closed with 503 and nothing reaches a node", async () => {
  const w = await createWorld({ limits: { rpm: 100 } });
  try {
    w.kv.close();
    const r = await w.post("/v1/chat/completions", chat());
    assert.equal(r.status, 503);
    assert.equal((await r.json()).error.type, "server_error");
    assert.equal(w.up.requests.length, 0);
  } finally {
    await w.close().catch(() => {});
  }
});

Deno.test("/metrics needs an allowed IP or an admin token and lists requests and histograms", async () => {
  const w = await createWorld();
  try {
    (await w.post("/v1/chat/completions", chat())).body?.cancel();
    const r = await fetch(w.url + "/metrics");
    assert.equal(r.status, 200);
    const text = await r.text();
    assert.match(
      text,
      /orchard_gateway_requests_total\{endpoint="chat",model="tiny-chat",status="200"\} 1/,
    );
    assert.match(text, /orchard_gateway_request_duration_seconds_bucket/);
    assert.match(text, /orchard_node_up\{node="node-a"\} 1/);
    const denied = await w.gw.app.request("/metrics");
    assert.equal(denied.status, 403);
    await denied.body?.cancel();
  } finally {
    await w.close();
  }
});

Deno.test("a key's last use is filled by its requests (portal, API and CLI read it)", async () => {
  const w = await createWorld();
  try {
    const view = () => getApiKey(w.store, SYSTEM, w.keyId);
    assert.equal((await view()).lastUsedAt, null);
    const before = new Date().toISOString();
    const res = await w.post("/v1/chat/completions", chat());
    assert.equal(res.status, 200);
    await res.body?.cancel();
    await w.gw.idle();
    const used = (await view()).lastUsedAt;
    assert.ok(used !== null && used >= before.slice(0, 19), String(used));
  } finally {
    await w.close();
  }
});
