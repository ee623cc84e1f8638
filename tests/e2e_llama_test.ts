/**
 * End to end: the real Orchard (portal, gateway, fleet) on loopback, a real
 * node worker enrolled with a join token and serving a generated GGUF
 * through the llama engine, and real clients: the official openai SDK, the
 * Vercel AI SDK's OpenAI-compatible provider and the Anthropic SDK.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import Anthropic from "@anthropic-ai/sdk";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText } from "ai";
import OpenAI from "openai";
import { startNodeWorker } from "../node/worker.ts";
import { createApiKey } from "../store/api_keys.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import { getNode } from "../store/nodes.ts";
import {
  LLAMA_LIB_DIR,
  readLlamaManifest,
} from "../node/native/llama_build.ts";
import { SYSTEM } from "../store/principal.ts";
import { writeFixtureModel } from "../tools/fixture_model.ts";
import { createWorld } from "./_helpers.ts";

async function llamaWorld() {
  const w = await createWorld({ config: { allowPrivateNodeUrls: true } });
  const server = Deno.serve({
    port: 0,
    hostname: "127.0.0.1",
    onListen: () => {},
  }, w.app.fetch);
  const url = `http://127.0.0.1:${server.addr.port}`;
  const models = await Deno.makeTempDir({ prefix: "orchard-e2e-models-" });
  const state = await Deno.makeTempDir({ prefix: "orchard-e2e-node-" });
  await writeFixtureModel(join(models, "tiny.gguf"), { seed: 3 });
  const node = await startNodeWorker({
    gatewayUrl: url,
    joinToken: (await createJoinToken(w.store, SYSTEM, {})).token,
    engine: "llama",
    modelsDir: models,
    slots: 4,
    threads: 1,
    port: 0,
    host: "127.0.0.1",
    stateDir: state,
    heartbeatMs: 1000,
    linktest: null,
  });
  const deadline = Date.now() + 10_000;
  while (w.orchard.fleet.candidates("tiny").length === 0) {
    if (Date.now() > deadline) throw new Error("node never became routable");
    await new Promise((r) => setTimeout(r, 25));
    await w.orchard.fleet.refresh();
  }
  const key = async (limits: Record<string, number> | null = null) =>
    (await createApiKey(w.store, SYSTEM, w.tenantA.id, { name: "e2e", limits }))
      .key;
  return {
    w,
    url,
    key,
    nodeId: node.nodeId,
    async [Symbol.asyncDispose]() {
      await node.close();
      await server.shutdown();
      await w.close();
      await Deno.remove(models, { recursive: true });
      await Deno.remove(state, { recursive: true });
    },
  };
}

Deno.test("e2e with the llama engine: openai SDK, AI SDK and Anthropic SDK through the gateway", async (t) => {
  await using world = await llamaWorld();
  const apiKey = await world.key();

  await t.step(
    "the node reports which llama.cpp it loaded: the build with RPC when there is one",
    async () => {
      const { probe } = await getNode(world.w.store, SYSTEM, world.nodeId);
      const llama = probe?.llama as Record<string, unknown> | undefined;
      const built = !Deno.env.get("ORCHARD_LLAMA_LIB_DIR") &&
        readLlamaManifest(LLAMA_LIB_DIR);
      assert.equal(llama?.build, built ? "built" : "prebuilt");
      assert.equal(llama?.rpc, !!built);
      assert.match(String(llama?.version), /^0\.4\.0/);
    },
  );

  await t.step(
    "openai SDK: models, chat, stream with usage, base64 embeddings, auth and rate-limit errors",
    async () => {
      const client = new OpenAI({
        apiKey,
        baseURL: `${world.url}/v1`,
        maxRetries: 0,
      });
      const models = await client.models.list();
      assert.deepEqual(models.data.map((m) => m.id), ["tiny"]);
      const c = await client.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "Hi" }],
        max_completion_tokens: 8,
        temperature: 0,
      });
      const text = c.choices[0]!.message.content!;
      assert.equal(text.length, 8); // printable ASCII gibberish: one byte per token
      assert.equal(c.usage?.completion_tokens, 8);
      assert.equal(c.usage?.prompt_tokens, 99); // Qwen 2.5's default system message + "Hi"
      const stream = await client.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "Hi" }],
        max_tokens: 8,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
      });
      let streamed = "";
      let usage: OpenAI.CompletionUsage | null | undefined;
      for await (const chunk of stream) {
        streamed += chunk.choices[0]?.delta?.content ?? "";
        if (chunk.usage) usage = chunk.usage;
      }
      assert.equal(streamed, text);
      assert.equal(usage?.total_tokens, 99 + 8);
      const e = await client.embeddings.create({
        model: "tiny",
        input: ["a", "b"],
      }); // SDK asks for base64
      assert.equal(e.data.length, 2);
      assert.equal(e.data[0]!.embedding.length, 64);
      assert.ok(Math.abs(Math.hypot(...e.data[0]!.embedding) - 1) < 1e-4);
      const bad = new OpenAI({
        apiKey: "orch_bad",
        baseURL: `${world.url}/v1`,
        maxRetries: 0,
      });
      await assert.rejects(bad.models.list(), OpenAI.AuthenticationError);
      const limited = new OpenAI({
        apiKey: await world.key({ rpm: 1 }),
        baseURL: `${world.url}/v1`,
        maxRetries: 0,
      });
      await limited.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "Hi" }],
        max_tokens: 2,
      });
      await assert.rejects(
        limited.chat.completions.create({
          model: "tiny",
          messages: [{ role: "user", content: "Hi" }],
          max_tokens: 2,
        }),
        OpenAI.RateLimitError,
      );
    },
  );

  await t.step("AI SDK: generateText and streamText with usage", async () => {
    const provider = createOpenAICompatible({
      name: "orchard",
      baseURL: `${world.url}/v1`,
      apiKey,
      includeUsage: true,
    });
    const g = await generateText({
      model: provider("tiny"),
      prompt: "Hi",
      maxOutputTokens: 6,
      temperature: 0,
      maxRetries: 0,
    });
    assert.equal(g.text.length, 6);
    assert.equal(g.usage.outputTokens, 6);
    const s = streamText({
      model: provider("tiny"),
      prompt: "Hi",
      maxOutputTokens: 6,
      temperature: 0,
      maxRetries: 0,
    });
    let text = "";
    for await (const part of s.textStream) text += part;
    assert.equal(text, g.text);
    assert.equal((await s.usage).outputTokens, 6);
  });

  await t.step("Anthropic SDK: messages, stream, count_tokens", async () => {
    const client = new Anthropic({ apiKey, baseURL: world.url, maxRetries: 0 });
    // Greedy, so both replies are full and equal: sampling could draw an end
    // token from the fixture's flat logits. The gateway passes `temperature`
    // on; this SDK's types omit it, its requests carry it.
    const params = {
      model: "tiny",
      max_tokens: 5,
      temperature: 0,
      messages: [{ role: "user" as const, content: "Hi" }],
    };
    const m = await client.messages.create(
      params as unknown as Anthropic.MessageCreateParamsNonStreaming,
    );
    assert.equal(m.type, "message");
    assert.equal(m.stop_reason, "max_tokens");
    assert.equal(m.usage.output_tokens, 5);
    const text = (m.content[0] as { text: string }).text;
    const stream = client.messages.stream(
      params as unknown as Anthropic.MessageStreamParams,
    );
    const events: string[] = [];
    for await (const ev of stream) events.push(ev.type);
    const final = await stream.finalMessage();
    assert.equal((final.content[0] as { text: string }).text, text);
    assert.equal(final.usage.output_tokens, 5);
    assert.deepEqual(events.filter((e, i) => e !== events[i - 1]), [
      "message_start",
      "content_block_start",
      "content_block_delta",
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    const n = await client.messages.countTokens({
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
    });
    assert.ok(n.input_tokens > 0);
  });

  await t.step(
    "usage is metered per request with the node's exact counts",
    async () => {
      const { usageTotals } = await import("../store/usage.ts");
      const deadline = Date.now() + 5000;
      let totals;
      while (Date.now() < deadline) {
        // Usage is written in batches: flush what the gateway holds.
        await world.w.orchard.gateway.idle();
        totals = await usageTotals(world.w.store, {
          tenantId: world.w.tenantA.id,
          from: Date.now() - 3_600_000,
          to: Date.now() + 60_000,
          granularity: "hour",
        });
        // The last stream's record may land after its client has read the
        // end: wait for every request, not just most of them.
        if (
          totals.requests >= 8 &&
          totals.completionTokens >= 8 + 8 + 2 + 6 + 6 + 5 + 5
        ) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.ok(totals && totals.requests >= 8, JSON.stringify(totals));
      assert.ok(totals.completionTokens >= 8 + 8 + 2 + 6 + 6 + 5 + 5);
    },
  );
});
