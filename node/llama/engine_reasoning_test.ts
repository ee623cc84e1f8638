/**
 * Reasoning on the llama engine with real llama.cpp: fixture models with
 * Qwen3's chat template (an `enable_thinking` switch) and with a
 * generation prompt that opens `<think>` (Qwen3-Thinking, DeepSeek R1).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { writeFixtureModel } from "../../tools/fixture_model.ts";
import {
  HARMONY_SHAPE_TEMPLATE,
  QWEN3_TEMPLATE,
  QWEN3_THINKING_TEMPLATE,
} from "../../tools/fixture_templates.ts";
import { log } from "../../lib/log.ts";
import { OpenAIError } from "../../protocol/openai/errors.ts";
import { sseData } from "../../lib/sse.ts";
import { createLlamaEngine } from "./engine.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");
log.reload();

const HI = [{ role: "user", content: "hi" }];
const never = new AbortController().signal;

Deno.test("llama engine: reasoning_effort reaches the template's switch, and <think> output comes back as reasoning_content", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "orchard-reasoning-" });
  await writeFixtureModel(join(dir, "tiny.gguf"), { seed: 1 });
  await writeFixtureModel(join(dir, "qwen3.gguf"), {
    seed: 1,
    template: QWEN3_TEMPLATE,
  });
  await writeFixtureModel(join(dir, "thinker.gguf"), {
    seed: 1,
    template: QWEN3_THINKING_TEMPLATE,
  });
  await writeFixtureModel(join(dir, "harmony.gguf"), {
    seed: 1,
    template: HARMONY_SHAPE_TEMPLATE,
  });
  const e = createLlamaEngine({ modelsDir: dir, slots: 2, threads: 2 });
  try {
    await e.start();

    await t.step("the listing reports each model's reasoning", async () => {
      const byId = Object.fromEntries(
        (await e.models()).map((m) => [m.id, m.reasoning]),
      );
      assert.deepEqual(byId, {
        harmony: { control: "reasoning_effort", parses: true },
        qwen3: { control: "enable_thinking", parses: true },
        thinker: { control: null, parses: true },
        tiny: { control: null, parses: false },
      });
    });

    await t.step(
      "a model without a control refuses reasoning_effort, naming it",
      async () => {
        for (const [model, effort] of [["tiny", "high"], ["qwen3", "huge"]]) {
          await assert.rejects(
            async () =>
              await e.chatCompletions({
                model,
                messages: HI,
                reasoning_effort: effort,
              }, never),
            (err: unknown) => {
              assert.ok(err instanceof OpenAIError);
              assert.equal(err.status, 400);
              assert.equal(err.param, "reasoning_effort");
              return true;
            },
          );
        }
      },
    );

    await t.step(
      "effort none renders Qwen3's empty think block (19 more prompt tokens); high renders the default",
      async () => {
        const count = (effort?: string) =>
          e.countTokens!({
            model: "qwen3",
            messages: HI,
            ...(effort ? { reasoning_effort: effort } : {}),
          }, never);
        const base = (await count()).promptTokens;
        assert.equal((await count("high")).promptTokens, base);
        // "<think>\n\n</think>\n\n": 19 bytes, one byte token each
        assert.equal((await count("none")).promptTokens, base + 19);
        assert.equal((await count("minimal")).promptTokens, base + 19);
        const r = await (await e.chatCompletions({
          model: "qwen3",
          messages: HI,
          temperature: 0,
          max_tokens: 6,
          reasoning_effort: "none",
        }, never)).json();
        assert.equal(r.usage.prompt_tokens, base + 19);
        assert.ok(r.choices[0].message.content.length > 0);
        // no "<think>" at the start of this output: nothing is reasoning
        assert.equal(r.choices[0].message.reasoning_content, undefined);
      },
    );

    await t.step(
      "a Harmony template gets reasoning_effort as is",
      async () => {
        const count = async (effort: string) =>
          (await e.countTokens!({
            model: "harmony",
            messages: HI,
            reasoning_effort: effort,
          }, never)).promptTokens;
        // "Reasoning: medium" vs "Reasoning: low": 3 more byte tokens
        assert.equal(await count("medium"), (await count("low")) + 3);
        const r = await (await e.chatCompletions({
          model: "harmony",
          messages: HI,
          temperature: 0,
          max_tokens: 6,
          reasoning_effort: "high",
        }, never)).json();
        // no channel markers in this gibberish: it is all content
        assert.ok(r.choices[0].message.content.length > 0);
      },
    );

    await t.step(
      "Qwen3 with a required tool: the call is parsed (its grammar allows no thinking first)",
      async () => {
        const r = await (await e.chatCompletions({
          model: "qwen3",
          messages: HI,
          temperature: 0,
          max_tokens: 120,
          parallel_tool_calls: false,
          tools: [{
            type: "function",
            function: {
              name: "weather",
              parameters: {
                type: "object",
                properties: { city: { type: "string", maxLength: 4 } },
                required: ["city"],
                additionalProperties: false,
              },
            },
          }],
          tool_choice: "required",
        }, never)).json();
        const m = r.choices[0].message;
        const call = m.tool_calls?.[0]?.function;
        assert.equal(call?.name, "weather", JSON.stringify(m));
        assert.match(call.arguments, /^\{"city"\s*:\s*"/);
        assert.equal(m.content, null);
        assert.equal(m.reasoning_content, undefined);
      },
    );

    await t.step(
      "after a prompt that opens <think>, the output is reasoning_content, streamed and not",
      async () => {
        const body = {
          model: "thinker",
          messages: HI,
          temperature: 0,
          max_tokens: 10,
        };
        const whole = await (await e.chatCompletions(body, never)).json();
        const msg = whole.choices[0].message;
        assert.ok(msg.reasoning_content.length > 0, JSON.stringify(msg));
        assert.equal(msg.content, "");
        assert.equal(whole.usage.completion_tokens, 10);
        const res = await e.chatCompletions({ ...body, stream: true }, never);
        let reasoning = "";
        let content = "";
        for await (const data of sseData(res.body!)) {
          if (data === "[DONE]") break;
          const d = JSON.parse(data).choices?.[0]?.delta ?? {};
          reasoning += d.reasoning_content ?? "";
          content += d.content ?? "";
        }
        assert.equal(reasoning, msg.reasoning_content);
        assert.equal(content, "");

        // a structured answer's grammar waits for </think>: the thinking
        // stays free (the same greedy text), not JSON forced inside it
        const json = await (await e.chatCompletions({
          ...body,
          response_format: { type: "json_object" },
        }, never)).json();
        assert.equal(
          json.choices[0].message.reasoning_content,
          msg.reasoning_content,
        );
      },
    );
  } finally {
    await e.close();
    await Deno.remove(dir, { recursive: true });
  }
});
