/**
 * Prefixes evicted from slots come back from host memory: real llama.cpp
 * child processes on the tiny fixture model, two slots, three agents.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { writeFixtureModel } from "../../tools/fixture_model.ts";
import { log } from "../../lib/log.ts";
import { createLlamaEngine, type LlamaEngine } from "./engine.ts";
import type { MemorySpec } from "../memory_spec.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");
log.reload();

type Msg = { role: string; content: string };

/** An agent's first turn: its own ~700-byte system prompt and a task. */
function agent(name: string): Msg[] {
  return [
    {
      role: "system",
      content: `You are agent ${name}. ` +
        `Rule ${name}: keep the repository tidy and explain each change. `
          .repeat(11),
    },
    { role: "user", content: `Task for ${name}: list the files.` },
  ];
}

async function turn(e: LlamaEngine, messages: Msg[]) {
  const res = await e.chatCompletions({
    model: "tiny",
    messages,
    max_tokens: 8,
    temperature: 0,
  }, new AbortController().signal);
  const body = await res.json();
  return {
    answer: String(body.choices[0].message.content ?? ""),
    prompt: body.usage.prompt_tokens as number,
    cached: body.usage.prompt_tokens_details.cached_tokens as number,
  };
}

/** Agents A, B, C take turns on 2 slots; then A comes back. A's second turn's cached tokens. */
async function comeBack(prefixCacheMemory: MemorySpec) {
  const dir = await Deno.makeTempDir({ prefix: "orchard-prefix-" });
  await writeFixtureModel(join(dir, "tiny.gguf"), { seed: 1 });
  const e = createLlamaEngine({
    modelsDir: dir,
    slots: 2,
    threads: 2,
    prefixCacheMemory,
  });
  try {
    await e.start();
    const a = agent("A");
    const first = await turn(e, a);
    await turn(e, agent("B"));
    await turn(e, agent("C")); // every slot used since A: A's was overwritten
    const back = await turn(e, [
      ...a,
      { role: "assistant", content: first.answer },
      { role: "user", content: "Tool result: a.ts b.ts" },
    ]);
    return { first, back };
  } finally {
    await e.close();
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("an agent coming back after others used every slot gets its prefix back from host memory, and the same answer", async () => {
  const { first, back } = await comeBack({ bytes: 64 * 1024 * 1024 });
  const fresh = await comeBack({ bytes: 0 });
  assert.equal(
    back.answer,
    fresh.back.answer,
    "restored cells answer as prefilled ones",
  );
  assert.ok(first.prompt > 600, `first prompt ${first.prompt} tokens`);
  assert.ok(
    back.cached >= first.prompt - 1,
    `cached ${back.cached} of ${back.prompt}; the first turn's prompt was ${first.prompt}`,
  );
});

Deno.test("without host memory for prefixes the same agent prefills again", async () => {
  const { first, back } = await comeBack({ bytes: 0 });
  assert.ok(
    back.cached < first.prompt / 4,
    `cached ${back.cached} of ${back.prompt}`,
  );
});
