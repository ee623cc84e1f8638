/**
 * OpenAI's Responses API as agent tooling uses it: the official openai SDK
 * (`client.responses.create`, `.stream`, `.retrieve`, `.delete`) against a
 * real gateway and llama node process on the tiny fixture model (random
 * weights: valid calls and JSON come from the grammar; seeds, one call at
 * a time and greedy decoding keep its output bounded, and what it may or
 * may not do is asserted both ways, as tests/llama_tools_test.ts does).
 */
import assert from "node:assert/strict";
import { Ajv } from "ajv";
import OpenAI from "openai";
import { startCluster } from "./fixtures/cluster.ts";

const WEATHER = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 24 },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
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

const TOOLS: OpenAI.Responses.FunctionTool[] = [
  {
    type: "function",
    name: "get_weather",
    description: "Weather forecast",
    parameters: WEATHER,
    strict: true,
  },
  {
    type: "function",
    name: "get_time",
    description: "Time",
    parameters: TIME,
    strict: true,
  },
];

const ajv = new Ajv();
const valid = {
  get_weather: ajv.compile(WEATHER),
  get_time: ajv.compile(TIME),
};

/** A seed: an extension the gateway forwards (not in the SDK's types). */
const seeded = (seed: number) => ({ seed }) as Record<string, unknown>;

function checkCall(item: OpenAI.Responses.ResponseOutputItem) {
  assert.equal(item.type, "function_call", JSON.stringify(item));
  if (item.type !== "function_call") throw new Error("unreachable");
  assert.match(item.id ?? "", /^fc_/);
  assert.match(item.call_id, /^call_/);
  assert.equal(item.status, "completed");
  const check = valid[item.name as keyof typeof valid];
  assert.ok(check, `unknown tool ${item.name}`);
  assert.ok(
    check(JSON.parse(item.arguments)),
    `${item.name}(${item.arguments})`,
  );
  return item;
}

