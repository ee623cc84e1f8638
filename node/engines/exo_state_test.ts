import assert from "node:assert/strict";
import { exoState } from "../../tests/_exo_state.ts";
import { exoInstances, parseExoNodeId } from "./exo_state.ts";

const NODES = [
  { id: "A", friendlyName: "studio-a", ips: ["10.0.0.1", "169.254.0.1"] },
  { id: "B", friendlyName: "studio-b", ips: ["10.0.0.2"] },
  { id: "C", friendlyName: "Unknown", ips: [] },
];

Deno.test("exoInstances() reports each model's instance, its Exo members with addresses, host names and memory, the reporting node's own marked self", () => {
  const state = exoState(NODES, [{
    instanceId: "i1",
    modelId: "big",
    members: ["A", "B"],
    bytes: 1000,
    nLayers: 10,
  }]);
  const got = exoInstances(state, "A");
  assert.deepEqual([...got.keys()], ["big"]);
  assert.deepEqual(got.get("big"), {
    id: "exo:i1",
    kind: "exo",
    serves: true,
    state: "ready",
    members: [
      {
        exoNodeId: "A",
        transport: "tcp",
        addresses: ["10.0.0.1", "169.254.0.1"],
        hostname: "studio-a",
        memoryBytes: 500,
        self: true,
      },
      {
        exoNodeId: "B",
        transport: "tcp",
        addresses: ["10.0.0.2"],
        hostname: "studio-b",
        memoryBytes: 500,
      },
    ],
  });
});

Deno.test("exoInstances() takes the state from the runners: loading, failed (degraded, with the error), RDMA for JACCL", () => {
  const loading = exoState(NODES, [{
    instanceId: "i1",
    modelId: "big",
    members: ["A", "B"],
    bytes: 1,
    nLayers: 2,
    kind: "MlxJacclInstance",
    status: "RunnerLoading",
  }]);
  const i = exoInstances(loading, "C").get("big")!;
  assert.equal(i.state, "loading");
  assert.deepEqual(i.members.map((m) => [m.transport, m.self]), [
    ["rdma", undefined],
    ["rdma", undefined],
  ]);
  const failed = exoState(NODES, [{
    instanceId: "i1",
    modelId: "big",
    members: ["A"],
    bytes: 1,
    nLayers: 2,
  }]);
  const runners = failed.runners as Record<string, unknown>;
  runners[Object.keys(runners)[0]!] = {
    RunnerFailed: { errorMessage: "out of memory" },
  };
  const f = exoInstances(failed, "A").get("big")!;
  assert.equal(f.state, "degraded");
  assert.equal(f.detail, "a runner failed: out of memory");
});

Deno.test("exoInstances() ignores what is not Exo's shape and caps what it keeps", () => {
  for (
    const bad of [null, 1, "x", [], { instances: [] }, { instances: { x: 1 } }]
  ) {
    assert.equal(exoInstances(bad, "A").size, 0);
  }
  const state = exoState(
    [{
      id: "A",
      friendlyName: "a",
      ips: Array.from({ length: 40 }, (_, i) => `10.0.1.${i}`),
    }],
    [{ instanceId: "i", modelId: "m", members: ["A"], bytes: 1, nLayers: 1 }],
  );
  const m = exoInstances(state, null).get("m")!.members[0]!;
  assert.equal(m.addresses!.length, 16);
  assert.equal(parseExoNodeId("12D3KooW"), "12D3KooW");
  assert.equal(parseExoNodeId({ id: 1 }), null);
  assert.equal(parseExoNodeId("x".repeat(500)), null);
});
