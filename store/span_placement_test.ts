/**
 * Spanning placement, the gateway's side: the admin's span is validated and
 * refused when its members' free memory cannot hold the model, saying how
 * much is missing; each member's heartbeat answer carries its part (the
 * worker's head-facing address from the link test, the head's worker
 * endpoints once reported); removing a node drops its span.
 */
import assert from "node:assert/strict";
import { generateEd25519 } from "../lib/jwt.ts";
import { createJoinToken } from "./join_tokens.ts";
import { k } from "./kv_keys.ts";
import { enrollNode, recordHeartbeat } from "./nodes.ts";
import { getPlacement, removeModelSpan, setModelSpan } from "./placement.ts";
import { SYSTEM } from "./principal.ts";
import { createStore, type Store } from "./store.ts";
import type { EngineModel } from "../protocol/engine.ts";

const GiB = 2 ** 30;

async function node(store: Store, url: string): Promise<string> {
  const { token } = await createJoinToken(store, SYSTEM, {});
  const { publicJwk } = await generateEd25519();
  const n = await enrollNode(store, {
    token,
    publicJwk: publicJwk as { kty: "OKP"; crv: "Ed25519"; x: string },
    url,
    engine: "llama",
    models: [],
    probe: null,
    version: null,
  });
  return n.id;
}

function beat(freeBytes: number, models: EngineModel[] = []) {
  return {
    intervalMs: 1000,
    inFlight: 0,
    queued: 0,
    slots: 1,
    tokensPerSecond: 0,
    healthy: true,
    memory: { totalBytes: 64 * GiB, freeBytes },
    models,
    drainState: "none",
  };
}

const BIG: EngineModel = {
  id: "big",
  loaded: false,
  kind: "chat",
  needs: { weightsBytes: 40 * GiB, kvBytes: 8 * GiB },
};

Deno.test("span placement: refused saying how much memory is missing; heartbeats carry each member's part", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  try {
    const head = await node(store, "http://10.0.0.1:8100");
    const w1 = await node(store, "http://10.0.0.2:8100");
    const w2 = await node(store, "http://10.0.0.3:8100");
    await recordHeartbeat(store, head, beat(20 * GiB, [BIG]));
    await recordHeartbeat(store, w1, beat(20 * GiB));
    await recordHeartbeat(store, w2, beat(20 * GiB));

    await assert.rejects(
      setModelSpan(store, SYSTEM, "big", { nodes: [head] }),
      /at least two nodes/,
    );
    await assert.rejects(
      setModelSpan(store, SYSTEM, "big", { nodes: [head, head] }),
      /must not repeat a node/,
    );
    await assert.rejects(
      setModelSpan(store, SYSTEM, "big", { nodes: [w1, head] }),
      /does not have the model big/,
    );
    // 48 GiB needed, 40 GiB free on two nodes
    await assert.rejects(
      setModelSpan(store, SYSTEM, "big", { nodes: [head, w1] }),
      /needs 48\.00 GiB \(weights 40\.00 GiB \+ KV cache 8\.00 GiB\), their free memory is 40\.00 GiB: 8\.00 GiB missing/,
    );
    const span = await setModelSpan(store, SYSTEM, "big", {
      nodes: [head, w1, w2],
      split: [2, 1, 1],
    });
    assert.deepEqual((await getPlacement(store)).spans, [span]);
    const audit = [];
    for await (const e of kv.list({ prefix: k.auditPrefix() })) {
      audit.push(e.value);
    }
    assert.ok(
      JSON.stringify(audit).includes("placement.span.set"),
      "the span is audited",
    );

    // w2's link test with the head passed over RDMA: it binds to the link's
    // address; w1 has none: its advertised address, TCP
    await kv.set(k.linkTest(head, w2), {
      a: head,
      b: w2,
      at: new Date().toISOString(),
      ok: true,
      result: {
        transport: "rdma-uc",
        local: { address: "169.254.7.3" },
        peer: { address: "169.254.7.1" },
      },
      error: null,
    });
    const a1 = (await recordHeartbeat(store, w1, beat(20 * GiB))).span;
    assert.deepEqual(a1, {
      instance: `rpc:${span.id}`,
      model: "big",
      members: [head, w1, w2],
      role: "worker",
      head,
      bind: "10.0.0.2",
      transport: "tcp",
    });
    const a2 = (await recordHeartbeat(store, w2, beat(20 * GiB))).span;
    assert.equal(a2?.role === "worker" && a2.bind, "169.254.7.3");
    assert.equal(a2?.role === "worker" && a2.transport, "rdma");

    // the head waits for endpoints until the workers report them listening
    let h = (await recordHeartbeat(store, head, beat(20 * GiB, [BIG]))).span;
    assert.equal(h?.role, "head");
    assert.deepEqual(h?.role === "head" && h.workers, [
      { nodeId: w1, endpoint: null, transport: "tcp" },
      { nodeId: w2, endpoint: null, transport: "rdma" },
    ]);
    assert.deepEqual(h?.role === "head" && h.split, [2, 1, 1]);
    const lending = (id: string, ep: string): EngineModel => ({
      id: "big",
      loaded: false,
      kind: "chat",
      servable: false,
      instance: {
        id: `rpc:${span.id}`,
        kind: "rpc",
        serves: false,
        state: "ready",
        members: [{ nodeId: head, role: "head" }, {
          nodeId: id,
          role: "worker",
          addresses: [ep],
        }],
      },
    });
    await recordHeartbeat(
      store,
      w1,
      beat(20 * GiB, [lending(w1, "10.0.0.2:5001")]),
    );
    await recordHeartbeat(
      store,
      w2,
      beat(20 * GiB, [lending(w2, "169.254.7.3:5002")]),
    );
    h = (await recordHeartbeat(store, head, beat(20 * GiB, [BIG]))).span;
    assert.deepEqual(
      h?.role === "head" && h.workers.map((w) => w.endpoint),
      ["10.0.0.2:5001", "169.254.7.3:5002"],
    );

    // the head goes offline: workers are told nothing, so they stop
    const st = (await kv.get<{ at: string }>(k.nodeStatus(head))).value!;
    await kv.set(k.nodeStatus(head), {
      ...st,
      at: new Date(Date.now() - 60_000).toISOString(),
    });
    assert.equal((await recordHeartbeat(store, w1, beat(20 * GiB))).span, null);

    await removeModelSpan(store, SYSTEM, "big");
    await assert.rejects(
      removeModelSpan(store, SYSTEM, "big"),
      /not found|Span/i,
    );
    assert.equal(
      (await recordHeartbeat(store, head, beat(20 * GiB))).span,
      null,
    );
  } finally {
    kv.close();
  }
});
