import assert from "node:assert/strict";
import type { Fleet, NodeView } from "../fleet/types.ts";
import { NodeRouter } from "./router.ts";

function node(id: string, slots = 4): NodeView {
  return {
    id,
    name: id,
    url: `http://${id}`,
    engine: "openai",
    state: "healthy",
    models: [{ id: "m", loaded: true, kind: "chat" }],
    stats: {
      inFlight: 0,
      queued: 0,
      slots,
      tokensPerSecond: 0,
      healthy: true,
    },
    lastHeartbeatAt: null,
    enrolledAt: new Date(0).toISOString(),
  };
}

function fleetOf(nodes: NodeView[]): Fleet {
  return { candidates: () => nodes } as unknown as Fleet;
}

Deno.test("NodeRouter.acquire() spreads sequential requests over equal nodes", async () => {
  const router = new NodeRouter(fleetOf([node("a"), node("b")]));
  const counts: Record<string, number> = { a: 0, b: 0 };
  for (let i = 0; i < 100; i++) {
    const slot = await router.acquire("m", new AbortController().signal);
    counts[slot.node.id]!++;
    slot.release();
  }
  assert.ok(counts.a! <= 70 && counts.b! <= 70, JSON.stringify(counts));
});

Deno.test("NodeRouter.acquire() prefers the node with the lower share of its slots in use", async () => {
  const router = new NodeRouter(fleetOf([node("small", 1), node("big", 8)]));
  const signal = new AbortController().signal;
  const held: Awaited<ReturnType<NodeRouter["acquire"]>>[] = [];
  for (let i = 0; i < 8; i++) held.push(await router.acquire("m", signal));
  const on = (id: string) => held.filter((s) => s.node.id === id).length;
  assert.equal(on("small") + on("big"), 8);
  assert.ok(on("small") <= 1);
  for (const s of held) s.release();
});
