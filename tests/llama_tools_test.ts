/**
 * Tools, structured output, logprobs, prompt reuse and honest refusals on
 * the llama engine, as agents and extraction clients use them: a real
 * gateway and node process on the tiny fixture model (random weights, Qwen
 * 2.5's chat template with tools in its GGUF), with the official openai
 * SDK, the Vercel AI SDK and the Anthropic SDK. The model's weights are
 * random: valid calls and JSON come from the grammar, which is the point.
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";
import { Ajv } from "ajv";
import OpenAI from "openai";
import { startCluster } from "./fixtures/cluster.ts";

const WEATHER = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 24 },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    days: { type: "integer", minimum: 1, maximum: 7 },
  },
  required: ["city", "unit"],
  additionalProperties: false,
} as const;

const TIME = {
  type: "object",
  properties: { zone: { type: "string", maxLength: 16 } },
  required: ["zone"],
  additionalProperties: false,
} as const;

const TOOLS: OpenAI.ChatCompletionTool[] = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Weather forecast",
      parameters: WEATHER,
    },
  },
  {
    type: "function",
    function: { name: "get_time", description: "Time", parameters: TIME },
  },
];

const ajv = new Ajv();
const validWeather = ajv.compile(WEATHER);
const validTime = ajv.compile(TIME);

function checkCall(name: string, args: string) {
  const parsed = JSON.parse(args);
  const ok = name === "get_weather" ? validWeather(parsed) : validTime(parsed);
  assert.ok(ok, `${name}(${args}) does not match its schema`);
  return parsed;
}

Deno.test({
  name:
    "llama engine: tools, structured output, logprobs, prompt reuse and refusals through gateway and node",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  await using cluster = await startCluster({ slots: 4, threads: 1 });
  const openai = new OpenAI({
    apiKey: cluster.apiKey,
    baseURL: `${cluster.url}/v1`,
    maxRetries: 0,
  });
  const user = { role: "user" as const, content: "Weather in Paris?" };

  await t.step(
    "openai SDK: a required tool call, its result sent back, the loop completes",
    async () => {
      const first = await openai.chat.completions.create({
        model: "tiny",
        messages: [user],
        tools: TOOLS,
        tool_choice: "required",
        max_tokens: 600,
      });
      const choice = first.choices[0]!;
      assert.equal(choice.finish_reason, "tool_calls");
      const calls = choice.message.tool_calls ?? [];
      assert.ok(calls.length >= 1);
      for (const c of calls) {
        assert.equal(c.type, "function");
        if (c.type !== "function") continue;
        assert.match(c.id, /^call_/);
        checkCall(c.function.name, c.function.arguments);
      }
      const second = await openai.chat.completions.create({
        model: "tiny",
        messages: [
          user,
          choice.message,
          ...calls.map((c) => ({
            role: "tool" as const,
            tool_call_id: c.id,
            content: JSON.stringify({ temperature: 18 }),
          })),
        ],
        tools: TOOLS,
        tool_choice: "none",
        max_tokens: 16,
      });
      assert.ok(["stop", "length"].includes(second.choices[0]!.finish_reason));
      assert.equal(typeof second.choices[0]!.message.content, "string");
      const without = await openai.chat.completions.create({
        model: "tiny",
        messages: [user],
        tools: TOOLS,
        tool_choice: "none",
        max_tokens: 1,
      });
      assert.ok(
        second.usage!.prompt_tokens > without.usage!.prompt_tokens + 10,
        "the call and its result are part of the second prompt",
      );
    },
  );

  await t.step(
    "openai SDK: a named tool, no parallel calls, streamed as OpenAI streams tool_calls",
    async () => {
      const stream = await openai.chat.completions.create({
        model: "tiny",
        messages: [user],
        tools: TOOLS,
        tool_choice: { type: "function", function: { name: "get_time" } },
        parallel_tool_calls: false,
        max_tokens: 600,
        stream: true,
      });
      const calls = new Map<
        number,
        { id: string; name: string; args: string }
      >();
      let finish: string | null = null;
      let deltas = 0;
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (!c) continue;
        if (c.finish_reason) finish = c.finish_reason;
        for (const tc of c.delta.tool_calls ?? []) {
          deltas++;
          const known = calls.get(tc.index);
          if (!known) {
            assert.ok(
              tc.id && tc.function?.name,
              "the first delta has id and name",
            );
            assert.equal(tc.type, "function");
            calls.set(tc.index, {
              id: tc.id,
              name: tc.function.name,
              args: tc.function.arguments ?? "",
            });
          } else {
            assert.equal(tc.id, undefined, "the id comes once");
            assert.equal(tc.function?.name, undefined, "the name comes once");
            known.args += tc.function?.arguments ?? "";
          }
        }
      }
      assert.equal(finish, "tool_calls");
      assert.equal(calls.size, 1);
      const call = calls.get(0)!;
      assert.equal(call.name, "get_time");
      checkCall(call.name, call.args);
      assert.ok(deltas > 2, "arguments arrive in pieces");
    },
  );

  await t.step(
    "AI SDK: generateText and streamText run tools over several steps",
    async () => {
      const provider = createOpenAICompatible({
        name: "orchard",
        baseURL: `${cluster.url}/v1`,
        apiKey: cluster.apiKey,
      });
      const seen: unknown[] = [];
      const tools = {
        get_weather: tool({
          description: "Weather forecast",
          inputSchema: jsonSchema<{ city: string; unit: string }>(
            WEATHER as unknown as Parameters<typeof jsonSchema>[0],
          ),
          execute: (input) => {
            seen.push(input);
            return Promise.resolve({ temperature: 18 });
          },
        }),
      };
      const g = await generateText({
        model: provider("tiny"),
        prompt: "Weather in Paris?",
        tools,
        toolChoice: "required",
        stopWhen: stepCountIs(2),
        maxOutputTokens: 600,
      });
      assert.equal(g.steps.length, 2);
      assert.ok(g.steps[0]!.toolCalls.length >= 1);
      assert.ok(g.steps[0]!.toolResults.length >= 1);
      assert.ok(seen.length >= 2, "the tool ran in both steps");
      for (const input of seen) assert.ok(validWeather(input));

      seen.length = 0;
      const s = streamText({
        model: provider("tiny"),
        prompt: "Weather in Oslo?",
        tools,
        toolChoice: "required",
        stopWhen: stepCountIs(2),
        maxOutputTokens: 600,
      });
      const steps = await s.steps;
      assert.equal(steps.length, 2);
      assert.ok(seen.length >= 2);
      for (const input of seen) assert.ok(validWeather(input));
    },
  );

  await t.step(
    "Anthropic SDK: tool_use blocks and input_json_delta events",
    async () => {
      const anthropic = new Anthropic({
        apiKey: cluster.apiKey,
        baseURL: cluster.url,
        maxRetries: 0,
      });
      const atools = [{
        name: "get_weather",
        description: "Weather forecast",
        input_schema: WEATHER as unknown as Anthropic.Tool.InputSchema,
      }];
      const msg = await anthropic.messages.create({
        model: "tiny",
        max_tokens: 600,
        messages: [user],
        tools: atools,
        tool_choice: { type: "any" },
      });
      assert.equal(msg.stop_reason, "tool_use");
      const use = msg.content.find((b) => b.type === "tool_use");
      assert.ok(use && use.type === "tool_use");
      assert.ok(validWeather(use.input));

      const stream = anthropic.messages.stream({
        model: "tiny",
        max_tokens: 600,
        messages: [user],
        tools: atools,
        tool_choice: { type: "tool", name: "get_weather" },
      });
      let json = "";
      let starts = 0;
      for await (const e of stream) {
        if (
          e.type === "content_block_start" &&
          e.content_block.type === "tool_use"
        ) {
          starts++;
        }
        if (
          e.type === "content_block_delta" &&
          e.delta.type === "input_json_delta"
        ) {
          json += e.delta.partial_json;
        }
      }
      const final = await stream.finalMessage();
      assert.ok(starts >= 1);
      assert.ok(validWeather(JSON.parse(json.split(/(?<=\})(?=\{)/)[0]!)));
      assert.equal(final.stop_reason, "tool_use");
    },
  );

  await t.step(
    "response_format json_schema: 20 of 20 outputs parse and validate",
    async () => {
      const schema = {
        type: "object",
        properties: {
          title: { type: "string", maxLength: 40 },
          rating: { type: "integer", minimum: 0, maximum: 10 },
          tags: {
            type: "array",
            items: { type: "string", maxLength: 12 },
            maxItems: 3,
          },
          verdict: { enum: ["buy", "hold", "sell"] },
          note: { type: ["string", "null"], maxLength: 20 },
        },
        required: ["title", "rating", "tags", "verdict", "note"],
        additionalProperties: false,
      };
      const valid = ajv.compile(schema);
      const runs: OpenAI.ChatCompletion[] = [];
      for (let batch = 0; batch < 4; batch++) {
        runs.push(
          ...await Promise.all(Array.from({ length: 5 }, (_, j) => {
            const i = batch * 5 + j;
            return openai.chat.completions.create({
              model: "tiny",
              messages: [{ role: "user", content: `Review ${i}` }],
              response_format: {
                type: "json_schema",
                json_schema: { name: "review", schema, strict: true },
              },
              temperature: 1,
              seed: i,
              max_tokens: 400,
            });
          })),
        );
      }
      assert.equal(runs.length, 20);
      for (const r of runs) {
        const text = r.choices[0]!.message.content!;
        assert.equal(r.choices[0]!.finish_reason, "stop", text);
        assert.ok(valid(JSON.parse(text)), text);
      }
      const obj = await openai.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "JSON" }],
        response_format: { type: "json_object" },
        max_tokens: 400,
      });
      const parsed = JSON.parse(obj.choices[0]!.message.content!);
      assert.equal(typeof parsed, "object");
      assert.ok(parsed !== null && !Array.isArray(parsed));
    },
  );

  await t.step(
    "logprobs and top_logprobs come back in OpenAI's shape",
    async () => {
      const r = await openai.chat.completions.create({
        model: "tiny",
        messages: [user],
        logprobs: true,
        top_logprobs: 3,
        max_tokens: 8,
      });
      const lp = r.choices[0]!.logprobs!.content!;
      assert.equal(lp.length, 8);
      for (const t of lp) {
        assert.ok(t.logprob <= 0);
        assert.equal(t.top_logprobs.length, 3);
        assert.ok(t.top_logprobs[0]!.logprob >= t.top_logprobs[2]!.logprob);
        assert.ok(t.logprob <= t.top_logprobs[0]!.logprob + 1e-6);
      }
      assert.equal(
        lp.map((t) => t.token).join(""),
        r.choices[0]!.message.content,
      );
    },
  );

  await t.step(
    "a repeated long system prompt is reused from the cache and billed exactly",
    async () => {
      const system = "You are a careful assistant. ".repeat(60); // ~1,500 tokens
      const ask = async (q: string) => {
        const t0 = performance.now();
        const stream = await openai.chat.completions.create({
          model: "tiny",
          messages: [{ role: "system", content: system }, {
            role: "user",
            content: q,
          }],
          max_tokens: 4,
          stream: true,
          stream_options: { include_usage: true },
        });
        let first = 0;
        let usage: OpenAI.CompletionUsage | undefined;
        for await (const c of stream) {
          if (!first && c.choices[0]?.delta?.content) {
            first = performance.now() - t0;
          }
          if (c.usage) usage = c.usage;
        }
        return { first, usage: usage! };
      };
      const cold = await ask("A question?");
      const warm = await ask("A question?");
      assert.ok(cold.usage.prompt_tokens > 1400, `${cold.usage.prompt_tokens}`);
      assert.equal(warm.usage.prompt_tokens, cold.usage.prompt_tokens);
      assert.ok(
        (warm.usage.prompt_tokens_details?.cached_tokens ?? 0) >
          cold.usage.prompt_tokens - 20,
        JSON.stringify(warm.usage),
      );
      assert.ok(warm.first < cold.first, `${warm.first} vs ${cold.first} ms`);
    },
  );

  await t.step(
    "Anthropic Messages with system entries inside messages (Claude Code) are served",
    async () => {
      const res = await fetch(`${cluster.url}/v1/messages`, {
        method: "POST",
        headers: {
          "x-api-key": cluster.apiKey,
          "content-type": "application/json",
          "anthropic-version": "2023-06-01",
        },
        body: JSON.stringify({
          model: "tiny",
          max_tokens: 4,
          system: [{ type: "text", text: "You are a coding agent." }],
          messages: [
            { role: "user", content: "Fix the bug." },
            { role: "assistant", content: "Looking." },
            {
              role: "system",
              content: [{ type: "text", text: "Reminder: be brief." }],
            },
            { role: "user", content: "Go on." },
          ],
        }),
      });
      const body = await res.json();
      assert.equal(res.status, 200, JSON.stringify(body));
      assert.equal(body.type, "message");
      assert.equal(body.usage.output_tokens, 4);
    },
  );

  await t.step(
    "fields the engine cannot honour are refused by name",
    async () => {
      for (
        const [field, value] of [
          ["logit_bias", { "50": 1 }],
          ["audio", { voice: "alloy", format: "mp3" }],
          ["reasoning_effort", "high"],
          ["store", true],
          ["n", 2],
        ] as const
      ) {
        const res = await fetch(`${cluster.url}/v1/chat/completions`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${cluster.apiKey}`,
            "content-type": "application/json",
          },
          body: JSON.stringify({
            model: "tiny",
            messages: [user],
            max_tokens: 2,
            [field]: value,
          }),
        });
        const body = await res.json();
        assert.equal(res.status, 400, `${field}: ${JSON.stringify(body)}`);
        assert.equal(body.error.param, field);
      }
    },
  );
});
