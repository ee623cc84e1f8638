/**
 * Codex CLI 0.169.0's first request, exactly as captured from `codex exec`
 * (tests/fixtures/agents/codex_first.json: its headers and its whole body:
 * developer instructions, a `namespace` tool, the built-in `web_search`
 * tool, `reasoning.summary`, `include: ["reasoning.encrypted_content"]`
 * with `store: false`, `prompt_cache_key`, `client_metadata`), sent through
 * a real gateway and llama node. Only the model (the fixture's `tiny`) and
 * an output cap (the tiny model never stops on its own) are changed.
 *
 * Every field is taken: nothing is refused by name. The tiny fixture model
 * has a 2048-token context and Codex's prompt is about 10,000 tokens, so
 * the node answers the exact context-length error, renamed to the
 * Responses param (`input`); with a model whose context holds it (an
 * agent-sized fixture), the same request is a 200 event stream, checked
 * here whenever the prompt fits.
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

/** The captured request with the fixture model and an output cap. */
function codexFirst(): { headers: Record<string, string>; body: Json } {
  const body = structuredClone(CAPTURED.body);
  body.model = "tiny";
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
    "Codex CLI 0.169.0's captured first request: every field taken, answered as a stream or with the exact context-length error",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using cluster = await startCluster({
    slots: 2,
    threads: 1,
    heartbeatMs: 1000,
  });
  const { headers, body } = codexFirst();
  const res = await fetch(`${cluster.url}/v1/responses`, {
    method: "POST",
    headers: {
      ...headers,
      authorization: `Bearer ${cluster.apiKey}`,
      "content-type": "application/json",
    },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  if (res.status === 200) {
    assert.equal(res.headers.get("x-orchard-tools-omitted"), "web_search");
    assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
    checkStream(text);
    return;
  }
  // the prompt does not fit the tiny model's context: the node's own error,
  // named as the Responses API names it; no field was refused
  assert.equal(res.status, 400, text.slice(0, 500));
  const e = JSON.parse(text).error;
  assert.equal(e.code, "context_length_exceeded", text);
  assert.equal(e.param, "input", text);
  assert.match(
    e.message,
    /^This model's maximum context length is \d+ tokens\. However, you requested \d+ tokens \(\d+ in the input, 12 in the completion\)\.$/,
  );
  const [, ctx, , prompt] = e.message.match(/(\d+).*?(\d+).*?\((\d+)/)!.map(
    Number,
  );
  assert.ok(prompt! > ctx!, `${prompt} > ${ctx}`);
  // the same request counted: the estimate sees a prompt over the context too
  const counted = { ...body };
  for (
    const f of [
      "stream",
      "store",
      "include",
      "prompt_cache_key",
      "client_metadata",
      "max_output_tokens",
    ]
  ) delete counted[f];
  const n = await fetch(`${cluster.url}/v1/responses/input_tokens`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${cluster.apiKey}`,
      "content-type": "application/json",
    },
    body: JSON.stringify(counted),
  });
  const j = await n.json();
  assert.equal(n.status, 200, JSON.stringify(j));
  assert.equal(j.object, "response.input_tokens");
  assert.ok(j.input_tokens > ctx!, JSON.stringify(j));
});
