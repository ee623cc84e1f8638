/**
 * End to end, reasoning: the real Orchard on loopback and a real node
 * worker serving, through the llama engine, fixture models with Qwen3's
 * chat template (`enable_thinking`) and with a generation prompt that opens
 * `<think>` (Qwen3-Thinking, DeepSeek R1). The node's reasoning facts reach
 * the gateway through enrollment and heartbeats; effort is passed to the
 * model with a control; the thinking comes back as Responses reasoning
 * items (sealed with jose, sent back as input) and Anthropic thinking blocks.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startNodeWorker } from "../node/worker.ts";
import { createApiKey } from "../store/api_keys.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import { SYSTEM } from "../store/principal.ts";
import { writeFixtureModel } from "../tools/fixture_model.ts";
import {
  QWEN3_TEMPLATE,
  QWEN3_THINKING_TEMPLATE,
} from "../tools/fixture_templates.ts";
import { parseSSE } from "../lib/sse.ts";
import { createWorld } from "./_helpers.ts";

type Obj = Record<string, unknown>;

Deno.test("e2e reasoning on the llama engine: effort passed, thinking as reasoning items and thinking blocks", async (t) => {
  const w = await createWorld({ config: { allowPrivateNodeUrls: true } });
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: () => {} },
    w.app.fetch,
  );
  const url = `http://127.0.0.1:${server.addr.port}`;
  const models = await Deno.makeTempDir({ prefix: "orchard-e2e-reason-" });
  const state = await Deno.makeTempDir({ prefix: "orchard-e2e-node-" });
  await writeFixtureModel(join(models, "qwen3.gguf"), {
    seed: 3,
    template: QWEN3_TEMPLATE,
  });
  await writeFixtureModel(join(models, "thinker.gguf"), {
    seed: 3,
    template: QWEN3_THINKING_TEMPLATE,
  });
  const node = await startNodeWorker({
    gatewayUrl: url,
    joinToken: (await createJoinToken(w.store, SYSTEM, {})).token,
    engine: "llama",
    modelsDir: models,
    slots: 2,
    threads: 1,
    port: 0,
    host: "127.0.0.1",
    stateDir: state,
    heartbeatMs: 1000,
    linktest: null,
  });
  try {
    const deadline = Date.now() + 10_000;
    while (
      w.orchard.fleet.candidates("qwen3").length === 0 ||
      w.orchard.fleet.candidates("thinker").length === 0
    ) {
      if (Date.now() > deadline) throw new Error("node never became routable");
      await new Promise((r) => setTimeout(r, 25));
      await w.orchard.fleet.refresh();
    }
    const apiKey = (await createApiKey(w.store, SYSTEM, w.tenantA.id, {
      name: "e2e",
    })).key;
    const post = (path: string, body: Obj) =>
      fetch(url + path, {
        method: "POST",
        headers: {
          authorization: `Bearer ${apiKey}`,
          "content-type": "application/json",
        },
        body: JSON.stringify(body),
      });

    await t.step("the node's reasoning facts reach the gateway", () => {
      const facts = (id: string) =>
        w.orchard.fleet.candidates(id)[0]!.models.find((m) => m.id === id)!
          .reasoning;
      assert.deepEqual(facts("qwen3"), {
        control: "enable_thinking",
        parses: true,
      });
      assert.deepEqual(facts("thinker"), { control: null, parses: true });
    });

    await t.step(
      "Responses reasoning.effort is passed to Qwen3's switch: none bills its empty think block",
      async () => {
        const run = async (effort: string) => {
          const res = await post("/v1/responses", {
            model: "qwen3",
            input: "hi",
            max_output_tokens: 4,
            temperature: 0,
            reasoning: { effort },
          });
          const body = await res.json();
          assert.equal(res.status, 200, JSON.stringify(body));
          assert.equal(res.headers.get("x-orchard-reasoning-effort"), "passed");
          return body.usage.input_tokens as number;
        };
        assert.equal(await run("none"), (await run("high")) + 19);
      },
    );

    await t.step(
      "a streamed Responses turn returns the thinking as a sealed reasoning item that opens as input",
      async () => {
        const res = await post("/v1/responses", {
          model: "thinker",
          input: "hi",
          max_output_tokens: 6,
          temperature: 0,
          stream: true,
          store: false,
          include: ["reasoning.encrypted_content"],
        });
        assert.equal(res.status, 200);
        const events = parseSSE(await res.text()).map((e) =>
          JSON.parse(e.data) as Obj
        );
        events.forEach((e, i) => assert.equal(e.sequence_number, i));
        const done = events.find((e) =>
          e.type === "response.output_item.done"
        )!;
        const item = done.item as Obj;
        assert.equal(item.type, "reasoning");
        assert.equal(String(item.encrypted_content).split(".").length, 5);
        const text = (item.content as Obj[])[0]!.text as string;
        assert.ok(text.length > 0);
        const final = events.at(-1)!;
        assert.equal(final.type, "response.incomplete");
        const next = await post("/v1/responses", {
          model: "thinker",
          max_output_tokens: 2,
          store: false,
          input: [
            { role: "user", content: "hi" },
            ...((final.response as Obj).output as Obj[]),
            { role: "user", content: "go on" },
          ],
        });
        const body = await next.json();
        assert.equal(next.status, 200, JSON.stringify(body));
      },
    );

    await t.step(
      "Anthropic adaptive thinking returns a signed thinking block; disabled on Qwen3 bills the empty think block",
      async () => {
        const res = await post("/v1/messages", {
          model: "thinker",
          max_tokens: 6,
          temperature: 0,
          messages: [{ role: "user", content: "hi" }],
          thinking: { type: "adaptive" },
        });
        const msg = await res.json();
        assert.equal(res.status, 200, JSON.stringify(msg));
        // no switch on this model: the hint is named, the thinking still shown
        assert.equal(res.headers.get("x-orchard-ignored"), "thinking");
        assert.equal(msg.content[0].type, "thinking");
        assert.ok(msg.content[0].thinking.length > 0);
        assert.equal(msg.content[0].signature.split(".").length, 5);
        // streamed and cut while thinking: the block is signed before its stop
        const streamed = await post("/v1/messages", {
          model: "thinker",
          max_tokens: 6,
          temperature: 0,
          stream: true,
          messages: [{ role: "user", content: "hi" }],
          thinking: { type: "adaptive" },
        });
        const events = parseSSE(await streamed.text()).map((e) =>
          JSON.parse(e.data) as Obj
        );
        const deltas = events.filter((e) => e.type === "content_block_delta")
          .map((e) => e.delta as Obj);
        assert.equal(
          deltas.filter((d) => d.type === "thinking_delta")
            .map((d) => d.thinking).join(""),
          msg.content[0].thinking,
        );
        const sig = deltas.at(-1)!;
        assert.equal(sig.type, "signature_delta");
        assert.equal(String(sig.signature).split(".").length, 5);
        const end = events.find((e) => e.type === "message_delta")!;
        assert.equal((end.delta as Obj).stop_reason, "max_tokens");
        const tokens = async (thinking: Obj) => {
          const r = await post("/v1/messages", {
            model: "qwen3",
            max_tokens: 2,
            messages: [{ role: "user", content: "hi" }],
            thinking,
          });
          const m = await r.json();
          assert.equal(r.status, 200, JSON.stringify(m));
          assert.equal(r.headers.get("x-orchard-ignored"), null);
          return m.usage.input_tokens + m.usage.cache_read_input_tokens;
        };
        assert.equal(
          await tokens({ type: "disabled" }),
          (await tokens({ type: "adaptive" })) + 19,
        );
      },
    );
  } finally {
    await node.close();
    await server.shutdown();
    await w.close();
    await Deno.remove(models, { recursive: true });
    await Deno.remove(state, { recursive: true });
  }
});
