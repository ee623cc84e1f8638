import assert from "node:assert/strict";
import { PrefixStore, SAVE_MIN } from "./prefix_store.ts";

const range = (from: number, n: number) =>
  Int32Array.from({ length: n }, (_, i) => from + i);
const bytes = (n: number) => new Uint8Array(n);

Deno.test("PrefixStore.best() finds the saved sequence sharing the longest prefix", () => {
  const s = new PrefixStore(1000);
  assert.ok(s.put(range(0, 400), bytes(100)));
  assert.ok(s.put(range(1000, 500), bytes(100)));
  const hit = s.best(Int32Array.from([...range(1000, 450), 7]), 450);
  assert.equal(hit!.reuse, 450);
  assert.equal(hit!.entry.tokens[0], 1000);
  assert.equal(s.best(range(5000, 10), 9), null);
});

Deno.test("PrefixStore.put() keeps what fits the budget, least recently used out first", () => {
  const s = new PrefixStore(250);
  s.put(range(0, 300), bytes(100));
  s.put(range(1000, 300), bytes(100));
  s.best(range(0, 300), 299); // the first is used again
  assert.ok(s.put(range(2000, 300), bytes(100)));
  assert.equal(s.size, 2);
  assert.equal(s.bytes, 200);
  assert.equal(
    s.best(range(1000, 300), 299),
    null,
    "the least recently used left",
  );
  assert.ok(s.best(range(0, 300), 299));
  assert.equal(s.put(range(3000, 300), bytes(251)), false, "over the budget");
  assert.equal(new PrefixStore(0).put(range(0, 300), bytes(1)), false);
});

Deno.test("PrefixStore skips short or already held sequences and drops those a longer one extends", () => {
  const s = new PrefixStore(10_000);
  assert.equal(
    s.wants(range(0, SAVE_MIN - 1)),
    false,
    "too short to be worth it",
  );
  s.put(range(0, 600), bytes(100));
  assert.equal(s.wants(range(0, 500)), false, "a prefix of one held");
  assert.ok(s.put(range(0, 900), bytes(150)), "extends the one held");
  assert.equal(s.size, 1);
  assert.equal(s.bytes, 150);
});
