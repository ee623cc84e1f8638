/**
 * Real clients against the gateway (scripted upstream standing in for a node
 * engine): the official openai SDK, the Vercel AI SDK's OpenAI-compatible
 * provider, and the Anthropic SDK.
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText } from "ai";
import OpenAI from "openai";
import { createWorld } from "../gateway/_testing.ts";

Deno.test("openai SDK: models, chat, stream with usage, base64 embeddings, auth and rate-limit errors", async () => {
  const w = await createWorld({ limits: { rpm: 4 } });
  try {
    const client = new OpenAI({
      apiKey: w.key,
      baseURL: `${w.url}/v1`,
      maxRetries: 0,
    });
    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id).sort(), [
      "tiny-chat",
      "tiny-embed",
    ]);
    const c = await client.chat.completions.create({
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
      max_completion_tokens: 20,
    });
    assert.equal(c.choices[0]!.message.content, "Hello world!");
    assert.equal(c.usage?.completion_tokens, 3);
    const stream = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? "";
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, "Hello world!");
    assert.equal(usage?.total_tokens, 10);
    const e = await client.embeddings.create({
      model: "tiny-embed",
      input: ["a", "b"],
    });
    assert.deepEqual(e.data[0]!.embedding, [0.5, -1, 0.25]);
    const bad = new OpenAI({
      apiKey: "orch_bad",
      baseURL: `${w.url}/v1`,
      maxRetries: 0,
    });
    await assert.rejects(bad.models.list(), OpenAI.AuthenticationError);
    await client.chat.completions.create({
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
    });
    await assert.rejects(
      client.chat.completions.create({
        model: "tiny-chat",
        messages: [{ role: "user", content: "Hi" }],
      }),
      OpenAI.RateLimitError,
    );
  } finally {
    await w.close();
  }
});

Deno.test("AI SDK openai-compatible provider: generateText and streamText with usage", async () => {
  const w = await createWorld();
  try {
    const provider = createOpenAICompatible({
      name: "orchard",
      baseURL: `${w.url}/v1`,
      apiKey: w.key,
      includeUsage: true,
    });
    const g = await generateText({
      model: provider("tiny-chat"),
      prompt: "Hi",
      maxRetries: 0,
    });
    assert.equal(g.text, "Hello world!");
    assert.equal(g.usage.outputTokens, 3);
    const s = streamText({
      model: provider("tiny-chat"),
      prompt: "Hi",
      maxRetries: 0,
    });
    let text = "";
    for await (const part of s.textStream) text += part;
    assert.equal(text, "Hello world!");
    assert.equal((await s.usage).inputTokens, 7);
  } finally {
    await w.close();
  }
});

Deno.test("Anthropic SDK: messages, stream events in order, count_tokens, errors", async () => {
  const w = await createWorld();
  try {
    const client = new Anthropic({
      apiKey: w.key,
      baseURL: w.url,
      maxRetries: 0,
    });
    const m = await client.messages.create({
      model: "tiny-chat",
      max_tokens: 50,
      system: "Be brief",
      messages: [{ role: "user", content: "Hi" }],
    });
    assert.equal(m.type, "message");
    assert.deepEqual(m.content, [{ type: "text", text: "Hello world!" }]);
    assert.equal(m.stop_reason, "end_turn");
    assert.equal(m.usage.output_tokens, 3);
    const events: string[] = [];
    const stream = client.messages.stream({
      model: "tiny-chat",
      max_tokens: 50,
      messages: [{ role: "user", content: "Hi" }],
    });
    for await (const ev of stream) events.push(ev.type);
    const final = await stream.finalMessage();
    assert.equal((final.content[0] as { text: string }).text, "Hello world!");
    assert.equal(final.usage.output_tokens, 3);
    const dedup = events.filter((e, i) => e !== events[i - 1]);
    assert.deepEqual(dedup, [
      "message_start",
      "content_block_start",
      "content_block_delta",
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    const n = await client.messages.countTokens({
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
    });
    assert.ok(n.input_tokens > 0);
    const bad = new Anthropic({
      apiKey: "nope",
      baseURL: w.url,
      maxRetries: 0,
    });
    await assert.rejects(
      bad.messages.create({
        model: "tiny-chat",
        max_tokens: 5,
        messages: [{ role: "user", content: "Hi" }],
      }),
      Anthropic.AuthenticationError,
    );
    const raw = await fetch(w.url + "/v1/messages", {
      method: "POST",
      headers: {
        authorization: `Bearer ${w.key}`,
        "content-type": "application/json",
      },
      body: JSON.stringify({
        model: "tiny-chat",
        max_tokens: 9,
        stream: true,
        messages: [{ role: "user", content: "Hi" }],
      }),
    });
    const names = (await raw.text()).split("\n").filter((l) =>
      l.startsWith("event: ")
    ).map((l) => l.slice(7));
    assert.deepEqual(names.slice(0, 4), [
      "message_start",
      "content_block_start",
      "ping",
      "content_block_delta",
    ]);
    assert.deepEqual(names.slice(-3), [
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
  } finally {
    await w.close();
  }
});
