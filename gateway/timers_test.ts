import * as assert from "node:assert/strict";
import { after, cancel, race, RESOLUTION_MS } from "./timers.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

Deno.test("after() fires once, never early", async () => {
  const t0 = performance.now();
  const fired: number[] = [];
  after(30, () => fired.push(performance.now() - t0));
  after(0, () => fired.push(-1));
  await sleep(30 + 5 * RESOLUTION_MS);
  assert.equal(fired.length, 2);
  assert.equal(fired[0], -1);
  assert.ok(fired[1]! >= 30, `fired after ${fired[1]} ms`);
  assert.ok(fired[1]! < 30 + 200, `fired after ${fired[1]} ms`); // loaded CI
});

Deno.test("cancel() stops a timeout, also one due in the same tick as the one cancelling it", async () => {
  let n = 0;
  const a = after(10, () => n++);
  cancel(a);
  cancel(a); // twice is harmless
  let b: ReturnType<typeof after> | undefined = undefined;
  after(20, () => cancel(b));
  b = after(20, () => n += 100);
  await sleep(20 + 5 * RESOLUTION_MS);
  assert.equal(n, 0);
});

Deno.test("many timeouts: those cancelled never fire, the rest all do, and no runtime timer is left behind", async () => {
  const fired = new Set<number>();
  const ts = Array.from(
    { length: 1000 },
    (_, i) => after(i % 50, () => fired.add(i)),
  );
  for (let i = 0; i < 1000; i += 2) cancel(ts[i]);
  await sleep(50 + 5 * RESOLUTION_MS);
  assert.equal(fired.size, 500);
  for (const i of fired) assert.equal(i % 2, 1);
  // The test sanitizer fails this test if a runtime timer were leaked.
});

Deno.test("race() gives the promise's value, or 'timeout'", async () => {
  assert.equal(await race(Promise.resolve(7), 1000), 7);
  assert.equal(await race(new Promise(() => {}), 20), "timeout");
  await assert.rejects(race(Promise.reject(new Error("x")), 1000), /x/);
});

Deno.test("timeouts fire when the runtime timer was armed for one since cancelled, earlier or later", async () => {
  const t0 = performance.now();
  const fired: [string, number][] = [];
  const at = (name: string) => () => fired.push([name, performance.now() - t0]);
  cancel(after(20, at("cancelled early")));
  after(60, at("late")); // the timer stays armed for 20, then re-arms
  cancel(after(300, at("cancelled late")));
  after(40, at("early")); // earlier than anything armed so far
  await sleep(60 + 5 * RESOLUTION_MS);
  assert.deepEqual(fired.map(([n]) => n), ["early", "late"]);
  assert.ok(fired[0]![1] >= 40 && fired[1]![1] >= 60, JSON.stringify(fired));
});
