/**
 * Spanning instances on the portal: two nodes front an Exo instance on
 * their two Macs and a third Mac no node runs on; the heartbeat keeps the
 * instance through its schema, and `/nodes`, `/mesh`, `/models` and
 * `/capacity` show it with its members.
 */
import assert from "node:assert/strict";
import { createJoinToken } from "../store/join_tokens.ts";
import { enrollNode, getNode, recordHeartbeat } from "../store/nodes.ts";
import { SYSTEM } from "../store/principal.ts";
import type { SpanningInstance } from "../protocol/engine.ts";
import { createWorld, portalLogin, type TestWorld } from "./_helpers.ts";

function instance(self: string): SpanningInstance {
  return {
    id: "exo:inst-1",
    kind: "exo",
    serves: true,
    state: "ready",
    members: ["A", "B", "D"].map((id, i) => ({
      exoNodeId: id,
      addresses: [`10.9.0.${i + 1}`],
      hostname: `studio-${id.toLowerCase()}`,
      memoryBytes: 40 * 2 ** 30,
      transport: "rdma" as const,
      ...(id === self ? { self: true } : {}),
    })),
  };
}

async function node(w: TestWorld, name: string, x: string, self: string) {
  const { token } = await createJoinToken(w.store, SYSTEM, {});
  const n = await enrollNode(w.store, {
    token,
    publicJwk: { kty: "OKP", crv: "Ed25519", x: x.padEnd(43, "A") },
    url: `http://10.0.0.${x === "a" ? 1 : 2}:8100`,
    name,
    engine: "openai",
    models: [],
    probe: null,
    version: null,
  });
  await recordHeartbeat(w.store, n.id, {
    intervalMs: 60_000,
    inFlight: 0,
    queued: 0,
    slots: 4,
    tokensPerSecond: 0,
    healthy: true,
    memory: null,
    models: [{
      id: "big-chat",
      loaded: true,
      kind: "chat",
      instance: { ...instance(self), extra: "dropped" },
    }],
    drainState: "none",
  });
  return n;
}

Deno.test("the portal's fleet and capacity pages show a spanning instance: members, memory, transport, unmanaged members, state, who serves it", async () => {
  const w = await createWorld();
  try {
    const a = await node(w, "mac-a", "a", "A");
    const b = await node(w, "mac-b", "b", "B");
    const stored = (await getNode(w.store, SYSTEM, a.id)).status!.models[0]!;
    assert.deepEqual(
      stored.instance,
      instance("A"),
      "kept, unknown keys dropped",
    );
    const { cookie } = await portalLogin(w, "root@example.com");
    for (const path of ["/nodes", "/mesh", "/models", "/capacity"]) {
      const res = await w.app.request(path, { headers: { cookie } });
      assert.equal(res.status, 200, path);
      const html = await res.text();
      const row = /<tr[^>]*data-instance="exo:inst-1"[\s\S]*?<\/tr>/.exec(
        html,
      )?.[0];
      assert.ok(row, `${path} shows the instance`);
      assert.match(row, /big-chat/);
      assert.match(row, /ready/);
      assert.match(row, /data-member="D"[\s\S]*?unmanaged/, path);
      assert.match(row, /mac-a[\s\S]*40\.0 GiB[\s\S]*rdma/);
      assert.match(row, /mac-a, mac-b/, `${path}: served by both`);
      for (const n of [a, b]) {
        assert.match(row, new RegExp(`data-member="${n.id}"`), path);
      }
    }
  } finally {
    await w.close();
  }
});
