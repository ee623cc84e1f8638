/**
 * Model placement with real processes: a gateway and a `llama` node with
 * two fixture models (each loaded in its own child process), and a
 * gateway with an `openai` node fronting a scripted upstream. The
 * operator's placement reaches the node with its heartbeat's answer.
 */
import assert from "node:assert/strict";
import { startFakeUpstream } from "./_fleet.ts";
import { startCluster } from "./fixtures/cluster.ts";

interface Replica {
  nodeId: string;
  loaded: boolean;
  servable: boolean;
  placed: boolean | null;
  pinned: boolean;
}
interface ModelsAnswer {
  items: { id: string; aliases: string[]; replicas: Replica[] }[];
  mismatches: {
    nodeId: string;
    mismatch: string;
    report: { mismatch: string | null; extra: string[] } | null;
  }[];
}

/** Polls `check` until it returns a value (not undefined), or fails after 60 s. */
async function until<T>(
  what: string,
  check: () => Promise<T | undefined>,
): Promise<T> {
  const deadline = Date.now() + 60_000;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await check();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}: ${last ?? ""}`);
}

Deno.test("placement loads pinned models on a llama node, unloads and stops serving the others, follows rules over the node's facts, and operator aliases resolve at the gateway", async () => {
  await using cluster = await startCluster({
    models: [{ name: "alpha", seed: 1 }, { name: "beta", seed: 2 }],
    slots: 1,
    threads: 1,
  });
  const node = cluster.nodeId;
  const replica = async (model: string) => {
    const v = await cluster.admin("GET", "/models") as ModelsAnswer;
    return v.items.find((m) => m.id === model)?.replicas.find((r) =>
      r.nodeId === node
    );
  };
  const listed = async () => {
    const res = await fetch(`${cluster.url}/v1/models`, {
      headers: { authorization: `Bearer ${cluster.apiKey}` },
    });
    return ((await res.json()).data as { id: string }[]).map((m) => m.id);
  };
  const chat = async (model: string) => {
    const res = await fetch(`${cluster.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${cluster.apiKey}`,
        "content-type": "application/json",
      },
      body: JSON.stringify({
        model,
        max_tokens: 2,
        messages: [{ role: "user", content: "hi" }],
      }),
    });
    return { status: res.status, body: await res.json() };
  };

  // nothing placed: both served, loaded on first use only
  assert.deepEqual((await listed()).sort(), ["alpha", "beta"]);
  assert.equal((await replica("alpha"))?.loaded, false);

  // alpha pinned here: loaded without a request, beta no longer served
  await cluster.admin("PUT", `/nodes/${node}/placement`, {
    models: [{ id: "alpha", pinned: true }],
  });
  await until("alpha loaded and beta unservable", async () => {
    const a = await replica("alpha"), b = await replica("beta");
    return a?.loaded && a.pinned && b?.servable === false ? true : undefined;
  });
  await until(
    "beta no longer routable",
    async () => (await listed()).length === 1 ? true : undefined,
  );
  assert.deepEqual(await listed(), ["alpha"]);
  assert.equal((await chat("alpha")).status, 200);
  const refused = await chat("beta");
  assert.equal(refused.status, 503);
  assert.equal(refused.body.error.code, "model_unavailable");

  // beta pinned instead: alpha's process is stopped, beta's started
  await cluster.admin("PUT", `/nodes/${node}/placement`, {
    models: [{ id: "beta", pinned: true }],
  });
  await until("beta loaded and alpha unloaded", async () => {
    const a = await replica("alpha"), b = await replica("beta");
    return b?.loaded && a && !a.loaded && !a.servable ? true : undefined;
  });
  await until(
    "alpha no longer routable",
    async () => (await listed()).join() === "beta" ? true : undefined,
  );

  // a rule over the node's reported memory places alpha (pinned) on it
  await cluster.admin("PUT", `/nodes/${node}/placement`, { models: [] });
  const rule = await cluster.admin("POST", "/placement/rules", {
    model: "alpha",
    pinned: true,
    minMemoryGb: 0.5,
  }) as { id: string };
  await until("the rule's model loaded", async () => {
    const a = await replica("alpha"), b = await replica("beta");
    return a?.loaded && a.placed && b?.placed === false && !b.loaded
      ? true
      : undefined;
  });
  // a rule the node does not meet places nothing: every model served again
  await cluster.admin("DELETE", `/placement/rules/${rule.id}`);
  await cluster.admin("POST", "/placement/rules", {
    model: "alpha",
    pinned: true,
    minMemoryGb: 100_000,
  });
  await until("no placement applies", async () => {
    const b = await replica("beta");
    return b?.servable && b.placed === null ? true : undefined;
  });
  // the gateway reads the fleet every 500 ms
  await until(
    "both models routable",
    async () => (await listed()).length === 2 ? true : undefined,
  );
  assert.deepEqual((await listed()).sort(), ["alpha", "beta"]);

  // an operator alias is listed and resolves to its model
  await cluster.admin("PUT", "/model-aliases/house-model", { model: "beta" });
  assert.ok((await listed()).includes("house-model"));
  const viaAlias = await chat("house-model");
  assert.equal(viaAlias.status, 200);
  assert.equal(viaAlias.body.model, "beta");
  const models = await cluster.admin("GET", "/models") as ModelsAnswer;
  assert.ok(models.items.find((m) => m.id === "beta")!.aliases.includes(
    "house-model",
  ));
  await cluster.admin("DELETE", "/model-aliases/house-model");
  assert.ok(!(await listed()).includes("house-model"));
});

Deno.test("a fronted engine reports that it does not serve its placed model", async () => {
  const up = startFakeUpstream({ models: ["tiny-chat"] });
  try {
    await using cluster = await startCluster({
      openai: { upstreamUrl: up.url, models: ["tiny-chat"] },
    });
    await cluster.admin("PUT", `/nodes/${cluster.nodeId}/placement`, {
      models: [{ id: "qwen-7b", pinned: true }],
    });
    const m = await until("the node's mismatch report", async () => {
      const v = await cluster.admin("GET", "/models") as ModelsAnswer;
      return v.mismatches.find((x) =>
        x.nodeId === cluster.nodeId && x.report?.mismatch?.includes("qwen-7b")
      );
    });
    // the node's own report, sent with its heartbeat
    assert.equal(
      m.report!.mismatch,
      "desired qwen-7b, engine serves tiny-chat",
    );
    assert.deepEqual(m.report!.extra, ["tiny-chat"]);
    const v = await cluster.admin("GET", "/models") as ModelsAnswer;
    const placed = v.items.find((x) => x.id === "qwen-7b")!.replicas[0]!;
    assert.equal(placed.servable, false);
    assert.equal(placed.placed, true);
    // the engine still serves what it runs: Orchard cannot unload it
    const tiny = v.items.find((x) => x.id === "tiny-chat")!.replicas[0]!;
    assert.equal(tiny.placed, false);
    assert.equal(tiny.servable, true);
  } finally {
    await up.close();
  }
});
