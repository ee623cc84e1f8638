/**
 * An Exo instance that spans Macs, with real processes: a gateway and three
 * `openai` engine nodes, each in front of its own scripted Exo node (its
 * own `/node_id`, one shared `/state` in Exo 1.0's shapes:
 * tests/_exo_state.ts). Exo runs `big-chat` on Exo nodes A and B (of A, B,
 * C), and `wide-chat` on A and D, a Mac no Orchard node runs on.
 */
import assert from "node:assert/strict";
import { startFakeUpstream, until } from "./_fleet.ts";
import { exoState } from "./_exo_state.ts";
import { startCluster } from "./fixtures/cluster.ts";

const BIG = "big-chat";

/** `until`'s value, once it is one. */
async function found<T>(
  what: string,
  check: () => T | Promise<T>,
  ms = 10_000,
): Promise<NonNullable<T>> {
  return (await until(what, check, ms)) as NonNullable<T>;
}
const WIDE = "wide-chat";

interface Instance {
  id: string;
  model: string;
  members: {
    exoNodeId?: string;
    nodeId?: string;
    managed: boolean;
    matchedBy?: string;
    hostname?: string;
    memoryBytes?: number;
    transport?: string | null;
  }[];
  fronts: string[];
  serving: string[];
  state: string;
  available: boolean;
  reason: string | null;
  dedicatedTo: string | null;
  slots: number;
}

