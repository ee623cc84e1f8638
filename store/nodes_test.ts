import assert from "node:assert/strict";
import { generateEd25519 } from "../lib/jwt.ts";
import { ForbiddenError, UnauthorizedError } from "./errors.ts";
import { createJoinToken } from "./join_tokens.ts";
import { k } from "./kv_keys.ts";
import {
  enrollNode,
  isOnline,
  listNodes,
  nodeState,
  type NodeStatus,
  recordHeartbeat,
  setNodeDrain,
} from "./nodes.ts";
import { type Principal, SYSTEM } from "./principal.ts";
import { createStore } from "./store.ts";

const VIEWER: Principal = {
  ...SYSTEM,
  kind: "user",
  id: "u1",
  role: "tenant_viewer",
  tenantId: "t1",
};

function status(over: Partial<NodeStatus> = {}, agoMs = 0): NodeStatus {
  return {
    at: new Date(Date.now() - agoMs).toISOString(),
    intervalMs: 1000,
    stats: {
      inFlight: 0,
      queued: 0,
      slots: 1,
      tokensPerSecond: 0,
      healthy: true,
    },
    memory: null,
    models: [],
    drainState: "none",
    ...over,
  };
}

Deno.test("nodeState() is unhealthy after 3 missed heartbeats and follows drain reports", () => {
  const up = { drain: false };
  const down = { drain: true };
  assert.equal(nodeState(up, null), "unhealthy");
  assert.equal(nodeState(up, status({}, 2900)), "healthy");
  assert.equal(isOnline(status({}, 3100)), false);
  assert.equal(nodeState(up, status({}, 3100)), "unhealthy");
  const sick = status({ stats: { ...status().stats, healthy: false } });
  assert.equal(nodeState(up, sick), "unhealthy");
  assert.equal(nodeState(down, status()), "draining");
  assert.equal(nodeState(down, status({ drainState: "draining" })), "draining");
  assert.equal(nodeState(down, status({ drainState: "drained" })), "drained");
  assert.equal(nodeState(down, status({}, 5000)), "unhealthy");
  assert.equal(nodeState(up, status({ drainState: "drained" })), "draining");
  // Fast heartbeats: never down before 2 s of silence (gateways read status every 500 ms).
  const fast = (ago: number) => status({ intervalMs: 250 }, ago);
  assert.equal(isOnline(fast(1500)), true);
  assert.equal(isOnline(fast(2100)), false);
});

Deno.test("enrollNode() consumes the token with the node; a key enrolls once; heartbeats carry drain", async () => {
  const kv = await Deno.openKv(":memory:");
  const store = await createStore(kv);
  const { token } = await createJoinToken(store, SYSTEM, { uses: 2 });
  const { publicJwk } = await generateEd25519();
  const input = {
    token,
    publicJwk: publicJwk as { kty: "OKP"; crv: "Ed25519"; x: string },
    url: "http://10.0.0.2:8100",
    engine: "openai" as const,
    models: [],
    probe: null,
    version: null,
  };
  const node = await enrollNode(store, input);
  await assert.rejects(() => enrollNode(store, input), /already enrolled/);
  const id = token.split(".")[0]!;
  assert.equal(
    (await kv.get<{ usesLeft: number }>(k.joinToken(id))).value?.usesLeft,
    1,
    "the refused second enrollment spent nothing",
  );
  const hb = {
    intervalMs: 1000,
    inFlight: 1,
    queued: 0,
    slots: 2,
    tokensPerSecond: 12.5,
    healthy: true,
    models: [{ id: "m", loaded: true, kind: "chat" }],
    drainState: "none",
  };
  assert.deepEqual(await recordHeartbeat(store, node.id, hb), {
    drain: false,
    url: node.url,
    placement: null,
    span: null,
  });
  await setNodeDrain(store, SYSTEM, node.id, true);
  assert.deepEqual(await recordHeartbeat(store, node.id, hb), {
    drain: true,
    url: node.url,
    placement: null,
    span: null,
  });
  await assert.rejects(
    () => recordHeartbeat(store, "missing", hb),
    UnauthorizedError,
  );
  await assert.rejects(() => listNodes(store, VIEWER), ForbiddenError);
  const [listed] = await listNodes(store, SYSTEM);
  assert.equal(listed?.state, "draining");
  assert.equal(listed?.status?.stats.tokensPerSecond, 12.5);
  kv.close();
});
