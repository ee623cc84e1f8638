/**
 * An engine that dies under load, with real processes: `main.ts` (gateway
 * and an `openai` local node) in front of the scripted upstream running as
 * a process of its own, killed with SIGKILL while clients send requests.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { until } from "./_fleet.ts";
import { startGatewayProcess } from "./fixtures/cluster.ts";

const MODEL = "tiny-chat";

/** Starts the scripted upstream as a child process; resolves with it and its URL. */
async function upstreamProcess() {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      join(import.meta.dirname!, "fixtures/fake_upstream_main.ts"),
    ],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  while (!out.includes("\n")) {
    const r = await reader.read();
    if (r.done) throw new Error("the upstream exited before it listened");
    out += r.value;
  }
  reader.releaseLock();
  child.stdout.cancel().catch(() => {});
  return { child, url: out.split("\n")[0]!.trim() };
}

Deno.test("an upstream killed under load: its node is unhealthy within 5 s, and clients get 503 model_unavailable with retry-after, never 502", async () => {
  const dir = await Deno.makeTempDir({ prefix: "orchard-death-" });
  const up = await upstreamProcess();
  const adminToken = `orchard-test-${crypto.randomUUID()}`;
  const gw = await startGatewayProcess({
    dataDir: join(dir, "data"),
    adminToken,
    env: {
      ORCHARD_LOCAL_NODE: "true",
      ORCHARD_NODE_ENGINE: "openai",
      ORCHARD_UPSTREAM_URL: up.url,
    },
  });
  try {
    const { id } = await gw.admin("POST", "/tenants", {
      name: "Acme",
      slug: "acme",
    }) as { id: string };
    const { key } = await gw.admin("POST", `/tenants/${id}/keys`, {
      name: "k",
    }) as { key: string };
    const chat = () =>
      fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${key}`,
          "content-type": "application/json",
        },
        body: JSON.stringify({
          model: MODEL,
          max_tokens: 8,
          messages: [{ role: "user", content: "hi" }],
        }),
      });
    await until("the model to be routable", async () => {
      const res = await chat();
      await res.body?.cancel();
      return res.status === 200;
    }, 30_000);
    const nodeState = async () => {
      const { items } = await gw.admin("GET", "/nodes") as {
        items: { state: string; status?: { stats?: { detail?: string } } }[];
      };
      return items[0]!;
    };
    assert.equal((await nodeState()).state, "healthy");
    // Load: 4 clients back to back; the upstream is killed mid-load.
    const statuses: number[] = [];
    const answers: string[] = [];
    let running = true;
    const clients = Array.from({ length: 4 }, async () => {
      while (running) {
        const res = await chat();
        statuses.push(res.status);
        const text = await res.text();
        if (res.status !== 200) {
          answers.push(
            `${res.status} ${res.headers.get("retry-after")} ${text}`,
          );
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    });
    await new Promise((r) => setTimeout(r, 500));
    const served = statuses.filter((s) => s === 200).length;
    assert.ok(served > 0, "requests were served before the kill");
    up.child.kill("SIGKILL");
    await up.child.status;
    const killedAt = Date.now();
    await until(
      "the node to be unhealthy",
      async () => (await nodeState()).state === "unhealthy",
      10_000,
    );
    const detectedMs = Date.now() - killedAt;
    // Requests keep coming for a second after it was marked.
    await new Promise((r) => setTimeout(r, 1000));
    running = false;
    await Promise.all(clients);
    assert.ok(
      detectedMs <= 5000,
      `marked unhealthy ${detectedMs} ms after the kill`,
    );
    const node = await nodeState();
    assert.match(node.status?.stats?.detail ?? "", /unreachable/);
    assert.ok(answers.length > 0, "requests after the kill were answered");
    for (const a of answers) {
      assert.match(a, /^503 \d+ /, a);
      assert.doesNotMatch(a, /^50[24]/, a);
    }
    // The last answers, after the node was marked, name the model as unavailable.
    assert.match(answers.at(-1)!, /model_unavailable/);
  } finally {
    try {
      up.child.kill("SIGKILL");
    } catch { /* killed by the test */ }
    await up.child.status;
    await gw.stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});
