import assert from "node:assert/strict";
import { desiredModels, factsOf, type Placement } from "./placement.ts";

const big = factsOf("llama", { totalBytes: 192 * 2 ** 30 }, {
  os: "darwin",
  arch: "aarch64",
});
const small = factsOf("llama", { totalBytes: 64 * 2 ** 30 }, { os: "darwin" });

Deno.test("desiredModels() joins a node's entries and matching rules, pinned when any pins", () => {
  const p: Placement = {
    nodes: { n1: [{ id: "qwen", pinned: false }] },
    rules: [
      { id: "r1", model: "llama-70b", pinned: true, minMemoryGb: 128 },
      { id: "r2", model: "qwen", pinned: true, os: "darwin" },
      { id: "r3", model: "exo-only", pinned: false, engine: "openai" },
    ],
  };
  assert.deepEqual(desiredModels(p, "n1", big), [
    { id: "llama-70b", pinned: true },
    { id: "qwen", pinned: true },
  ]);
  assert.deepEqual(desiredModels(p, "n2", small), [
    { id: "qwen", pinned: true },
  ]);
  assert.equal(
    desiredModels(p, "n3", factsOf("llama", null, { os: "linux" })),
    null,
  );
  assert.equal(desiredModels({ nodes: {}, rules: [] }, "n1", big), null);
});

Deno.test("factsOf() reads memory from the heartbeat, else the probe", () => {
  assert.equal(big.memoryGb, 192);
  assert.equal(
    factsOf("openai", null, { memory: { totalBytes: 2 ** 31 } }).memoryGb,
    2,
  );
  assert.equal(factsOf("openai", null, null).memoryGb, null);
});
