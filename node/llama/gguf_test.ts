import assert from "node:assert/strict";
import { join } from "node:path";
import { writeFixtureModel } from "../../tools/fixture_model.ts";
import { GgufError, readGguf, validateModel, writeGguf } from "./gguf.ts";

async function withDir(fn: (dir: string) => Promise<void>) {
  const dir = await Deno.makeTempDir({ prefix: "orchard-gguf-" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("readGguf and validateModel read the fixture's facts", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "tiny.gguf");
    const params = await writeFixtureModel(path, { size: "tiny" });
    const facts = validateModel(await readGguf(path));
    assert.equal(facts.architecture, "llama");
    assert.equal(facts.blockCount, 2);
    assert.equal(facts.contextLength, 2048);
    assert.equal(facts.embeddingLength, 64);
    assert.equal(facts.embeddingOnly, false);
    assert.equal(facts.parameterCount, params);
    assert.match(facts.chatTemplate ?? "", /<\|im_start\|>/);
  });
});

Deno.test("writeFixtureModel is deterministic for a seed", async () => {
  await withDir(async (dir) => {
    await writeFixtureModel(join(dir, "a.gguf"), { seed: 7 });
    await writeFixtureModel(join(dir, "b.gguf"), { seed: 7 });
    await writeFixtureModel(join(dir, "c.gguf"), { seed: 8 });
    const [a, b, c] = await Promise.all(
      ["a", "b", "c"].map((n) => Deno.readFile(join(dir, `${n}.gguf`))),
    );
    assert.deepEqual(a, b);
    assert.notDeepEqual(a, c);
  });
});

Deno.test("validateModel refuses block_count = 0, which aborts llama.cpp", async () => {
  await withDir(async (dir) => {
    const path = join(dir, "zero.gguf");
    using f = await Deno.open(path, { write: true, create: true });
    await writeGguf(f, [
      ["general.architecture", { type: "string", value: "llama" }],
      ["llama.block_count", { type: "u32", value: 0 }],
    ], [{
      name: "token_embd.weight",
      dims: [4, 4],
      type: 0,
      data: new Uint8Array(64),
    }]);
    await assert.rejects(
      async () => validateModel(await readGguf(path)),
      (e: Error) => e instanceof GgufError && /block_count/.test(e.message),
    );
  });
});

Deno.test("readGguf rejects bad magic, truncation, absurd counts and out-of-file tensors", async () => {
  await withDir(async (dir) => {
    const good = join(dir, "tiny.gguf");
    await writeFixtureModel(good);
    const bytes = await Deno.readFile(good);
    const cases: [string, Uint8Array, RegExp][] = [
      ["magic", new TextEncoder().encode("not a model at all"), /bad magic/],
      ["truncated header", bytes.slice(0, 300), /truncated/],
      ["truncated data", bytes.slice(0, bytes.length - 1000), /past the end/],
      [
        "counts",
        (() => {
          const b = bytes.slice(0, 64);
          new DataView(b.buffer).setBigUint64(8, 1n << 40n, true);
          return b;
        })(),
        /beyond the limits/,
      ],
      [
        "string length",
        (() => {
          const b = bytes.slice(0, 64);
          new DataView(b.buffer).setBigUint64(24, 1n << 50n, true);
          return b;
        })(),
        /string of|too large/,
      ],
    ];
    for (const [what, data, re] of cases) {
      const p = join(dir, `${what.replaceAll(" ", "_")}.gguf`);
      await Deno.writeFile(p, data);
      await assert.rejects(
        async () => validateModel(await readGguf(p)),
        (e: Error) => e instanceof GgufError && re.test(e.message),
        what,
      );
    }
  });
});
