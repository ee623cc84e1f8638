import assert from "node:assert/strict";
import { StaticFleet } from "./_testing.ts";
import { NodeRouter } from "./router.ts";

const MODEL = [{ id: "m", loaded: true, kind: "chat" as const }];

function fleetOf(nodes: [id: string, slots: number][]): StaticFleet {
  const fleet = new StaticFleet();
  for (const [id, slots] of nodes) fleet.add(id, `http://${id}`, MODEL, slots);
  return fleet;
}

Deno.test("NodeRouter.acquire() spreads sequential requests over equal nodes", async () => {
  const router = new NodeRouter(fleetOf([["a", 4], ["b", 4]]));
  const counts: Record<string, number> = { a: 0, b: 0 };
  for (let i = 0; i < 100; i++) {
    const slot = await router.acquire("m", new AbortController().signal);
    counts[slot.node.id]!++;
    slot.release();
  }
  assert.ok(counts.a! <= 70 && counts.b! <= 70, JSON.stringify(counts));
});

Deno.test("NodeRouter.acquire() prefers the node with the lower share of its slots in use", async () => {
  const router = new NodeRouter(fleetOf([["small", 1], ["big", 8]]));
  const signal = new AbortController().signal;
  const held: Awaited<ReturnType<NodeRouter["acquire"]>>[] = [];
  for (let i = 0; i < 8; i++) held.push(await router.acquire("m", signal));
  const on = (id: string) => held.filter((s) => s.node.id === id).length;
  assert.equal(on("small") + on("big"), 8);
  assert.ok(on("small") <= 1);
  for (const s of held) s.release();
});
