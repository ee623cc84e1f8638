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
  // heartbeats every second, not the fixture's 250 ms: the gateway re-reads
  // node status from KV only every 500 ms and calls a node unhealthy after
  // 3 intervals, so at 250 ms a node that is fine flickers to "unhealthy"
  // for a moment now and then (a 503 model_unavailable, or a queued request
  // never woken until its 120 s deadline, 503 server_busy); nothing here
  // tests heartbeats
  await using cluster = await startCluster({
    slots: 4,
    threads: 1,
    heartbeatMs: 1000,
  });
  const openai = new OpenAI({
    apiKey: cluster.apiKey,
    baseURL: `${cluster.url}/v1`,
    maxRetries: 0,
  });
  const user = { role: "user" as const, content: "Weather in Paris?" };

  await t.step(
    "openai SDK: a required tool call, its result sent back, the loop completes",
    async () => {
      // one call: parallel calls are unbounded in number (the random model
      // may chain them until max_tokens); one call fits in 600 tokens
      const first = await openai.chat.completions.create({
        model: "tiny",
        messages: [user],
        tools: TOOLS,
        tool_choice: "required",
        parallel_tool_calls: false,
        seed: 1,
        max_tokens: 600,
      });
      const choice = first.choices[0]!;
      assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(choice));
      const calls = choice.message.tool_calls ?? [];
      assert.equal(calls.length, 1);
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
        seed: 2,
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
        seed: 3,
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
      // one call a step, so that each step ends with its call (parallel
      // calls may run into maxOutputTokens, which ends the loop)
      const providerOptions = { orchard: { parallel_tool_calls: false } };
      const described = (steps: { finishReason: string; content: unknown }[]) =>
        JSON.stringify(steps.map((s) => [s.finishReason, s.content]));
      const g = await generateText({
        model: provider("tiny"),
        prompt: "Weather in Paris?",
        tools,
        toolChoice: "required",
        stopWhen: stepCountIs(2),
        maxOutputTokens: 600,
        seed: 4,
        providerOptions,
      });
      assert.equal(g.steps.length, 2, described(g.steps));
      for (const step of g.steps) {
        assert.equal(step.finishReason, "tool-calls", described(g.steps));
        assert.equal(step.toolCalls.length, 1, described(g.steps));
        assert.equal(step.toolResults.length, 1, described(g.steps));
      }
      assert.equal(seen.length, 2, "the tool ran in both steps");
      for (const input of seen) {
        assert.ok(validWeather(input), JSON.stringify(input));
      }

      seen.length = 0;
      const s = streamText({
        model: provider("tiny"),
        prompt: "Weather in Oslo?",
        tools,
        toolChoice: "required",
        stopWhen: stepCountIs(2),
        maxOutputTokens: 600,
        seed: 5,
        providerOptions,
      });
      const steps = await s.steps;
      assert.equal(steps.length, 2, described(steps));
      for (const step of steps) {
        assert.equal(step.finishReason, "tool-calls", described(steps));
        assert.equal(step.toolCalls.length, 1, described(steps));
        assert.equal(step.toolResults.length, 1, described(steps));
      }
      assert.equal(seen.length, 2, "the tool ran in both steps");
      for (const input of seen) {
        assert.ok(validWeather(input), JSON.stringify(input));
      }
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
      // one tool_use block: parallel calls may run into max_tokens
      const msg = await anthropic.messages.create({
        model: "tiny",
        max_tokens: 600,
        messages: [user],
        tools: atools,
        tool_choice: { type: "any", disable_parallel_tool_use: true },
      });
      assert.equal(msg.stop_reason, "tool_use", JSON.stringify(msg));
      const uses = msg.content.filter((b) => b.type === "tool_use");
      assert.equal(uses.length, 1, JSON.stringify(msg));
      const use = uses[0]!;
      assert.equal(use.name, "get_weather");
      assert.ok(validWeather(use.input), JSON.stringify(use.input));

      const stream = anthropic.messages.stream({
        model: "tiny",
        max_tokens: 600,
        messages: [user],
        tools: atools,
        tool_choice: {
          type: "tool",
          name: "get_weather",
          disable_parallel_tool_use: true,
        },
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
      assert.equal(final.stop_reason, "tool_use", JSON.stringify(final));
      assert.equal(starts, 1);
      assert.ok(validWeather(JSON.parse(json)), json);
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
      // any JSON object: its size is unbounded, so the random model may run
      // into max_tokens; what ends before it must be a JSON object, what
      // stops at it must say so
      const objs = await Promise.all(
        Array.from({ length: 8 }, (_, i) =>
          openai.chat.completions.create({
            model: "tiny",
            messages: [{ role: "user", content: "JSON" }],
            response_format: { type: "json_object" },
            seed: 100 + i,
            max_tokens: 400,
          })),
      );
      let parsedObjects = 0;
      for (const r of objs) {
        const c = r.choices[0]!;
        const text = c.message.content!;
        const cut = r.usage!.completion_tokens === 400;
        assert.equal(c.finish_reason, cut ? "length" : "stop", text);
        if (cut) continue;
        const parsed = JSON.parse(text);
        assert.equal(typeof parsed, "object", text);
        assert.ok(parsed !== null && !Array.isArray(parsed), text);
        parsedObjects++;
      }
      assert.ok(
        parsedObjects >= 2,
        `${parsedObjects} of 8 ended before 400 tokens`,
      );
    },
  );

  await t.step(
    "logprobs and top_logprobs come back in OpenAI's shape",
    async () => {
      // sampled text may end early (the model samples its end token) and
      // may hold bytes that are not UTF-8 on their own: the entries' bytes,
      // not their token strings, make up the content
      let full = 0;
      for (const seed of [1, 2, 3, 4]) {
        const r = await openai.chat.completions.create({
          model: "tiny",
          messages: [user],
          logprobs: true,
          top_logprobs: 3,
          seed,
          max_tokens: 8,
        });
        const c = r.choices[0]!;
        const lp = c.logprobs!.content!;
        const what = JSON.stringify({ finish: c.finish_reason, lp });
        // an entry a completion token; the gateway bills no more tokens
        // than the answer has bytes (a control token sampled in free text
        // is an entry with no bytes)
        assert.equal(
          r.usage!.completion_tokens,
          Math.min(
            lp.length,
            new TextEncoder().encode(c.message.content ?? "").length,
          ),
          what,
        );
        assert.equal(
          c.finish_reason,
          lp.length === 8 ? "length" : "stop",
          what,
        );
        if (lp.length === 8) full++;
        for (const t of lp) {
          assert.ok(t.logprob <= 0);
          assert.equal(t.top_logprobs.length, 3);
          assert.ok(t.top_logprobs[0]!.logprob >= t.top_logprobs[2]!.logprob);
          assert.ok(t.logprob <= t.top_logprobs[0]!.logprob + 1e-6);
          assert.equal(
            t.token,
            new TextDecoder().decode(new Uint8Array(t.bytes!)),
          );
        }
        assert.equal(
          new TextDecoder().decode(new Uint8Array(lp.flatMap((t) => t.bytes!))),
          c.message.content,
          what,
        );
      }
      assert.ok(full >= 1, "no run reached max_tokens");
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
          // greedy: the fixture's first token is then printable text, never
          // the end token, so both answers have a first content delta
          temperature: 0,
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
          // greedy: the fixture never picks its end token then, so the
          // answer runs to max_tokens
          temperature: 0,
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
      assert.equal(body.stop_reason, "max_tokens", JSON.stringify(body));
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
