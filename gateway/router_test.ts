import assert from "node:assert/strict";
import { StaticFleet } from "./_testing.ts";
import { CapacityError, NodeRouter } from "./router.ts";
import { affinityOf } from "./affinity.ts";

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

Deno.test("NodeRouter.acquire() sends a conversation to the same node while it is not much busier, and spreads conversations", async () => {
  const router = new NodeRouter(fleetOf([["a", 4], ["b", 4], ["c", 4]]));
  const signal = new AbortController().signal;
  const conversation = affinityOf({
    model: "m",
    messages: [
      { role: "system", content: "You are terse." },
      { role: "user", content: "Plan my trip" },
    ],
  })!;
  const first = await router.acquire("m", signal, null, conversation);
  first.release();
  for (let turn = 0; turn < 20; turn++) {
    const slot = await router.acquire("m", signal, null, conversation);
    assert.equal(slot.node.id, first.node.id, `turn ${turn}`);
    slot.release();
  }
  // Its node holding 2 of 4 slots (0.5 more than the idle others): still it.
  const busy = [
    await router.acquire("m", signal, first.node.id === "a" ? "b" : "a"),
  ];
  const held = [];
  while (router.inFlight(first.node.id) < 2) {
    held.push(await router.acquire("m", signal, null, conversation));
  }
  const again = await router.acquire("m", signal, null, conversation);
  assert.equal(again.node.id, first.node.id, "within the slack");
  held.push(again);
  // 3 of 4 (0.75 over an idle node): the least loaded instead.
  const elsewhere = await router.acquire("m", signal, null, conversation);
  assert.notEqual(elsewhere.node.id, first.node.id, "past the slack");
  for (const s of [...held, ...busy, elsewhere]) s.release();
  // 300 conversations spread over the three nodes.
  const counts: Record<string, number> = { a: 0, b: 0, c: 0 };
  for (let i = 0; i < 300; i++) {
    const slot = await router.acquire(
      "m",
      signal,
      null,
      affinityOf({
        model: "m",
        messages: [{ role: "user", content: `q${i}` }],
      }),
    );
    counts[slot.node.id]!++;
    slot.release();
  }
  for (const n of Object.values(counts)) {
    assert.ok(n >= 60 && n <= 140, JSON.stringify(counts));
  }
});

Deno.test("affinityOf() follows prompt_cache_key over the conversation's opening", () => {
  const turn = (content: string, key?: string) =>
    affinityOf({
      model: "m",
      messages: [{ role: "system", content }, { role: "user", content: "Go" }],
      ...(key === undefined ? {} : { prompt_cache_key: key }),
    });
  // one key: one number, whatever the opening
  assert.equal(turn("Prompt v1", "session-1"), turn("Prompt v2", "session-1"));
  assert.notEqual(
    turn("Prompt v1", "session-1"),
    turn("Prompt v1", "session-2"),
  );
  assert.notEqual(turn("Prompt v1"), turn("Prompt v2"));
  // an empty key asks for nothing: the opening decides
  assert.equal(turn("Prompt v1", ""), turn("Prompt v1"));
  // per model
  assert.notEqual(
    affinityOf({ model: "a", prompt_cache_key: "k" }),
    affinityOf({ model: "b", prompt_cache_key: "k" }),
  );
  // a key is not the same as an opening of the same text
  assert.notEqual(
    affinityOf({ model: "m", prompt_cache_key: "Hi" }),
    affinityOf({ model: "m", prompt: "Hi" }),
  );
});

Deno.test("NodeRouter.acquire() sends one prompt_cache_key's requests to one node of two, and keys spread", async () => {
  const router = new NodeRouter(fleetOf([["a", 4], ["b", 4]]));
  const signal = new AbortController().signal;
  const counts: Record<string, number> = { a: 0, b: 0 };
  for (let k = 0; k < 40; k++) {
    const nodes = new Set<string>();
    for (let turn = 0; turn < 5; turn++) {
      const slot = await router.acquire(
        "m",
        signal,
        null,
        affinityOf({
          model: "m",
          prompt_cache_key: `session-${k}`,
          messages: [{ role: "user", content: `turn ${turn} of ${k}` }],
        }),
      );
      nodes.add(slot.node.id);
      slot.release();
    }
    assert.equal(nodes.size, 1, `session-${k}`);
    counts[[...nodes][0]!]!++;
  }
  assert.ok(counts.a! >= 8 && counts.b! >= 8, JSON.stringify(counts));
});

Deno.test("affinityOf() is the same for every turn of a conversation and null without a prompt", () => {
  const opening = [
    { role: "system", content: "Be brief." },
    { role: "user", content: [{ type: "text", text: "Hello" }] },
  ];
  const a = affinityOf({ model: "m", messages: opening });
  const b = affinityOf({
    model: "m",
    messages: [
      ...opening,
      { role: "assistant", content: "Hi" },
      { role: "user", content: "More" },
    ],
  });
  assert.equal(a, b);
  assert.notEqual(a, affinityOf({ model: "m2", messages: opening }));
  assert.notEqual(
    a,
    affinityOf({ model: "m", messages: [{ role: "user", content: "Hello" }] }),
  );
  assert.equal(
    affinityOf({
      model: "m",
      system: "Be brief.",
      messages: [{ role: "user", content: "x" }],
    }),
    affinityOf({
      model: "m",
      system: [{ type: "text", text: "Be brief." }],
      messages: [{ role: "user", content: "x" }],
    }),
  );
  assert.equal(affinityOf({ model: "m", input: "embed me" }), null);
  assert.equal(
    typeof affinityOf({ model: "m", prompt: "Once upon" }),
    "number",
  );
});

