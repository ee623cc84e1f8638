/**
 * The coding-agent regression suite: every request shape in
 * tests/fixtures/agent_requests.ts (Claude Code, Codex CLI, the OpenAI
 * Agents SDK, Cline/Roo Code, Continue) sent as the client sends it, with
 * its headers and its way of presenting the key, through a real gateway
 * and llama node process on the tiny fixture model. Each is answered 200
 * with a response well-formed for its API (JSON or the API's own event
 * sequence), or 400 naming the one field that cannot be honoured.
 */
import assert from "node:assert/strict";
import { parseSSE } from "../lib/sse.ts";
import { startCluster } from "./fixtures/cluster.ts";
import {
  AGENT_REQUESTS,
  type AgentRequest,
} from "./fixtures/agent_requests.ts";

type Json = Record<string, unknown>;

/**
 * The body with its output cap lowered to keep the run short (the tiny
 * model's greedy output never ends on its own): 12 tokens, or just over the
 * thinking budget where one is set, since Anthropic requires max_tokens to
 * exceed it. Every other field is sent as the client sends it.
 */
function bounded(r: AgentRequest): Json {
  const b = structuredClone(r.body);
  const thinking = b.thinking as { budget_tokens?: number } | undefined;
  const cap = thinking?.budget_tokens ? thinking.budget_tokens + 1 : 12;
  if (r.path.startsWith("/v1/messages/count_tokens")) return b;
  if (r.path.startsWith("/v1/messages")) b.max_tokens = cap;
  else if (r.path === "/v1/responses") b.max_output_tokens = cap;
  else b.max_tokens = cap;
  return b;
}

function checkAnthropicStream(raw: string, body: Json) {
  const events = parseSSE(raw).map((e) => ({
    event: e.event,
    data: JSON.parse(e.data) as Json,
  }));
  const names = events.map((e) => e.event);
  assert.equal(names[0], "message_start", names.join(","));
  assert.equal(names.at(-1), "message_stop", names.join(","));
  for (const e of events) assert.equal(e.data.type, e.event);
  const starts = names.filter((n) => n === "content_block_start").length;
  const stops = names.filter((n) => n === "content_block_stop").length;
  assert.ok(starts >= 1 && starts === stops, names.join(","));
  const delta = events.find((e) => e.event === "message_delta")!.data;
  assert.match(
    String((delta.delta as Json).stop_reason),
    /^(end_turn|max_tokens|tool_use|stop_sequence)$/,
  );
  const usage = delta.usage as Json;
  assert.ok(Number.isInteger(usage.output_tokens), JSON.stringify(usage));
  assert.ok((usage.output_tokens as number) > 0);
  if (body.context_management) {
    const cm = delta.context_management as Json;
    assert.ok(Array.isArray(cm?.applied_edits), JSON.stringify(delta));
  }
}

function checkAnthropicMessage(m: Json) {
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.match(String(m.id), /^msg_/);
  const content = m.content as Json[];
  assert.ok(content.length >= 1);
  for (const b of content) assert.match(String(b.type), /^(text|tool_use)$/);
  assert.match(
    String(m.stop_reason),
    /^(end_turn|max_tokens|tool_use|stop_sequence)$/,
  );
  const usage = m.usage as Json;
  assert.ok((usage.input_tokens as number) > 0, JSON.stringify(usage));
  assert.ok((usage.output_tokens as number) > 0, JSON.stringify(usage));
}

function checkChatStream(raw: string, body: Json) {
  const data = parseSSE(raw).map((e) => e.data);
  assert.equal(data.at(-1), "[DONE]");
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d) as Json);
  const object = body.messages ? "chat.completion.chunk" : "text_completion";
  for (const c of chunks) assert.equal(c.object, object, JSON.stringify(c));
  const finish = chunks.flatMap((c) => c.choices as Json[])
    .map((ch) => ch.finish_reason).filter((f) => f !== null);
  assert.equal(finish.length, 1, `one finish reason: ${finish}`);
  assert.match(String(finish[0]), /^(stop|length|tool_calls)$/);
  const usage = chunks.filter((c) => c.usage);
  if ((body.stream_options as Json | undefined)?.include_usage) {
    assert.equal(usage.length, 1);
    assert.deepEqual(usage[0]!.choices, []);
    assert.ok(((usage[0]!.usage as Json).completion_tokens as number) > 0);
  } else assert.equal(usage.length, 0);
}

