/**
 * Tenant-dedicated nodes with real processes: a gateway and two `openai`
 * engine nodes, each in front of its own scripted upstream (so what reaches
 * a node is what its upstream saw), and two tenants.
 */
import assert from "node:assert/strict";
import { startFakeUpstream } from "./_fleet.ts";
import { startCluster } from "./fixtures/cluster.ts";

const MODEL = "tiny-chat";

Deno.test("a dedicated node serves only its tenant (1,000 mixed requests), overflow to shared nodes follows the tenant's setting, and sharing it again takes effect at once", async () => {
  const up = [startFakeUpstream(), startFakeUpstream()];
  try {
    await using cluster = await startCluster({
      openai: { upstreamUrl: up.map((u) => u.url), models: [MODEL] },
      nodes: 2,
    });
    const [dedicated] = cluster.nodeIds as [string, string];
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
    const keys = { acme: cluster.apiKey, beta: betaKey };
    const chat = async (who: "acme" | "beta", i: number) => {
      const res = await fetch(`${cluster.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${keys[who]}`,
          "content-type": "application/json",
        },
        body: JSON.stringify({
          model: MODEL,
          max_tokens: 4,
          messages: [{ role: "user", content: `${who} ${i}` }],
        }),
      });
      await res.body?.cancel();
      return res.status;
    };
    /** Who each upstream (so each node) served since `from`, by tenant. */
    const served = (from: number[]) =>
      up.map((u, n) => {
        const who = { acme: 0, beta: 0 };
        for (const r of u.requests.slice(from[n])) {
          const text = JSON.stringify(r);
          if (text.includes('"acme ')) who.acme++;
          else if (text.includes('"beta ')) who.beta++;
        }
        return who;
      });
    const mark = () => up.map((u) => u.requests.length);
    /** `n` requests, the tenants alternating, 20 at a time; resolves with the statuses. */
    const mixed = async (n: number, only?: "acme" | "beta") => {
      const statuses: number[] = [];
      for (let i = 0; i < n; i += 20) {
        statuses.push(
          ...await Promise.all(
            Array.from(
              { length: Math.min(20, n - i) },
              (_, j) => chat(only ?? ((i + j) % 2 ? "beta" : "acme"), i + j),
            ),
          ),
        );
      }
      return statuses;
    };

    await cluster.admin("PUT", `/nodes/${dedicated}/dedication`, {
      tenantId: acme.id,
    });
    let from = mark();
    const statuses = await mixed(1000);
    assert.deepEqual([...new Set(statuses)], [200]);
    const [onDedicated, onShared] = served(from);
    assert.deepEqual(
      onDedicated,
      { acme: 500, beta: 0 },
      "only acme on its node",
    );
    assert.deepEqual(onShared, { acme: 0, beta: 500 }, "acme never on shared");

    // Its node drained: without overflow acme gets 503; with it, the shared node.
    await cluster.admin("POST", `/nodes/${dedicated}/drain`);
    await new Promise((r) => setTimeout(r, 800)); // the gateway's next fleet read
    assert.deepEqual(await mixed(10, "acme"), Array(10).fill(503));
    await cluster.admin("PATCH", `/tenants/${acme.id}`, {
      overflowToShared: true,
    });
    from = mark();
    assert.deepEqual(await mixed(10, "acme"), Array(10).fill(200));
    assert.equal(served(from)[1]!.acme, 10, "overflowed to the shared node");
    await cluster.admin("POST", `/nodes/${dedicated}/undrain`);
    await cluster.admin("PATCH", `/tenants/${acme.id}`, {
      overflowToShared: false,
    });
    // The undrain reaches the node with its next heartbeat (later on a
    // loaded machine): acme is served by its node again.
    for (let i = 0; i < 40; i++) {
      from = mark();
      const codes = await mixed(5, "acme");
      if (codes.every((c) => c === 200) && served(from)[0]!.acme === 5) break;
      await new Promise((r) => setTimeout(r, 250));
    }
    assert.equal(served(from)[0]!.acme, 5, "acme back on its undrained node");

    // Shared again: beta reaches it from the next request on.
    await cluster.admin("PUT", `/nodes/${dedicated}/dedication`, {
      tenantId: null,
    });
    from = mark();
    assert.deepEqual([...new Set(await mixed(100, "beta"))], [200]);
    assert.ok(served(from)[0]!.beta > 10, "beta uses the shared-again node");
  } finally {
    for (const u of up) await u.close();
  }
});