Deno.test("NodeRouter: a request waiting for a slot gets one on a node that joins (or comes back) meanwhile", async () => {
  const fleet = fleetOf([["a", 1]]);
  const router = new NodeRouter(fleet, { queueTimeoutMs: 5000 });
  const signal = new AbortController().signal;
  const held = await router.acquire("m", signal);
  const waiting = router.acquire("m", signal);
  assert.equal(router.queued, 1);
  const t0 = performance.now();
  fleet.add("b", "http://b", MODEL, 1);
  const slot = await waiting;
  assert.equal(slot.node.id, "b");
  assert.ok(
    performance.now() - t0 < 1000,
    "within a recheck, not the queue's deadline",
  );
  assert.equal(router.queued, 0);
  slot.release();
  held.release();
});

Deno.test("NodeRouter.acquire() says how long a request waited for its slot, and refuses for lack of capacity with the reason", async () => {
  const fleet = fleetOf([["a", 1]]);
  const router = new NodeRouter(fleet, { queueMax: 1, queueTimeoutMs: 300 });
  const signal = new AbortController().signal;
  const held = await router.acquire("m", signal);
  assert.equal(held.queuedMs, 0, "a free slot: no wait");
  const waiting = router.acquire("m", signal);
  // the queue (1) is full: refused at once, having waited nothing
  const full = await router.acquire("m", signal).then(
    () => null,
    (e) => e,
  );
  assert.ok(full instanceof CapacityError);
  assert.equal(full.reason, "queue_full");
  assert.equal(full.waitedMs, 0);
  assert.equal(full.status, 503);
  assert.equal(full.code, "server_busy");
  await new Promise((r) => setTimeout(r, 50));
  held.release();
  const slot = await waiting;
  assert.ok(slot.queuedMs >= 40, `waited ${slot.queuedMs} ms`);
  // the slot stays held: the next one waits out its deadline
  const late = await router.acquire("m", signal).then(() => null, (e) => e);
  assert.ok(late instanceof CapacityError);
  assert.equal(late.reason, "queue_timeout");
  assert.ok(late.waitedMs >= 250, `waited ${late.waitedMs} ms`);
  slot.release();
});

Deno.test("NodeRouter waits 120 s by default, a model's own deadline where set", () => {
  const router = new NodeRouter(fleetOf([["a", 1]]), {
    queueTimeoutByModel: { big: 300_000 },
  });
  assert.equal(router.queueTimeoutFor("m"), 120_000);
  assert.equal(router.queueTimeoutFor("big"), 300_000);
});

Deno.test("NodeRouter: a request for a model with its own short deadline is refused at it, with retry-after estimating the wait", async () => {
  const fleet = fleetOf([["a", 1]]);
  fleet.add("q", "http://q", [{ id: "quick", loaded: true, kind: "chat" }], 1);
  const router = new NodeRouter(fleet, {
    queueTimeoutMs: 60_000,
    queueTimeoutByModel: { quick: 200 },
  });
  const signal = new AbortController().signal;
  // slots of "quick" were held ~300 ms each so far
  for (let i = 0; i < 2; i++) {
    const s = await router.acquire("quick", signal);
    await new Promise((r) => setTimeout(r, 300));
    s.release();
  }
  const held = await router.acquire("quick", signal);
  const t0 = performance.now();
  const late = await router.acquire("quick", signal).then(() => null, (e) => e);
  const waited = performance.now() - t0;
  assert.ok(late instanceof CapacityError);
  assert.equal(late.reason, "queue_timeout");
  assert.ok(waited >= 190 && waited < 5000, `waited ${waited} ms`);
  // the holder has ~100 ms of its ~300 ms hold left: retry in 1 s
  assert.equal(late.retryAfterS, 1);
  assert.equal(late.headers["retry-after"], "1");
  held.release();
});

Deno.test("NodeRouter.estimateWaitS() adds a hold per slot's worth of requests queued ahead", async () => {
  const fleet = fleetOf([["a", 1]]);
  const router = new NodeRouter(fleet, { queueTimeoutMs: 60_000 });
  const signal = new AbortController().signal;
  // nothing measured yet: a hold is assumed 10 s
  const held = await router.acquire("m", signal);
  assert.equal(router.estimateWaitS("m"), 10);
  const ac = new AbortController();
  const waiters = [0, 1, 2].map(() =>
    router.acquire("m", ac.signal).catch(() => null)
  );
  // the holder's 10 s, then one hold for each of the 3 queued on 1 slot
  assert.equal(router.estimateWaitS("m"), 40);
  ac.abort();
  await Promise.all(waiters);
  held.release();
});

Deno.test("NodeRouter.acquire() counts the nodes fronting one spanning instance as one pool of its slots", async () => {
  const fleet = fleetOf([["a", 4], ["b", 4], ["c", 4], ["solo", 1]]);
  for (const n of fleet.list.slice(0, 3)) {
    n.pool = { key: "instance:exo:1", slots: 3, members: ["a", "b"] };
  }
  const router = new NodeRouter(fleet, { queueTimeoutMs: 50 });
  const signal = new AbortController().signal;
  const held = [];
  for (let i = 0; i < 4; i++) held.push(await router.acquire("m", signal));
  const pooled = held.filter((s) => s.node.pool).length;
  assert.equal(pooled, 3, "3 slots across the 3 fronting nodes, not 12");
  assert.equal(held.filter((s) => s.node.id === "solo").length, 1);
  await assert.rejects(router.acquire("m", signal), CapacityError);
  held.find((s) => s.node.pool)!.release();
  const again = await router.acquire("m", signal);
  assert.ok(again.node.pool, "a freed slot of the instance is taken again");
  again.release();
  for (const s of held) s.release();
  assert.equal(
    router.inFlight("a") + router.inFlight("b") + router.inFlight("c"),
    0,
  );
});
