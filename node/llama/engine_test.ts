/**
 * The llama engine on generated models: real llama.cpp, real child
 * processes, real inference. Outputs are gibberish but deterministic.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { writeFixtureModel } from "../../tools/fixture_model.ts";
import { log } from "../../lib/log.ts";
import { OpenAIError } from "../../protocol/openai/errors.ts";
import { sseData } from "../../lib/sse.ts";
import { createLlamaEngine, type LlamaEngine } from "./engine.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");
log.reload();

const HI = [{ role: "user", content: "hi" }];
/** Qwen 2.5's template: its default system message, then "hi" (6 control tokens + 93 bytes). */
const HI_PROMPT_TOKENS = 99;

async function modelsDir(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "orchard-models-" });
  await writeFixtureModel(join(dir, "tiny.gguf"), { seed: 1 });
  await Deno.writeTextFile(
    join(dir, "tiny.json"),
    JSON.stringify({ aliases: ["tiny-alias"] }),
  );
  await writeFixtureModel(join(dir, "odd-template.gguf"), {
    seed: 2,
    template: "{{ messages | weird_filter }}",
  });
  await Deno.writeTextFile(join(dir, "corrupt.gguf"), "GGUF but not really");
  return dir;
}

async function chat(
  e: LlamaEngine,
  body: Record<string, unknown>,
  signal = new AbortController().signal,
) {
  const res = await e.chatCompletions({
    model: "tiny",
    messages: HI,
    temperature: 0,
    ...body,
  }, signal);
  return await res.json();
}

async function streamText(
  res: Response,
): Promise<{ text: string; frames: Record<string, unknown>[] }> {
  const frames: Record<string, unknown>[] = [];
  let text = "";
  for await (const data of sseData(res.body!)) {
    if (data === "[DONE]") break;
    const f = JSON.parse(data);
    frames.push(f);
    text += f.choices?.[0]?.delta?.content ?? f.choices?.[0]?.text ?? "";
  }
  return { text, frames };
}

async function rejectsWith(p: Promise<unknown>, status: number, code: string) {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof OpenAIError, String(e));
    assert.equal(e.status, status, e.message);
    assert.equal(e.code, code, e.message);
    return true;
  });
}

