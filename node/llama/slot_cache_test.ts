import assert from "node:assert/strict";
import { commonPrefix, SlotCache } from "./slot_cache.ts";

const t = (...xs: number[]) => Int32Array.from(xs);

Deno.test("commonPrefix() counts equal leading tokens", () => {
  assert.equal(commonPrefix(t(1, 2, 3), t(1, 2, 4)), 2);
  assert.equal(commonPrefix(t(), t(1)), 0);
  assert.equal(commonPrefix([5, 6], t(5, 6, 7)), 2);
});

Deno.test("SlotCache.acquire() prefers the slot holding the longest prefix, else the least recently used", () => {
  const c = new SlotCache(3);
  const a = c.acquire(t(1, 2, 3, 4))!;
  const b = c.acquire(t(9, 9, 9))!;
  assert.notEqual(a.slot, b.slot);
  c.release(a.slot, t(1, 2, 3, 4, 5)); // prompt + what it generated
  c.release(b.slot, t(9, 9, 9, 8));
  const again = c.acquire(t(1, 2, 3, 7))!;
  assert.deepEqual(again, { slot: a.slot, reuse: 3, from: null });
  c.release(again.slot, t(1, 2, 3, 7));
  // nothing in common: the slot never used goes first, then the oldest
  const fresh = c.acquire(t(5))!;
  assert.deepEqual(fresh, { slot: 2, reuse: 0, from: null });
  const evict = c.acquire(t(6, 6))!;
  assert.equal(evict.slot, b.slot, "the least recently released slot");
  assert.equal(c.acquire(t(1))!.slot, a.slot);
  assert.equal(c.free, 0);
  assert.equal(c.acquire(t(1)), null, "all busy");
});

Deno.test("SlotCache.acquire() always leaves the prompt's last token to decode", () => {
  const c = new SlotCache(1);
  const g = c.acquire(t(1, 2, 3))!;
  c.release(g.slot, t(1, 2, 3, 4));
  assert.equal(c.acquire(t(1, 2, 3))!.reuse, 2);
});

Deno.test("SlotCache.acquire() shares a longer prefix from a busy slot into the least recently used free slot", () => {
  const c = new SlotCache(3);
  const busy = c.acquire(t(7, 7, 7, 7, 1))!;
  const other = c.acquire(t(3))!;
  c.release(other.slot, t(7, 7, 2)); // a free slot with a shorter match
  const g = c.acquire(t(7, 7, 7, 7, 2), [{
    slot: busy.slot,
    tokens: [7, 7, 7, 7, 1],
  }])!;
  assert.equal(g.from, busy.slot);
  assert.equal(g.reuse, 4);
  assert.equal(g.slot, 2, "the never-used slot, not the one holding 7 7");
  // a free slot's own cache, when it is the longest, is used in place
  const h = c.acquire(t(7, 7, 9), [])!;
  assert.deepEqual(h, { slot: other.slot, reuse: 2, from: null });
});

const range = (from: number, n: number) =>
  Int32Array.from({ length: n }, (_, i) => from + i);

Deno.test("SlotCache.acquire() never destroys a long cached prefix for a short match while an empty slot is free", () => {
  const c = new SlotCache(2);
  // request 1: a 1,400-token system prompt after its own first line
  const first = Int32Array.from([1, 2, ...range(100, 1400), 7, 7]);
  const g1 = c.acquire(first)!;
  c.release(g1.slot, Int32Array.from([...first, 9, 9])); // + its answer
  // request 2: same opening token, a different first line, same system prompt
  const second = Int32Array.from([1, 3, ...range(100, 1400), 8]);
  const g2 = c.acquire(second)!;
  assert.notEqual(g2.slot, g1.slot, "the empty slot, not request 1's");
  assert.equal(
    g2.reuse,
    1,
    "the one shared token, taken from request 1's slot",
  );
  assert.equal(g2.from, g1.slot);
  assert.equal(c.cached(g1.slot)!.length, first.length + 2, "kept whole");
});

Deno.test("SlotCache.acquire() evicts the slot that loses least when none is empty", () => {
  const c = new SlotCache(2);
  const long = range(1000, 3000);
  const short = range(5000, 200);
  const a = c.acquire(long)!;
  const b = c.acquire(short)!;
  c.release(b.slot, short); // released first: least recently used
  c.release(a.slot, long);
  const g = c.acquire(range(9000, 50))!;
  assert.equal(
    g.slot,
    b.slot,
    "200 tokens lost, not 3000 (though more recent)",
  );
  // the agent holding the long prefix comes back: its slot, reused in place
  const back = c.acquire(Int32Array.from([...long, 1, 2, 3]))!;
  assert.deepEqual(back, { slot: a.slot, reuse: 3000, from: null });
});

Deno.test("SlotCache.acquire() keeps a conversation in its own slot rather than copying it into an empty one", () => {
  const c = new SlotCache(3);
  const turn1 = range(1, 500);
  const g = c.acquire(turn1)!;
  // cached: prompt + an answer the next turn renders a little differently
  c.release(g.slot, Int32Array.from([...turn1, 42, 43, 44]));
  const turn2 = Int32Array.from([...turn1, 42, 50, ...range(600, 100)]);
  assert.deepEqual(c.acquire(turn2), { slot: g.slot, reuse: 501, from: null });
});

Deno.test("SlotCache.acquire() restores a saved prefix when it gives back more than the copies cost", () => {
  const c = new SlotCache(1);
  const shared = range(1, 5000); // system prompt and tools every session has
  const b = Int32Array.from([...shared, ...range(20_000, 600)]);
  const g = c.acquire(b)!;
  c.release(g.slot, b);
  // session A comes back: 3,000 tokens of its own after the shared part are saved in host memory
  const a = Int32Array.from([...shared, ...range(30_000, 3000), 5]);
  const host = { restorable: 8000, savable: () => true };
  assert.deepEqual(c.acquire(a, [], host), {
    slot: 0,
    reuse: 8000,
    from: null,
    restore: true,
  });
  c.release(0, b);
  // a saved prefix only a little longer than what the slot holds: not worth two copies
  assert.deepEqual(c.acquire(a, [], { ...host, restorable: 5050 }), {
    slot: 0,
    reuse: 5000,
    from: null,
  });
});
