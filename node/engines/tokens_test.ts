import assert from "node:assert/strict";
import { join } from "node:path";
import {
  writeHubSnapshot,
  writeTokenizerFixture,
} from "../../tests/fixtures/tokenizer.ts";
import { ProbeBackoff } from "./_probes.ts";
import {
  estimateTokens,
  ESTIMATOR,
  findTokenizer,
  readTokenizerFiles,
  tokenizerCounter,
} from "./tokens.ts";

Deno.test("estimateTokens() counts words, numbers, CJK characters and punctuation, not characters / 4", () => {
  assert.equal(estimateTokens(""), 0);
  assert.equal(estimateTokens("hi"), 1);
  assert.equal(estimateTokens("Hello world"), 2);
  assert.equal(estimateTokens("internationalization"), 3);
  assert.equal(estimateTokens("12345678"), 3);
  assert.equal(estimateTokens("日本語"), 3);
  assert.equal(estimateTokens('{"city":"Oslo"}'), 6);
  // a chat: 3 per prompt + 4 per message + its text
  assert.equal(
    ESTIMATOR.prompt({ messages: [{ role: "user", content: "hi" }] }, "chat"),
    8,
  );
  assert.equal(ESTIMATOR.prompt({ prompt: [1, 2, 3] }, "text"), 3);
});

Deno.test("a tokenizer.json with its chat template counts a chat as the engine renders it", async () => {
  const dir = await Deno.makeTempDir({ prefix: "orchard-tok-" });
  try {
    await writeTokenizerFixture(dir);
    const c = tokenizerCounter(await readTokenizerFiles(dir));
    assert.equal(c.basis, "counted");
    assert.equal(c.text("one two - three"), 4);
    const chat = {
      messages: [
        { role: "system", content: "one" },
        { role: "user", content: "hi" },
      ],
    };
    // <|system|> one <|end|> <|user|> hi <|end|> <|assistant|>
    assert.equal(c.prompt(chat, "chat"), 7);
    assert.equal(c.prompt({ input: ["hi", "one two"] }, "embedding"), 3);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("findTokenizer() looks in model folders, the hub cache and a path id, never outside", async () => {
  const root = await Deno.makeTempDir({ prefix: "orchard-find-" });
  try {
    const exo = join(root, "exo");
    const hub = join(root, "hub");
    await writeTokenizerFixture(join(exo, "org--a"));
    await writeTokenizerFixture(join(exo, "plain"));
    const snap = await writeHubSnapshot(hub, "org/b");
    await Deno.remove(join(hub, "models--org--b", "refs"), { recursive: true });
    await writeTokenizerFixture(join(root, "local-model"));
    const search = { dirs: [exo], hubCache: hub };
    assert.equal(await findTokenizer(["org/a"], search), join(exo, "org--a"));
    assert.equal(await findTokenizer(["plain"], search), join(exo, "plain"));
    assert.equal(await findTokenizer(["x", "org/b"], search), snap);
    assert.equal(
      await findTokenizer([join(root, "local-model")], search),
      join(root, "local-model"),
    );
    assert.equal(await findTokenizer(["../exo/plain"], search), null);
    assert.equal(await findTokenizer(["org/../plain"], search), null);
    assert.equal(await findTokenizer(["missing"], search), null);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("ProbeBackoff waits 30 s, then doubles up to 10 min, and starts afresh when the listing changes", () => {
  let t = 0;
  const b = new ProbeBackoff({ now: () => t });
  assert.equal(b.due("m", "L"), true);
  const waits = [30, 60, 120, 240, 480, 600, 600].map((s) => s * 1000);
  for (const w of waits) {
    b.failed("m", "L");
    t += w - 1;
    assert.equal(b.due("m", "L"), false);
    t += 1;
    assert.equal(b.due("m", "L"), true);
  }
  b.failed("m", "L");
  assert.equal(b.due("m", "L2"), true, "a new listing is probed at once");
  assert.equal(b.failed("m", "L2"), 1, "and backs off from the start");
  b.retain(new Set());
  assert.equal(b.failing("m"), false);
});
