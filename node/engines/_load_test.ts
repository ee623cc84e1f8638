import assert from "node:assert/strict";
import { SlotLimiter } from "./_load.ts";

Deno.test("SlotLimiter.resize() gives added slots to waiters, and a smaller size takes effect as slots free", async () => {
  const limiter = new SlotLimiter(1, 4);
  const signal = new AbortController().signal;
  const first = await limiter.acquire(signal);
  const waiting = [limiter.acquire(signal), limiter.acquire(signal)];
  assert.equal(limiter.queued, 2);
  limiter.resize(3, 4);
  const [a, b] = await Promise.all(waiting);
  assert.equal(limiter.inFlight, 3);
  limiter.resize(1, 4);
  const late = limiter.acquire(signal);
  first();
  a!();
  assert.equal(limiter.queued, 1, "still over the new size: no slot passed on");
  b!();
  (await late)();
  assert.equal(limiter.inFlight, 0);
});