Deno.test("llama engine: models, greedy determinism, stops, limits, usage, embeddings and bad input", async (t) => {
  const dir = await modelsDir();
  const e = createLlamaEngine({ modelsDir: dir, slots: 4, threads: 2 });
  try {
    await e.start();

    await t.step(
      "lists valid models with aliases; corrupt files are not listed",
      async () => {
        const models = await e.models();
        assert.deepEqual(models.map((m) => m.id), ["odd-template", "tiny"]);
        const tiny = models.find((m) => m.id === "tiny")!;
        assert.deepEqual(tiny.aliases, ["tiny-alias"]);
        assert.equal(tiny.kind, "chat");
        assert.equal(tiny.contextLength, 2048);
        // the template's overhead bounds the prompt the gateway may bill
        const o = tiny.promptOverhead!;
        assert.ok("hi".length + o.fixed + o.perMessage >= HI_PROMPT_TOKENS);
        assert.ok(o.tools > 200, "Qwen's tools block is measured");
        assert.equal(
          models.find((m) => m.id === "odd-template")!.promptOverhead,
          undefined,
        );
      },
    );

    let reference = "";
    await t.step(
      "greedy output is deterministic and usage counts are exact",
      async () => {
        const a = await chat(e, { max_tokens: 12 });
        const b = await chat(e, { max_tokens: 12, model: "tiny-alias" });
        reference = a.choices[0].message.content;
        assert.ok(reference.length > 0);
        assert.equal(b.choices[0].message.content, reference);
        assert.equal(a.object, "chat.completion");
        assert.equal(a.model, "tiny");
        assert.equal(a.choices[0].finish_reason, "length");
        assert.deepEqual(a.usage, {
          prompt_tokens: HI_PROMPT_TOKENS,
          completion_tokens: 12,
          total_tokens: HI_PROMPT_TOKENS + 12,
          prompt_tokens_details: { cached_tokens: 0 },
        });
        // the same prompt again: all but its last token come from the cache
        assert.equal(b.usage.prompt_tokens, HI_PROMPT_TOKENS);
        assert.equal(
          b.usage.prompt_tokens_details.cached_tokens,
          HI_PROMPT_TOKENS - 1,
        );
      },
    );

    await t.step(
      "streaming yields the same text, then finish, then the usage chunk",
      async () => {
        const res = await e.chatCompletions({
          model: "tiny",
          messages: HI,
          temperature: 0,
          max_tokens: 12,
          stream: true,
        }, new AbortController().signal);
        assert.equal(res.headers.get("content-type"), "text/event-stream");
        const { text, frames } = await streamText(res);
        assert.equal(text, reference);
        const first = frames[0] as { choices: { delta: { role?: string } }[] };
        assert.equal(first.choices[0]!.delta.role, "assistant");
        const last = frames.at(-1) as {
          choices: unknown[];
          usage: { completion_tokens: number };
        };
        assert.deepEqual(last.choices, []);
        assert.equal(last.usage.completion_tokens, 12);
        const fin = frames.at(-2) as { choices: { finish_reason: string }[] };
        assert.equal(fin.choices[0]!.finish_reason, "length");
      },
    );

    await t.step(
      "max_tokens and max_completion_tokens cap the completion",
      async () => {
        const r = await chat(e, { max_completion_tokens: 3 });
        assert.equal(r.usage.completion_tokens, 3);
        assert.equal(r.choices[0].finish_reason, "length");
        assert.ok(reference.startsWith(r.choices[0].message.content));
      },
    );

    await t.step(
      "a stop string ends the text before it, with finish_reason stop",
      async () => {
        const chars = [...reference];
        const stop = chars.slice(2, 4).join("");
        const r = await chat(e, {
          max_tokens: 12,
          stop: [stop, "never-appears"],
        });
        assert.equal(r.choices[0].finish_reason, "stop");
        assert.equal(
          r.choices[0].message.content,
          reference.slice(0, reference.indexOf(stop)),
        );
      },
    );

    await t.step("seeded sampling repeats; text completions work", async () => {
      const s1 = await chat(e, {
        temperature: 0.9,
        top_p: 0.9,
        top_k: 40,
        seed: 11,
        max_tokens: 10,
      });
      const s2 = await chat(e, {
        temperature: 0.9,
        top_p: 0.9,
        top_k: 40,
        seed: 11,
        max_tokens: 10,
      });
      assert.equal(
        s1.choices[0].message.content,
        s2.choices[0].message.content,
      );
      const res = await e.completions({
        model: "tiny",
        prompt: "Once upon a time",
        max_tokens: 5,
        temperature: 0,
      }, new AbortController().signal);
      const c = await res.json();
      assert.equal(c.object, "text_completion");
      assert.equal(c.usage.prompt_tokens, "Once upon a time".length);
      assert.equal(c.usage.completion_tokens, 5);
    });

    await t.step(
      "embeddings are unit vectors, base64 encodes the same floats",
      async () => {
        const sig = new AbortController().signal;
        const f = await (await e.embeddings(
          { model: "tiny", input: ["alpha", "beta"] },
          sig,
        )).json();
        assert.equal(f.data.length, 2);
        const v = f.data[0].embedding as number[];
        assert.equal(v.length, 64);
        assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-4);
        assert.equal(f.usage.prompt_tokens, "alpha".length + "beta".length);
        const b = await (await e.embeddings({
          model: "tiny",
          input: "alpha",
          encoding_format: "base64",
        }, sig)).json();
        const bytes = Uint8Array.from(
          atob(b.data[0].embedding),
          (c) => c.charCodeAt(0),
        );
        const floats = Array.from(new Float32Array(bytes.buffer));
        floats.forEach((x, i) => assert.ok(Math.abs(x - v[i]!) < 1e-6));
      },
    );

    await t.step(
      "bad input: unknown model 404, context overflow 400, bad template 400, corrupt file 503, bad params 400",
      async () => {
        await rejectsWith(chat(e, { model: "nope" }), 404, "model_not_found");
        await rejectsWith(
          chat(e, { messages: [{ role: "user", content: "x".repeat(3000) }] }),
          400,
          "context_length_exceeded",
        );
        await rejectsWith(
          chat(e, { max_tokens: 5000 }),
          400,
          "context_length_exceeded",
        );
        await rejectsWith(
          chat(e, { model: "odd-template" }),
          400,
          "unsupported_chat_template",
        );
        await rejectsWith(
          chat(e, { model: "corrupt" }),
          503,
          "model_unavailable",
        );
        await rejectsWith(chat(e, { temperature: "hot" }), 400, "invalid_type");
        await rejectsWith(chat(e, { messages: [] }), 400, "invalid_type");
        await rejectsWith(chat(e, { n: 2 }), 400, "invalid_value");
        await rejectsWith(
          chat(e, {
            messages: [{ role: "user", content: [{ type: "image_url" }] }],
          }),
          400,
          "invalid_value",
        );
        // the node still serves after all of that
        assert.equal(
          (await chat(e, { max_tokens: 2 })).usage.completion_tokens,
          2,
        );
      },
    );
  } finally {
    await e.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("llama engine: concurrent streams share decode steps, cancellation frees the slot, a full queue answers 503", async () => {
  const dir = await modelsDir();
  const e = createLlamaEngine({
    modelsDir: dir,
    slots: 4,
    threads: 2,
    maxQueue: 0,
  });
  try {
    await e.start();
    const alone = await chat(e, { max_tokens: 24 });
    const runs = await Promise.all([0, 1, 2, 3].map(async () => {
      const res = await e.chatCompletions({
        model: "tiny",
        messages: HI,
        temperature: 0,
        max_tokens: 24,
        stream: true,
      }, new AbortController().signal);
      return await streamText(res);
    }));
    assert.ok(e.peakBatch >= 2, `peak batch ${e.peakBatch}`);
    for (const r of runs) {
      const usage =
        (r.frames.at(-1) as { usage: { completion_tokens: number } }).usage;
      assert.equal(usage.completion_tokens, 24);
      assert.equal(r.text, alone.choices[0].message.content);
    }
    const burst = await Promise.allSettled(
      [0, 1, 2, 3, 4].map(() => chat(e, { max_tokens: 8 })),
    );
    const refused = burst.filter((r) => r.status === "rejected");
    assert.equal(refused.length, 1);
    const why = (refused[0] as PromiseRejectedResult).reason as OpenAIError;
    assert.equal(why.status, 503);
    assert.equal(why.headers["retry-after"], "1");
    // cancellation: leave a long stream after the first chunk; its slot comes back
    // (more times than there are slots, so a leaked slot would show)
    for (let i = 0; i < 6; i++) {
      const ac = new AbortController();
      const res = await e.chatCompletions({
        model: "tiny",
        messages: HI,
        max_tokens: 1500,
        stream: true,
      }, ac.signal);
      const reader = res.body!.getReader();
      await reader.read();
      assert.equal(e.stats().inFlight, 1);
      ac.abort();
      await reader.cancel();
      const deadline = Date.now() + 5000;
      while (e.stats().inFlight > 0 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 5));
      }
      assert.equal(e.stats().inFlight, 0);
    }
    assert.equal((await chat(e, { max_tokens: 2 })).usage.completion_tokens, 2);
  } finally {
    await e.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("llama engine: a crashed model process fails its stream with an error frame and restarts", async () => {
  const dir = await modelsDir();
  const e = createLlamaEngine({ modelsDir: dir, slots: 2, threads: 2 });
  try {
    await e.start();
    const before = await chat(e, { max_tokens: 6 });
    const res = await e.chatCompletions({
      model: "tiny",
      messages: HI,
      max_tokens: 1800,
      stream: true,
    }, new AbortController().signal);
    const reader = res.body!.getReader();
    await reader.read();
    const pid = e.processes().tiny!.pid!;
    Deno.kill(pid, "SIGKILL");
    let tail = "";
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      tail += new TextDecoder().decode(value);
    }
    assert.match(tail, /"code":"engine_restarting"/);
    assert.match(tail, /data: \[DONE\]\n\n$/);
    // the engine brings the model back by itself, before any request
    const deadline = Date.now() + 5000;
    while (!e.processes().tiny!.pid && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.ok(e.processes().tiny!.pid);
    const after = await chat(e, { max_tokens: 6 });
    assert.equal(
      after.choices[0].message.content,
      before.choices[0].message.content,
    );
    const p = e.processes().tiny!;
    assert.equal(p.restarts, 1);
    assert.notEqual(p.pid, pid);
  } finally {
    await e.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("llama engine: an idle model is unloaded and loads again on the next request", async () => {
  const dir = await modelsDir();
  const e = createLlamaEngine({
    modelsDir: dir,
    slots: 1,
    threads: 1,
    idleUnloadMs: 150,
  });
  try {
    await e.start();
    const first = await chat(e, { max_tokens: 3 });
    assert.ok(e.processes().tiny!.pid);
    assert.equal((await e.models()).find((m) => m.id === "tiny")!.loaded, true);
    const deadline = Date.now() + 5000;
    while (e.processes().tiny!.pid && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 25));
    }
    assert.equal(e.processes().tiny!.pid, null);
    assert.equal(e.processes().tiny!.restarts, 0); // an unload is not a crash
    const again = await chat(e, { max_tokens: 3 });
    assert.equal(
      again.choices[0].message.content,
      first.choices[0].message.content,
    );
  } finally {
    await e.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("llama engine: the output cap bounds every request and is the default when none is named; a sidecar's wins", async () => {
  const dir = await Deno.makeTempDir({ prefix: "orchard-models-" });
  await writeFixtureModel(join(dir, "tiny.gguf"), { seed: 1 });
  await writeFixtureModel(join(dir, "capped.gguf"), { seed: 1 });
  await Deno.writeTextFile(
    join(dir, "capped.json"),
    JSON.stringify({ maxOutputTokens: 3 }),
  );
  const e = createLlamaEngine({
    modelsDir: dir,
    slots: 1,
    threads: 2,
    maxOutputTokens: 6,
  });
  try {
    await e.start();
    // the tiny fixture never ends on its own: each answer runs to its cap
    const none = await chat(e, {});
    assert.equal(none.usage.completion_tokens, 6);
    assert.equal(none.choices[0].finish_reason, "length");
    assert.equal(
      (await chat(e, { max_tokens: 100 })).usage.completion_tokens,
      6,
    );
    assert.equal((await chat(e, { max_tokens: 4 })).usage.completion_tokens, 4);
    const capped = await chat(e, { model: "capped", max_tokens: 100 });
    assert.equal(capped.usage.completion_tokens, 3);
  } finally {
    await e.close();
    await Deno.remove(dir, { recursive: true });
  }
});