function checkResponse(r: Json) {
  assert.equal(r.object, "response");
  assert.match(String(r.id), /^resp_/);
  assert.match(String(r.status), /^(completed|incomplete)$/);
  const output = r.output as Json[];
  assert.ok(output.length >= 1);
  for (const item of output) {
    assert.match(String(item.type), /^(message|function_call|reasoning)$/);
    if (item.type === "function_call") {
      assert.match(String(item.call_id), /^call_/);
      assert.equal(typeof item.arguments, "string");
    }
  }
  assert.ok(((r.usage as Json).output_tokens as number) > 0);
}

function checkResponsesStream(raw: string) {
  const events = parseSSE(raw).map((e) => ({
    event: e.event,
    data: JSON.parse(e.data) as Json,
  }));
  const names = events.map((e) => e.event);
  assert.equal(names[0], "response.created", names.join(","));
  assert.match(String(names.at(-1)), /^response\.(completed|incomplete)$/);
  for (const e of events) assert.equal(e.data.type, e.event);
  const seq = events.map((e) => e.data.sequence_number as number);
  assert.deepEqual(seq, seq.map((_, i) => i), "sequence numbers in order");
  assert.ok(names.includes("response.output_item.added"));
  checkResponse(events.at(-1)!.data.response as Json);
}

/** Checks a 200 answer's shape for its API. */
function checkOk(r: AgentRequest, body: Json, text: string, type: string) {
  if (r.path.startsWith("/v1/messages/count_tokens")) {
    const j = JSON.parse(text);
    assert.ok(Number.isInteger(j.input_tokens) && j.input_tokens > 0);
  } else if (r.path.startsWith("/v1/messages")) {
    if (body.stream) checkAnthropicStream(text, body);
    else checkAnthropicMessage(JSON.parse(text));
  } else if (r.path === "/v1/responses") {
    if (body.stream) checkResponsesStream(text);
    else checkResponse(JSON.parse(text));
  } else {
    assert.ok(body.stream, "the chat shapes here all stream");
    checkChatStream(text, body);
  }
  assert.match(
    type,
    body.stream ? /^text\/event-stream/ : /^application\/json/,
  );
}

Deno.test({
  name:
    "coding-agent request shapes through a real gateway and llama node: 200 well-formed, or 400 naming the field",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  await using cluster = await startCluster({
    slots: 4,
    threads: 1,
    heartbeatMs: 1000,
  });
  for (const r of AGENT_REQUESTS) {
    await t.step(r.name, async () => {
      const body = bounded(r);
      const res = await fetch(cluster.url + r.path, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          ...(r.auth === "bearer"
            ? { authorization: `Bearer ${cluster.apiKey}` }
            : { "x-api-key": cluster.apiKey }),
          ...r.headers,
        },
        body: JSON.stringify(body),
      });
      const text = await res.text();
      assert.equal(res.status, r.expect.status, text.slice(0, 500));
      if (r.expect.status === 200) {
        checkOk(r, body, text, res.headers.get("content-type") ?? "");
        for (const [name, want] of Object.entries(r.expect.headers ?? {})) {
          assert.match(res.headers.get(name) ?? "(none)", want, name);
        }
        return;
      }
      const j = JSON.parse(text);
      if ("message" in r.expect) {
        assert.equal(j.type, "error", text);
        assert.equal(j.error.type, "invalid_request_error");
        assert.match(j.error.message, r.expect.message);
        // the numbers are the node's: a prompt longer than the context
        const [n, m] = (j.error.message.match(/\d+/g) ?? []).map(Number);
        if (/^prompt is too long/.test(j.error.message)) {
          assert.ok(n! > m! && m! > 0, j.error.message);
        }
      } else if (r.path.startsWith("/v1/messages")) {
        // Anthropic's error shape has no `param`: the message names it.
        assert.equal(j.type, "error");
        assert.equal(j.error.type, "invalid_request_error");
        assert.ok(
          String(j.error.message).startsWith(r.expect.param),
          `${j.error.message} names ${r.expect.param}`,
        );
      } else {
        assert.equal(j.error.param, r.expect.param, text);
        assert.equal(j.error.code, "unsupported_parameter", text);
      }
    });
  }
});