Deno.test({
  name:
    "Responses API through gateway and llama node with the openai SDK: text, tools, structured output, streams, storage, refusals, usage",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  // heartbeats every second: see tests/llama_tools_test.ts
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
  /** Requests served with a model (each metered). */
  let served = 0;
  let outputTokens = 0;
  const count = (r: OpenAI.Responses.Response) => {
    served++;
    outputTokens += r.usage!.output_tokens;
    return r;
  };

  let textId = "";
  await t.step("create: text in OpenAI's response shape", async () => {
    // greedy: the fixture never samples its end token, so it runs to the cap
    const r = count(
      await openai.responses.create({
        model: "tiny",
        instructions: "Answer briefly.",
        input: "Say hello.",
        max_output_tokens: 8,
        temperature: 0,
        metadata: { case: "text" },
      }),
    );
    textId = r.id;
    assert.match(r.id, /^resp_/);
    assert.equal(r.object, "response");
    assert.equal(r.model, "tiny");
    assert.equal(r.instructions, "Answer briefly.");
    assert.deepEqual(r.metadata, { case: "text" });
    assert.equal((r as unknown as { store: boolean }).store, true);
    assert.equal(r.output.length, 1);
    const msg = r.output[0]!;
    assert.equal(msg.type, "message");
    if (msg.type !== "message") return;
    assert.match(msg.id, /^msg_/);
    assert.equal(msg.role, "assistant");
    const part = msg.content[0]!;
    assert.equal(part.type, "output_text");
    if (part.type !== "output_text") return;
    assert.deepEqual(part.annotations, []);
    assert.equal(r.output_text, part.text, "the SDK's output_text");
    // cut at max_output_tokens ⇔ incomplete
    assert.equal(r.status, "incomplete", JSON.stringify(r));
    assert.deepEqual(r.incomplete_details, { reason: "max_output_tokens" });
    assert.equal(msg.status, "incomplete");
    const u = r.usage!;
    assert.equal(u.output_tokens, 8);
    assert.ok(u.input_tokens > 5, JSON.stringify(u));
    assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
    assert.equal(typeof u.input_tokens_details.cached_tokens, "number");
    assert.equal(u.output_tokens_details.reasoning_tokens, 0);

    // logprobs, as chat gives them, on the output_text part
    const lp = count(
      await openai.responses.create({
        model: "tiny",
        input: "Say hello.",
        max_output_tokens: 4,
        temperature: 0,
        include: ["message.output_text.logprobs"],
        top_logprobs: 2,
      }),
    );
    const lpMsg = lp.output[0] as OpenAI.Responses.ResponseOutputMessage;
    const lpPart = lpMsg.content[0] as OpenAI.Responses.ResponseOutputText;
    assert.equal(lpPart.logprobs!.length, 4, JSON.stringify(lpPart));
    for (const x of lpPart.logprobs!) {
      assert.ok(x.logprob <= 0);
      assert.equal(x.top_logprobs.length, 2);
    }
    assert.equal(
      new TextDecoder().decode(
        new Uint8Array(lpPart.logprobs!.flatMap((x) => x.bytes)),
      ),
      lpPart.text,
    );
    assert.equal(lp.top_logprobs, 2);

    // sampled: what ends before the cap is completed, what reaches it is not
    for (const seed of [1, 2, 3]) {
      const s = count(
        await openai.responses.create({
          model: "tiny",
          input: "Tell me something.",
          max_output_tokens: 24,
          temperature: 1,
          ...seeded(seed),
        }),
      );
      const what = JSON.stringify({ status: s.status, usage: s.usage });
      if (s.status === "completed") {
        assert.ok(s.usage!.output_tokens < 24, what);
        assert.equal(s.incomplete_details, null, what);
      } else {
        assert.equal(s.status, "incomplete", what);
        assert.deepEqual(s.incomplete_details, { reason: "max_output_tokens" });
      }
    }
  });

  await t.step(
    "a function tool: function_call item, its output sent back with previous_response_id, the turn completes",
    async () => {
      const first = count(
        await openai.responses.create({
          model: "tiny",
          input: "Weather in Paris?",
          tools: TOOLS,
          tool_choice: "required",
          parallel_tool_calls: false,
          max_output_tokens: 600,
          ...seeded(1),
        }),
      );
      assert.equal(first.status, "completed", JSON.stringify(first));
      const calls = first.output.filter((i) => i.type === "function_call");
      assert.equal(calls.length, 1, JSON.stringify(first.output));
      const call = checkCall(calls[0]!);
      assert.deepEqual(first.tools.map((x) => (x as { name: string }).name), [
        "get_weather",
        "get_time",
      ]);
      assert.equal(first.tool_choice, "required");
      assert.equal(first.parallel_tool_calls, false);

      const second = count(
        await openai.responses.create({
          model: "tiny",
          previous_response_id: first.id,
          input: [{
            type: "function_call_output",
            call_id: call.call_id,
            output: JSON.stringify({ temperature: 18 }),
          }],
          tools: TOOLS,
          tool_choice: "none",
          max_output_tokens: 16,
          ...seeded(2),
        }),
      );
      assert.equal(second.previous_response_id, first.id);
      assert.ok(
        ["completed", "incomplete"].includes(second.status!),
        JSON.stringify(second),
      );
      assert.ok(second.output.every((i) => i.type === "message"));
      assert.equal(typeof second.output_text, "string");
      const without = count(
        await openai.responses.create({
          model: "tiny",
          input: "Weather in Paris?",
          tools: TOOLS,
          tool_choice: "none",
          max_output_tokens: 1,
        }),
      );
      assert.ok(
        second.usage!.input_tokens > without.usage!.input_tokens + 10,
        "the first turn, its call and the call's output are part of the second prompt",
      );

      // a call_id no earlier call made is refused by its param path
      await assert.rejects(
        openai.responses.create({
          model: "tiny",
          previous_response_id: first.id,
          input: [{
            type: "function_call_output",
            call_id: "call_nope",
            output: "1",
          }],
          max_output_tokens: 4,
        }),
        (e: unknown) => {
          assert.ok(e instanceof OpenAI.BadRequestError, String(e));
          assert.equal(e.param, "input[0].call_id");
          return true;
        },
      );
    },
  );

  await t.step(
    "structured output: text.format json_schema outputs parse and validate",
    async () => {
      const schema = {
        type: "object",
        properties: {
          title: { type: "string", maxLength: 40 },
          rating: { type: "integer", minimum: 0, maximum: 10 },
          verdict: { enum: ["buy", "hold", "sell"] },
        },
        required: ["title", "rating", "verdict"],
        additionalProperties: false,
      };
      const check = ajv.compile(schema);
      const runs = await Promise.all(
        [0, 1, 2, 3].map((i) =>
          openai.responses.create({
            model: "tiny",
            input: `Review ${i}`,
            text: {
              format: {
                type: "json_schema",
                name: "review",
                schema,
                strict: true,
              },
            },
            temperature: 1,
            max_output_tokens: 300,
            ...seeded(i),
          })
        ),
      );
      for (const r of runs) {
        count(r);
        assert.equal(r.status, "completed", r.output_text);
        assert.ok(check(JSON.parse(r.output_text)), r.output_text);
        assert.deepEqual(r.text?.format, {
          type: "json_schema",
          name: "review",
          schema,
          strict: true,
        });
      }
    },
  );

  await t.step(
    "responses.stream: the documented event order, and finalResponse()",
    async () => {
      const stream = openai.responses.stream({
        model: "tiny",
        input: "Count to three.",
        max_output_tokens: 6,
        temperature: 0,
      });
      const types: string[] = [];
      const seqs: number[] = [];
      let deltas = "";
      for await (const e of stream) {
        types.push(e.type);
        seqs.push(e.sequence_number);
        if (e.type === "response.output_text.delta") deltas += e.delta;
      }
      const final = count(await stream.finalResponse());
      assert.deepEqual(seqs, seqs.map((_, i) => i), "sequence numbers 0, 1, …");
      const n = types.filter((x) => x === "response.output_text.delta").length;
      assert.ok(n >= 1);
      assert.deepEqual(types, [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        ...Array(n).fill("response.output_text.delta"),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        // greedy runs to the cap
        "response.incomplete",
      ]);
      assert.equal(final.status, "incomplete");
      assert.equal(final.output_text, deltas);
      assert.equal(final.usage!.output_tokens, 6);
      // stored before the last event: retrievable at once
      const got = await openai.responses.retrieve(final.id);
      assert.equal(got.output_text, deltas);

      const calls = openai.responses.stream({
        model: "tiny",
        input: "What time is it in Oslo?",
        tools: TOOLS,
        tool_choice: { type: "function", name: "get_time" },
        parallel_tool_calls: false,
        max_output_tokens: 600,
        ...seeded(3),
      });
      let argDeltas = 0;
      let args = "";
      let done = "";
      for await (const e of calls) {
        if (e.type === "response.function_call_arguments.delta") {
          argDeltas++;
          args += e.delta;
        }
        if (e.type === "response.function_call_arguments.done") {
          done = e.arguments;
        }
      }
      const r = count(await calls.finalResponse());
      assert.equal(r.status, "completed", JSON.stringify(r));
      assert.equal(r.output.length, 1, JSON.stringify(r.output));
      const call = checkCall(r.output[0]!);
      assert.equal(call.name, "get_time");
      assert.equal(call.arguments, args);
      assert.equal(done, args);
      assert.ok(argDeltas > 2, "arguments arrive in pieces");
    },
  );

  await t.step(
    "stored responses are the tenant's: another tenant's key gets 404; DELETE removes them",
    async () => {
      const got = await openai.responses.retrieve(textId);
      assert.equal(got.id, textId);
      assert.equal(got.status, "incomplete");
      const b = await cluster.admin("POST", "/tenants", {
        name: "Globex",
        slug: "globex",
      }) as { id: string };
      const { key } = await cluster.admin("POST", `/tenants/${b.id}/keys`, {
        name: "b",
      }) as { key: string };
      const other = new OpenAI({
        apiKey: key,
        baseURL: `${cluster.url}/v1`,
        maxRetries: 0,
      });
      await assert.rejects(
        other.responses.retrieve(textId),
        (e: unknown) => e instanceof OpenAI.NotFoundError,
      );
      await assert.rejects(
        other.responses.create({
          model: "tiny",
          previous_response_id: textId,
          input: "And then?",
          max_output_tokens: 4,
        }),
        (e: unknown) => {
          assert.ok(e instanceof OpenAI.NotFoundError, String(e));
          assert.equal(e.param, "previous_response_id");
          return true;
        },
      );
      await assert.rejects(
        other.responses.delete(textId),
        (e: unknown) => e instanceof OpenAI.NotFoundError,
      );
      await openai.responses.delete(textId);
      await assert.rejects(
        openai.responses.retrieve(textId),
        (e: unknown) => e instanceof OpenAI.NotFoundError,
      );
    },
  );

  await t.step(
    "what cannot be served is refused with a 400 naming it",
    async () => {
      const cases: [Record<string, unknown>, string, RegExp][] = [
        // a built-in tool required: no node can run it
        [
          { tools: [{ type: "web_search" }], tool_choice: "required" },
          "tool_choice",
          /web_search/,
        ],
        [{ background: true }, "background", /background/],
        [{ truncation: "auto" }, "truncation", /truncation/],
        [{ tools: [{ type: "custom", name: "x" }] }, "tools[0].type", /custom/],
      ];
      for (const [extra, param, message] of cases) {
        await assert.rejects(
          openai.responses.create({
            model: "tiny",
            input: "Hi",
            max_output_tokens: 4,
            ...extra,
          } as OpenAI.Responses.ResponseCreateParamsNonStreaming),
          (e: unknown) => {
            assert.ok(e instanceof OpenAI.BadRequestError, String(e));
            assert.equal(e.param, param);
            assert.equal(e.code, "unsupported_parameter");
            assert.match(e.message, message);
            return true;
          },
        );
      }
    },
  );

  await t.step(
    "hints are taken with their local meaning and reported: built-in tools offered, effort, summaries, encrypted reasoning",
    async () => {
      const { data, response } = await openai.responses.create({
        model: "tiny",
        input: "Hi",
        max_output_tokens: 4,
        store: false,
        tools: [{ type: "web_search" }],
        reasoning: { effort: "high", summary: "auto" },
        include: ["reasoning.encrypted_content"],
        prompt_cache_key: "session-1",
      }).withResponse();
      assert.equal(
        response.headers.get("x-orchard-tools-omitted"),
        "web_search",
      );
      // the llama engine has no reasoning-effort control
      assert.equal(
        response.headers.get("x-orchard-reasoning-effort"),
        "not_applicable",
      );
      assert.deepEqual(data.reasoning, { effort: "high", summary: "auto" });
      assert.deepEqual(data.tools.map((x) => x.type), ["web_search"]);
      assert.equal(data.prompt_cache_key, "session-1");
      assert.ok(data.output.length >= 1);
      // an earlier turn's reasoning goes back into its assistant turn
      const again = await openai.responses.create({
        model: "tiny",
        max_output_tokens: 4,
        store: false,
        input: [
          { role: "user", content: "Hi" },
          {
            type: "reasoning",
            id: "rs_1",
            summary: [],
            content: [{ type: "reasoning_text", text: "Greet back." }],
          },
          { role: "assistant", content: "Hello" },
          { role: "user", content: "Again" },
        ],
      });
      assert.ok(again.output.length >= 1);
      const n = await openai.responses.inputTokens.count({
        model: "tiny",
        input: "Hi",
        tools: [{ type: "web_search" }],
      });
      assert.equal(n.object, "response.input_tokens");
      assert.ok(n.input_tokens > 0);
    },
  );

  await t.step("usage views count the requests", async () => {
    const q = `/usage?tenant=acme&granularity=hour&from=${
      new Date(Date.now() - 3_600_000).toISOString()
    }&to=${new Date(Date.now() + 60_000).toISOString()}`;
    // the gateway writes usage 5 to 10 s after a tenant's first waiting record
    const deadline = Date.now() + 30_000;
    let totals: { requests: number; completionTokens: number } | null = null;
    while (Date.now() < deadline) {
      totals = (await cluster.admin("GET", q) as {
        totals: { requests: number; completionTokens: number };
      }).totals;
      if (
        totals.requests >= served && totals.completionTokens >= outputTokens
      ) {
        break;
      }
      await new Promise((r) => setTimeout(r, 500));
    }
    assert.ok(totals, "no usage report");
    assert.ok(
      totals.requests >= served,
      `${JSON.stringify(totals)} < ${served}`,
    );
    assert.ok(
      totals.completionTokens >= outputTokens,
      `${JSON.stringify(totals)}: ${outputTokens} output tokens were billed`,
    );
  });
});
