/**
 * `/v1/messages` reasoning: `thinking` and `output_config.effort` reach a
 * model's reasoning control as `reasoning_effort`, and the node's
 * `reasoning_content` comes back as signed thinking blocks.
 */
import assert from "node:assert/strict";
import { createWorld, readSSE, type World } from "./_testing.ts";
import { AnthropicSink } from "./anthropic.ts";
import type { Exchange } from "./core.ts";
import { ChunkNormaliser } from "./normalise.ts";
import { reasoningKey, unsealReasoning } from "./responses_reasoning.ts";

type Obj = Record<string, unknown>;

const THOUGHT = "The user greets me; greet back.";

/** The scripted node as a llama-engine node whose model has (or lacks) a reasoning control. */
function llamaNode(w: World, control: "enable_thinking" | null) {
  for (const n of w.fleet.nodes()) {
    n.engine = "llama";
    n.models = n.models.map((m) => ({
      ...m,
      reasoning: { control, parses: true },
    }));
  }
}

function message(extra: Obj = {}): Obj {
  return {
    model: "tiny",
    max_tokens: 4096,
    messages: [{ role: "user", content: "hi" }],
    ...extra,
  };
}

Deno.test("POST /v1/messages stream: adaptive thinking on a model with a control sends effort and streams a signed thinking block before the text", async () => {
  const w = await createWorld({ script: { reasoning: THOUGHT } });
  try {
    llamaNode(w, "enable_thinking");
    const res = await w.post(
      "/v1/messages",
      message({
        stream: true,
        thinking: { type: "adaptive" },
        output_config: { effort: "medium" },
      }),
    );
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("x-orchard-ignored"), null);
    assert.equal(w.up.requests.at(-1)!.body.reasoning_effort, "medium");
    const events = (await readSSE(res)).data.map((d) => JSON.parse(d) as Obj);
    const types = events.map((e) =>
      e.type === "content_block_delta"
        ? `delta:${(e.delta as Obj).type}`
        : String(e.type)
    );
    assert.deepEqual(types, [
      "message_start",
      "content_block_start",
      "ping",
      "delta:thinking_delta",
      "delta:signature_delta",
      "content_block_stop",
      "content_block_start",
      "delta:text_delta",
      "delta:text_delta",
      "delta:text_delta",
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    assert.deepEqual(events[1]!.content_block, {
      type: "thinking",
      thinking: "",
      signature: "",
    });
    assert.equal((events[3]!.delta as Obj).thinking, THOUGHT);
    const signature = (events[4]!.delta as Obj).signature as string;
    // the signature is the thinking sealed for this tenant (jose JWE)
    const key = await reasoningKey(w.store);
    assert.equal(await unsealReasoning(key, w.tenant.id, signature), THOUGHT);
    assert.equal(events[6]!.index, 1);
  } finally {
    await w.close();
  }
});

Deno.test("POST /v1/messages: display omitted gives a thinking block with empty text and a signature; disabled is effort none", async () => {
  const w = await createWorld({ script: { reasoning: THOUGHT } });
  try {
    llamaNode(w, "enable_thinking");
    const res = await w.post(
      "/v1/messages",
      message({ thinking: { type: "adaptive", display: "omitted" } }),
    );
    const msg = await res.json();
    assert.equal(res.status, 200, JSON.stringify(msg));
    assert.equal(w.up.requests.at(-1)!.body.reasoning_effort, "high");
    assert.equal(msg.content[0].type, "thinking");
    assert.equal(msg.content[0].thinking, "");
    const key = await reasoningKey(w.store);
    assert.equal(
      await unsealReasoning(key, w.tenant.id, msg.content[0].signature),
      THOUGHT,
    );
    assert.deepEqual(msg.content[1], { type: "text", text: "Hello world!" });

    const streamed = await w.post(
      "/v1/messages",
      message({
        stream: true,
        thinking: { type: "enabled", budget_tokens: 1024, display: "omitted" },
      }),
    );
    const deltas = (await readSSE(streamed)).data.map((d) => JSON.parse(d))
      .filter((e) => e.type === "content_block_delta").map((e) => e.delta.type);
    assert.deepEqual(deltas.slice(0, 2), ["signature_delta", "text_delta"]);

    const off = await w.post(
      "/v1/messages",
      message({ thinking: { type: "disabled" } }),
    );
    const offMsg = await off.json();
    assert.equal(w.up.requests.at(-1)!.body.reasoning_effort, "none");
    // thinking not asked for: no thinking block
    assert.deepEqual(offMsg.content, [{ type: "text", text: "Hello world!" }]);
  } finally {
    await w.close();
  }
});

Deno.test("POST /v1/messages: on a model without a reasoning control, thinking and effort are reported ignored and not sent", async () => {
  const w = await createWorld({ script: { reasoning: THOUGHT } });
  try {
    llamaNode(w, null);
    const res = await w.post(
      "/v1/messages",
      message({
        thinking: { type: "adaptive" },
        output_config: { effort: "high" },
      }),
    );
    const msg = await res.json();
    assert.equal(res.status, 200, JSON.stringify(msg));
    assert.equal(
      res.headers.get("x-orchard-ignored"),
      "thinking, output_config.effort",
    );
    assert.equal(w.up.requests.at(-1)!.body.reasoning_effort, undefined);
    // a model that reasons anyway still shows it, as thinking was asked
    assert.equal(msg.content[0].type, "thinking");
    assert.equal(msg.content[0].thinking, THOUGHT);
  } finally {
    await w.close();
  }
});

Deno.test("AnthropicSink: a delta with the last of the thinking and the first text signs the whole thinking", async () => {
  const sink = new AnthropicSink(
    new ChunkNormaliser("chat", "m"),
    { promptEstimate: 1 } as unknown as Exchange,
    "m",
    null,
    { display: "summarized", sign: (t) => Promise.resolve(`signed:${t}`) },
  );
  const chunk = (delta: Obj) =>
    JSON.stringify({
      id: "c",
      object: "chat.completion.chunk",
      created: 1,
      model: "m",
      choices: [{ index: 0, delta, finish_reason: null }],
    });
  let out = "";
  for (
    const d of [
      { reasoning_content: "first, " },
      { reasoning_content: "then", content: "Answer" },
    ]
  ) {
    out += (await sink.data(chunk(d))) ?? "";
  }
  const events = out.split("\n").filter((l) => l.startsWith("data: "))
    .map((l) => JSON.parse(l.slice(6)) as Obj);
  const sig = events.find((e) =>
    (e.delta as Obj | undefined)?.type === "signature_delta"
  )!;
  assert.equal((sig.delta as Obj).signature, "signed:first, then");
  const kinds = events.map((e) => (e.delta as Obj | undefined)?.type ?? e.type);
  assert.deepEqual(kinds.slice(-5), [
    "thinking_delta",
    "signature_delta",
    "content_block_stop",
    "content_block_start",
    "text_delta",
  ]);
});
