/** Bad input never crashes the gateway nor yields a 5xx: always a 4xx OpenAI error (or a 200). */
import assert from "node:assert/strict";
import { createWorld } from "../gateway/_testing.ts";

function assertOpenAIError(body: unknown): void {
  const e = (body as { error?: Record<string, unknown> }).error;
  assert.ok(e, `no error object: ${JSON.stringify(body).slice(0, 200)}`);
  assert.equal(typeof e.message, "string");
  assert.equal(typeof e.type, "string");
  assert.ok(e.code === null || typeof e.code === "string");
  assert.ok("param" in e);
}

Deno.test("named bad inputs get a 4xx OpenAI error", async () => {
  const w = await createWorld({ maxBodyBytes: 256 * 1024 });
  try {
    const cases: [string, string | Record<string, unknown>, number][] = [
      [
        "oversized body",
        JSON.stringify({
          model: "tiny-chat",
          messages: [{ role: "user", content: "x".repeat(300_000) }],
        }),
        413,
      ],
      ["invalid JSON", "{not json", 400],
      ["deeply nested JSON", "[".repeat(10_000) + "]".repeat(10_000), 400],
      ["array body", "[]", 400],
      ["wrong types", { model: 5, messages: "hi" }, 400],
      ["wrong message type", {
        model: "tiny-chat",
        messages: [{ role: "user", content: 5 }],
      }, 400],
      ["wrong temperature", {
        model: "tiny-chat",
        messages: [{ role: "user", content: "x" }],
        temperature: "hot",
      }, 400],
      ["3000-character model", {
        model: "m".repeat(3000),
        messages: [{ role: "user", content: "x" }],
      }, 400],
      ["thousands of messages", {
        model: "tiny-chat",
        messages: Array.from(
          { length: 3000 },
          () => ({ role: "user", content: "x" }),
        ),
      }, 400],
      ["negative max_tokens", {
        model: "tiny-chat",
        messages: [{ role: "user", content: "x" }],
        max_tokens: -1,
      }, 400],
      ["bad encoding_format", {
        model: "tiny-embed",
        input: "x",
        encoding_format: "hex",
      }, 400],
    ];
    for (const [name, body, status] of cases) {
      const path = name === "bad encoding_format"
        ? "/v1/embeddings"
        : "/v1/chat/completions";
      const r = await w.post(path, body);
      assert.equal(r.status, status, name);
      assertOpenAIError(await r.json());
    }
    const anth = await fetch(w.url + "/v1/messages", {
      method: "POST",
      headers: { "x-api-key": w.key, "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny-chat", messages: [] }),
    });
    assert.equal(anth.status, 400);
    assert.equal((await anth.json()).type, "error");
    assert.equal(w.up.requests.length, 0);
  } finally {
    await w.close();
  }
});

/** A tiny deterministic PRNG so failures can be replayed from the seed. */
function rng(seed: number) {
  return () => {
    seed = (seed * 1664525 + 1013904223) >>> 0;
    return seed / 2 ** 32;
  };
}

function gen(r: () => number, depth = 0): unknown {
  const pick = Math.floor(r() * (depth > 3 ? 6 : 9));
  switch (pick) {
    case 0:
      return null;
    case 1:
      return r() < 0.5;
    case 2:
      return Math.floor(r() * 2e6) - 1e6;
    case 3:
      return r() * 1e9;
    case 4:
      return "x".repeat(Math.floor(r() * 40));
    case 5:
      return [
        "user",
        "assistant",
        "system",
        "tool",
        "bogus",
        "",
      ][Math.floor(r() * 6)];
    case 6:
      return Array.from(
        { length: Math.floor(r() * 4) },
        () => gen(r, depth + 1),
      );
    default: {
      const o: Record<string, unknown> = {};
      const keys = [
        "model",
        "messages",
        "role",
        "content",
        "max_tokens",
        "stream",
        "temperature",
        "stop",
        "n",
        "input",
        "prompt",
        "tools",
        "stream_options",
        "max_completion_tokens",
        "encoding_format",
      ];
      for (let i = Math.floor(r() * 5); i > 0; i--) {
        o[keys[Math.floor(r() * keys.length)]!] = gen(r, depth + 1);
      }
      return o;
    }
  }
}

Deno.test("fuzz: 1,200 generated bodies give 0 crashes and 0 5xx", async () => {
  const w = await createWorld();
  try {
    const seed = Number(Deno.env.get("FUZZ_SEED") ?? Date.now() % 100000);
    const r = rng(seed);
    const paths = [
      "/v1/chat/completions",
      "/v1/completions",
      "/v1/embeddings",
      "/v1/messages",
      "/v1/messages/count_tokens",
    ];
    const counts = new Map<number, number>();
    for (let i = 0; i < 1200; i += 20) {
      await Promise.all(Array.from({ length: 20 }, async () => {
        let body = gen(r);
        if (
          r() < 0.6 && body && typeof body === "object" && !Array.isArray(body)
        ) {
          body = {
            model: r() < 0.5 ? "tiny-chat" : "tiny-embed",
            ...body as object,
          };
        }
        const raw = r() < 0.05
          ? JSON.stringify(body).slice(0, -1)
          : JSON.stringify(body);
        const path = paths[Math.floor(r() * paths.length)]!;
        const res = await w.post(path, raw ?? "null");
        counts.set(res.status, (counts.get(res.status) ?? 0) + 1);
        assert.ok(
          res.status < 500,
          `seed ${seed}: ${path} ${raw?.slice(0, 300)} → ${res.status}`,
        );
        await res.body?.cancel();
      }));
    }
    assert.equal([...counts.values()].reduce((a, b) => a + b, 0), 1200);
  } finally {
    await w.close();
  }
});
