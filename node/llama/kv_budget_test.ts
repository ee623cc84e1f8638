import assert from "node:assert/strict";
import { defaultContext, kvBudgetBytes } from "./kv_budget.ts";
import { parseMemorySpec } from "../memory_spec.ts";

const GiB = 1024 ** 3;
// Qwen2.5-Coder-7B: 28 layers, 4 KV heads of 128 dims: 57,344 B a token
const qwen7b = 28 * 4 * (128 + 128) * 2;

Deno.test("defaultContext() is the trained context when the budget holds every slot's", () => {
  const ctx = defaultContext({
    trainContext: 32768,
    kvBytesPerToken: qwen7b,
    slots: 4,
    weightsBytes: 4.7 * GiB,
    availableBytes: 64 * GiB,
  });
  assert.equal(ctx, 32768);
});

Deno.test("defaultContext() shrinks to what half the memory after the weights holds, rounded to 256", () => {
  const i = {
    trainContext: 131072,
    kvBytesPerToken: qwen7b,
    slots: 4,
    weightsBytes: 4 * GiB,
    availableBytes: 12 * GiB,
  };
  assert.equal(kvBudgetBytes(i), 4 * GiB);
  const ctx = defaultContext(i);
  assert.equal(ctx % 256, 0);
  assert.ok(ctx * qwen7b * 4 <= 4 * GiB);
  assert.ok((ctx + 256) * qwen7b * 4 > 4 * GiB);
  assert.equal(ctx, 18688);
  // a fixed budget, and a floor when memory is short
  assert.equal(
    defaultContext({ ...i, kvMemory: { bytes: 2 * 1024 * qwen7b * 4 } }),
    2048,
  );
  assert.equal(defaultContext({ ...i, availableBytes: 0 }), 1024);
  assert.equal(
    defaultContext({ ...i, trainContext: 512, availableBytes: 0 }),
    512,
  );
});

Deno.test("defaultContext() falls back to min(trained, 4096) when the KV size is unknown", () => {
  const i = {
    trainContext: 131072,
    kvBytesPerToken: null,
    slots: 1,
    weightsBytes: 0,
    availableBytes: 64 * GiB,
  };
  assert.equal(defaultContext(i), 4096);
  assert.equal(defaultContext({ ...i, trainContext: 2048 }), 2048);
});

Deno.test("parseMemorySpec() reads shares and sizes and refuses the rest", () => {
  assert.deepEqual(parseMemorySpec("50%"), { share: 0.5 });
  assert.deepEqual(parseMemorySpec("8GiB"), { bytes: 8 * GiB });
  assert.deepEqual(parseMemorySpec("512m"), { bytes: 512 * 1024 ** 2 });
  assert.deepEqual(parseMemorySpec("0"), { bytes: 0 });
  assert.equal(parseMemorySpec("150%"), null);
  assert.equal(parseMemorySpec("lots"), null);
  assert.equal(parseMemorySpec("-1G"), null);
});