Deno.test("an Exo instance on 2 of 3 Exo nodes, fronted by 3 nodes, is one instance: listed once, one unit of capacity, failover among its fronts, every member billed, 503 while a member drains, and the dedicated-node rules both ways", async () => {
  const nodes = [
    {
      id: "exo-a",
      friendlyName: "studio-a",
      ips: ["10.77.0.1", "169.254.1.1"],
    },
    {
      id: "exo-b",
      friendlyName: "studio-b",
      ips: ["10.77.0.2", "169.254.1.2"],
    },
    { id: "exo-c", friendlyName: "studio-c", ips: ["10.77.0.3"] },
    { id: "exo-d", friendlyName: "studio-d", ips: ["10.77.0.4"] },
  ];
  const state = exoState(nodes, [
    {
      instanceId: "inst-big",
      modelId: BIG,
      members: ["exo-a", "exo-b"],
      bytes: 100 * 2 ** 30,
      nLayers: 40,
      kind: "MlxJacclInstance",
    },
    {
      instanceId: "inst-wide",
      modelId: WIDE,
      members: ["exo-a", "exo-d"],
      bytes: 10 * 2 ** 30,
      nLayers: 20,
    },
  ]);
  const up = ["exo-a", "exo-b", "exo-c"].map((nodeId) =>
    startFakeUpstream({
      models: [BIG, WIDE],
      exo: { nodeId, state: () => state },
    })
  );
  try {
    await using cluster = await startCluster({
      openai: { upstreamUrl: up.map((u) => u.url), models: [BIG, WIDE] },
      nodes: 3,
      slots: 4,
    });
    const [na, nb, nc] = cluster.nodeIds as [string, string, string];
    const instances = async () =>
      (await cluster.admin("GET", "/instances") as { items: Instance[] })
        .items;
    const big = async () => (await instances()).find((i) => i.model === BIG);

    // One instance, its members resolved to the nodes whose Exo node they are.
    const inst = await found("the instance, fronted by 3 nodes", async () => {
      const i = await big();
      return i && i.fronts.length === 3 && i.available ? i : null;
    });
    assert.equal(inst.id, "exo:inst-big");
    assert.deepEqual(inst.fronts, [na, nb, nc].sort());
    assert.deepEqual(
      inst.members.map((m) => [m.exoNodeId, m.nodeId, m.managed, m.matchedBy]),
      [["exo-a", na, true, "self"], ["exo-b", nb, true, "self"]],
    );
    assert.ok(!inst.members.some((m) => m.nodeId === nc), "C is no member");
    assert.deepEqual(
      inst.members.map((m) => [m.transport, m.memoryBytes]),
      [["rdma", 50 * 2 ** 30], ["rdma", 50 * 2 ** 30]],
    );
    assert.equal(inst.slots, 4, "one unit of capacity: one node's slots");
    // An Exo member with no Orchard node: unmanaged.
    const wide = (await instances()).find((i) => i.model === WIDE)!;
    assert.deepEqual(
      wide.members.map((m) => [m.exoNodeId, m.managed, m.hostname]),
      [["exo-a", true, "studio-a"], ["exo-d", false, "studio-d"]],
    );

    const tenants = await cluster.admin("GET", "/tenants") as {
      items: { id: string; slug: string }[];
    };
    const acme = tenants.items.find((t) => t.slug === "acme")!;
    const beta = await cluster.admin("POST", "/tenants", {
      name: "Beta",
      slug: "beta",
    }) as { id: string };
    const { key: betaKey } = await cluster.admin(
      "POST",
      `/tenants/${beta.id}/keys`,
      { name: "b" },
    ) as { key: string };
    const chat = async (
      model: string,
      content = "hi",
      key = cluster.apiKey,
    ) => {
      const res = await fetch(`${cluster.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${key}`,
          "content-type": "application/json",
        },
        body: JSON.stringify({
          model,
          max_tokens: 4,
          messages: [{ role: "user", content }],
        }),
      });
      const body = await res.json();
      return {
        status: res.status,
        code: body?.error?.code as string | undefined,
        message: String(body?.error?.message ?? ""),
        retryAfter: res.headers.get("retry-after"),
      };
    };

    // /v1/models lists it once.
    const list = await (await fetch(`${cluster.url}/v1/models`, {
      headers: { authorization: `Bearer ${cluster.apiKey}` },
    })).json() as { data: { id: string }[] };
    assert.equal(list.data.filter((m) => m.id === BIG).length, 1);

    // Capacity counts it once: 3 nodes of 4 slots, all fronting the
    // instance, are 4 slots; the router lets 4 requests in, not 12.
    const cap = await cluster.admin("GET", "/capacity") as {
      cluster: { slots: number | null };
    };
    assert.equal(cap.cluster.slots, 4);
    const holding = () => up.reduce((n, u) => n + u.holding, 0);
    const held = Array.from({ length: 8 }, () => chat(BIG, "hold-head"));
    await found("4 requests in flight", () => holding() === 4);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(holding(), 4, "the other 4 wait for a slot of the instance");
    for (const u of up) u.release();
    assert.deepEqual(
      (await Promise.all(held)).map((r) => r.status),
      Array(8).fill(200),
    );

    // Every member counts busy: each record names the instance's other members.
    const log = await found("the request log", async () => {
      const r = await cluster.admin(
        "GET",
        `/tenants/${acme.id}/requests?limit=50`,
      ) as { items: { model: string; nodeId: string; members?: string[] }[] };
      const rows = r.items.filter((x) => x.model === BIG);
      return rows.length >= 8 ? rows : null;
    }, 30_000);
    for (const row of log) {
      assert.deepEqual(
        [row.nodeId, ...(row.members ?? [])].filter((id) => id !== nc).sort(),
        [na, nb].sort(),
        `served by ${row.nodeId}: members ${row.members}`,
      );
    }

    // Draining a member: 503 model_unavailable with retry-after; the other
    // instance (A and D) still serves. Undrained: served again.
    await cluster.admin("POST", `/nodes/${nb}/drain`);
    const refused = await found("503 while B drains", async () => {
      const r = await chat(BIG);
      return r.status === 503 ? r : null;
    });
    assert.equal(refused.code, "model_unavailable");
    assert.match(refused.message, /member .* is drain(ing|ed)/, "it says why");
    assert.ok(Number(refused.retryAfter) > 0);
    assert.equal((await chat(WIDE)).status, 200);
    assert.match((await big())!.reason ?? "", /member .* is drain(ing|ed)/);
    await cluster.admin("POST", `/nodes/${nb}/undrain`);
    await found(
      "served after the undrain",
      async () => (await chat(BIG)).status === 200,
    );

    // A's node dedicated to acme, B's shared: mixed, degraded, not routed.
    await cluster.admin("PUT", `/nodes/${na}/dedication`, {
      tenantId: acme.id,
    });
    const mixed = await found("degraded", async () => {
      const i = await big();
      return i?.state === "degraded" ? i : null;
    });
    assert.match(mixed.reason ?? "", /mixes a tenant's dedicated nodes/);
    assert.equal(mixed.available, false);
    const r1 = await chat(BIG);
    assert.equal(r1.status, 503);
    assert.equal(r1.code, "model_unavailable");
    // Both members acme's: acme's instance, refused to beta.
    await cluster.admin("PUT", `/nodes/${nb}/dedication`, {
      tenantId: acme.id,
    });
    await found(
      "acme's instance",
      async () => (await big())?.dedicatedTo === acme.id,
    );
    for (let i = 0; i < 6; i++) {
      assert.equal((await chat(BIG)).status, 200, "acme is served");
      assert.equal((await chat(BIG, "hi", betaKey)).status, 503, "beta is not");
    }
    await cluster.admin("PUT", `/nodes/${na}/dedication`, { tenantId: null });
    await cluster.admin("PUT", `/nodes/${nb}/dedication`, { tenantId: null });
    await found(
      "shared again",
      async () => (await big())?.dedicatedTo === null,
    );

    // A fronting node dies: the others take its requests.
    cluster.nodes[2]!.kill("SIGKILL");
    await cluster.nodes[2]!.status;
    const after = await Promise.all(
      Array.from({ length: 12 }, () => chat(BIG)),
    );
    assert.deepEqual(after.map((r) => r.status), Array(12).fill(200));
    const gone = await found("C's node out of the serving fronts", async () => {
      const i = await big();
      return i && !i.serving.includes(nc) ? i : null;
    });
    assert.ok(gone.available, "C was no member: the instance stays available");
  } finally {
    for (const u of up) await u.close();
  }
});
