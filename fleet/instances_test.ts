import assert from "node:assert/strict";
import type { EngineModel, SpanningInstance } from "../protocol/engine.ts";
import { type InstanceNode, resolveInstances, slotUnits } from "./instances.ts";

const STATS = {
  inFlight: 0,
  queued: 0,
  slots: 4,
  tokensPerSecond: 0,
  healthy: true,
};

function node(
  id: string,
  instance: SpanningInstance | null,
  over: Partial<InstanceNode> = {},
): InstanceNode {
  const models: EngineModel[] = [{
    id: "big",
    loaded: true,
    kind: "chat",
    ...(instance ? { instance } : {}),
  }];
  return {
    id,
    name: `studio-${id}`,
    url: `http://${id}.lan:7070`,
    state: "healthy",
    models,
    stats: STATS,
    dedicatedTo: null,
    probe: null,
    ...over,
  };
}

const exo = (selfId: string | null): SpanningInstance => ({
  id: "exo:i1",
  kind: "exo",
  serves: true,
  state: "ready",
  members: [
    { exoNodeId: "A", addresses: ["10.0.0.1"], hostname: "studio-a" },
    { exoNodeId: "B", addresses: ["10.0.0.2"], hostname: "studio-b" },
    { exoNodeId: "D", addresses: ["10.0.0.4"], hostname: "studio-d" },
  ].map((m) => m.exoNodeId === selfId ? { ...m, self: true } : m),
});

Deno.test("resolveInstances() maps Exo members by self, then one shared address, then host name; a member no node matches is unmanaged", () => {
  const table = resolveInstances([
    node("n1", exo("A")),
    // B's node fronts nothing, but its probe names B's address
    node("n2", null, { probe: { addresses: ["10.0.0.2"] } }),
    // C's node fronts the instance; its Exo node is no member
    node("n3", exo("C"), { probe: { hostname: "studio-c.local" } }),
  ]);
  const i = table.get("exo:i1")!;
  assert.deepEqual(
    i.members.map((
      m,
    ) => [m.exoNodeId, m.nodeId ?? null, m.managed, m.matchedBy ?? null]),
    [["A", "n1", true, "self"], ["B", "n2", true, "address"], [
      "D",
      null,
      false,
      null,
    ]],
  );
  assert.deepEqual(i.fronts, ["n1", "n3"]);
  assert.deepEqual(i.serving, ["n1", "n3"]);
  assert.equal(i.available, true);
  assert.equal(i.slots, 4, "one unit: the most any serving node has");
});

Deno.test("resolveInstances() matches by host name only when exactly one node has it", () => {
  const one = resolveInstances([
    node("n1", exo(null)),
    node("n2", null, { probe: { hostname: "Studio-B.local" } }),
  ]).get("exo:i1")!;
  assert.equal(one.members[1]!.nodeId, "n2");
  assert.equal(one.members[1]!.matchedBy, "hostname");
  const two = resolveInstances([
    node("n1", exo(null)),
    node("n2", null, { probe: { hostname: "studio-b" } }),
    node("n3", null, { probe: { hostname: "studio-b" } }),
  ]).get("exo:i1")!;
  assert.equal(two.members[1]!.managed, false, "ambiguous: unmanaged");
});

Deno.test("resolveInstances() makes an instance unavailable while a member drains, is unhealthy or gone", () => {
  const rpc = (serves: boolean): SpanningInstance => ({
    id: "rpc:p1",
    kind: "rpc",
    serves,
    state: "ready",
    members: [
      { nodeId: "h", role: "head", transport: null },
      { nodeId: "w", role: "worker", transport: "rdma" },
    ],
  });
  for (const state of ["draining", "drained", "unhealthy"] as const) {
    const i = resolveInstances([
      node("h", rpc(true)),
      node("w", rpc(false), { state }),
    ]).get("rpc:p1")!;
    assert.equal(i.available, false, state);
    assert.match(i.reason!, new RegExp(`member studio-w is ${state}`));
  }
  const gone = resolveInstances([node("h", rpc(true))]).get("rpc:p1")!;
  assert.equal(gone.available, false);
  assert.match(gone.reason!, /member w is gone/);
  const ok = resolveInstances([node("h", rpc(true)), node("w", rpc(false))])
    .get("rpc:p1")!;
  assert.equal(ok.available, true);
  assert.deepEqual(ok.serving, ["h"], "only the head serves");
  assert.equal(ok.head, "h");
});

Deno.test("resolveInstances() gives an instance on one tenant's dedicated nodes to that tenant, and degrades one that mixes them with others", () => {
  const inst: SpanningInstance = {
    id: "rpc:p1",
    kind: "rpc",
    serves: true,
    state: "ready",
    members: [{ nodeId: "a" }, { nodeId: "b" }],
  };
  const both = resolveInstances([
    node("a", inst, { dedicatedTo: "T" }),
    node("b", { ...inst, serves: false }, { dedicatedTo: "T" }),
  ]).get("rpc:p1")!;
  assert.equal(both.dedicatedTo, "T");
  assert.equal(both.available, true);
  for (const other of [null, "U"]) {
    const mixed = resolveInstances([
      node("a", inst, { dedicatedTo: "T" }),
      node("b", { ...inst, serves: false }, { dedicatedTo: other }),
    ]).get("rpc:p1")!;
    assert.equal(mixed.state, "degraded");
    assert.equal(mixed.available, false);
    assert.equal(mixed.dedicatedTo, null);
    assert.match(mixed.reason!, /mixes a tenant's dedicated nodes/);
  }
});

Deno.test("slotUnits() counts the nodes serving one instance once", () => {
  const m = (instance?: SpanningInstance): EngineModel[] => [
    { id: "x", loaded: true, kind: "chat", ...(instance ? { instance } : {}) },
  ];
  assert.equal(
    slotUnits([
      { stats: { slots: 4 }, models: m(exo("A")) },
      { stats: { slots: 6 }, models: m(exo("B")) },
      { stats: { slots: 4 }, models: m(exo("C")) },
      { stats: { slots: 2 }, models: m() },
    ]),
    8,
  );
  assert.equal(slotUnits([]), null);
});
