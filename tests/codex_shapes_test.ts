/**
 * Codex CLI 0.169.0's first request, exactly as captured from `codex exec`
 * (tests/fixtures/agents/codex_first.json: its headers and its whole body:
 * developer instructions, a `namespace` tool, the built-in `web_search`
 * tool, `reasoning.summary`, `include: ["reasoning.encrypted_content"]`
 * with `store: false`, `prompt_cache_key`, `client_metadata`), sent through
 * a real gateway and llama node. Only the model and an output cap are
 * changed.
 *
 * Every field is taken: nothing is refused by name. On the agent-sized
 * fixture model (128k context) it is a 200 event stream; on the tiny one
 * (2048 tokens; Codex's prompt is about 38,000) the node's exact
 * context-length error, renamed to the Responses param (`input`), whose
 * prompt count `/v1/responses/input_tokens` gives too.
 */
import assert from "node:assert/strict";
import { parseSSE } from "../lib/sse.ts";
import { startCluster } from "./fixtures/cluster.ts";

type Json = Record<string, unknown>;

const CAPTURED = JSON.parse(
  await Deno.readTextFile(
    new URL("./fixtures/agents/codex_first.json", import.meta.url),
  ),
) as { headers: Record<string, string>; body: Json };

/** The captured request with a fixture model and an output cap. */
function codexFirst(
  model: string,
): { headers: Record<string, string>; body: Json } {
  const body = structuredClone(CAPTURED.body);
  body.model = model;
  body.max_output_tokens = 12;
  const headers = { ...CAPTURED.headers };
  for (const h of ["authorization", "host", "content-length"]) {
    delete headers[h];
  }
  return { headers, body };
}

function checkStream(raw: string) {
  const events = parseSSE(raw).map((e) => ({
    event: e.event,
    data: JSON.parse(e.data) as Json,
  }));
  const names = events.map((e) => e.event);
  assert.equal(names[0], "response.created", names.join(","));
  assert.match(String(names.at(-1)), /^response\.(completed|incomplete)$/);
  for (const e of events) assert.equal(e.data.type, e.event);
  const seq = events.map((e) => e.data.sequence_number as number);
  assert.deepEqual(seq, seq.map((_, i) => i));
  const final = events.at(-1)!.data.response as Json;
  for (const item of final.output as Json[]) {
    assert.match(String(item.type), /^(message|function_call|reasoning)$/);
  }
  assert.deepEqual(final.reasoning, { effort: null, summary: "auto" });
  assert.equal(final.store, false);
}

Deno.test({
  name:
    "Codex CLI 0.169.0's captured first request: every field taken, a stream on an agent-sized context, the exact context-length error on a small one",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using cluster = await startCluster({
    models: [{ name: "tiny" }, { name: "agent", size: "agent" }],
    slots: 1,
    heartbeatMs: 1000,
  });
  const send = (path: string, body: Json, headers: Record<string, string>) =>
    fetch(`${cluster.url}${path}`, {
      method: "POST",
      headers: {
        ...headers,
        authorization: `Bearer ${cluster.apiKey}`,
        "content-type": "application/json",
      },
      body: JSON.stringify(body),
    });

  // agent-sized: the whole first turn streams
  const agent = codexFirst("agent");
  const ok = await send("/v1/responses", agent.body, agent.headers);
  const okText = await ok.text();
  assert.equal(ok.status, 200, okText.slice(0, 500));
  assert.equal(ok.headers.get("x-orchard-tools-omitted"), "web_search");
  assert.match(ok.headers.get("content-type") ?? "", /^text\/event-stream/);
  checkStream(okText);

  // too long for the tiny model: the node's numbers, as input_tokens counts
  const tiny = codexFirst("tiny");
  const res = await send("/v1/responses", tiny.body, tiny.headers);
  const text = await res.text();
  assert.equal(res.status, 400, text.slice(0, 500));
  const e = JSON.parse(text).error;
  assert.equal(e.code, "context_length_exceeded", text);
  assert.equal(e.param, "input", text);
  const m = e.message.match(
    /^This model's maximum context length is (\d+) tokens\. However, your input resulted in (\d+) tokens\. Please reduce the length of the input\.$/,
  );
  assert.ok(m, e.message);
  const [ctx, prompt] = [Number(m[1]), Number(m[2])];
  assert.equal(ctx, 2048);
  assert.ok(prompt > ctx, `${prompt} > ${ctx}`);
  const counted = { ...tiny.body };
  for (
    const f of ["stream", "store", "include", "client_metadata"]
  ) delete counted[f];
  const n = await send("/v1/responses/input_tokens", counted, {});
  const j = await n.json();
  assert.equal(n.status, 200, JSON.stringify(j));
  assert.equal(j.object, "response.input_tokens");
  assert.equal(j.input_tokens, prompt, JSON.stringify(j));
});
