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
