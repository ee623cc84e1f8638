import assert from "node:assert/strict";
import { joinToken, startFakeUpstream, startGateway, until } from "./_fleet.ts";
import { spawnNode, stopNode } from "./fixtures/node_process.ts";

Deno.test("deno task node enrolls from flags and env, and restarts with its identity and no token", async () => {
  const gw = await startGateway();
  const up = startFakeUpstream();
  const dir = await Deno.makeTempDir({ prefix: "orchard-node-" });
  const env = {
    ORCHARD_NODE_ENGINE: "openai",
    ORCHARD_UPSTREAM_URL: up.url,
    ORCHARD_NODE_STATE_DIR: dir,
    ORCHARD_NODE_HOST: "127.0.0.1",
  };
  try {
    const token = await joinToken(gw);
    const first = await spawnNode(
      [
        "--gateway",
        gw.url,
        "--join",
        token,
        "--port",
        "0",
        "--heartbeat-ms",
        "100",
      ],
      env,
    );
    const m = /^Orchard node (\S+) serving at (http:\/\/127\.0\.0\.1:\d+)$/
      .exec(first.line);
    assert.ok(m, first.line);
    const nodeId = m[1]!;
    await until("healthy", async () => {
      await gw.fleet.refresh();
      return gw.fleet.candidates("tiny-chat")[0]?.id === nodeId;
    }, 5000);
    await stopNode(first.child);

    const second = await spawnNode(["--gateway", gw.url, "--port", "0"], env);
    assert.match(second.line, new RegExp(`^Orchard node ${nodeId} serving at`));
    await stopNode(second.child);

    const refused = await spawnNode(["--gateway", "http://127.0.0.1:9"], {
      ...env,
      ORCHARD_NODE_STATE_DIR: `${dir}/other`,
    });
    const status = await refused.child.status;
    assert.equal(status.code, 1);
    assert.match(
      await new Response(refused.child.stderr).text(),
      /not enrolled with http:\/\/127\.0\.0\.1:9; pass --join TOKEN/,
    );
  } finally {
    await gw.close();
    await up.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("deno task node --engine llama serves a GGUF from --models through the gateway's signed calls", async () => {
  const gw = await startGateway();
  const dir = await Deno.makeTempDir({ prefix: "orchard-node-llama-" });
  const { writeFixtureModel } = await import("../tools/fixture_model.ts");
  await Deno.mkdir(`${dir}/models`);
  await writeFixtureModel(`${dir}/models/tiny.gguf`);
  try {
    const node = await spawnNode([
      "--gateway",
      gw.url,
      "--join",
      await joinToken(gw),
      "--engine",
      "llama",
      "--models",
      `${dir}/models`,
      "--slots",
      "2",
      "--threads",
      "1",
      "--port",
      "0",
      "--heartbeat-ms",
      "200",
    ], {
      ORCHARD_NODE_STATE_DIR: `${dir}/state`,
      ORCHARD_NODE_HOST: "127.0.0.1",
    });
    try {
      const nodeId = /^Orchard node (\S+) serving/.exec(node.line)?.[1];
      assert.ok(nodeId, node.line);
      await until("routable", async () => {
        await gw.fleet.refresh();
        return gw.fleet.candidates("tiny")[0]?.id === nodeId;
      }, 10_000);
      const res = await gw.fleet.fetchNode(nodeId, "/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "tiny",
          messages: [{ role: "user", content: "hi" }],
          max_tokens: 4,
          temperature: 0,
        }),
      });
      assert.equal(res.status, 200);
      const body = await res.json();
      assert.equal(body.usage.completion_tokens, 4);
      assert.equal(body.usage.prompt_tokens, 99); // Qwen 2.5's default system message + "hi"
      const url = /serving at (\S+)$/.exec(node.line)![1]!;
      const direct = await fetch(`${url}/v1/models`);
      assert.equal(direct.status, 401); // nobody on the LAN can use it directly
      await direct.body?.cancel();
    } finally {
      await stopNode(node.child);
    }
  } finally {
    await gw.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a node removed by an admin stops within a heartbeat and says how to join again", async () => {
  const gw = await startGateway();
  const up = startFakeUpstream();
  const dir = await Deno.makeTempDir({ prefix: "orchard-node-removed-" });
  try {
    const node = await spawnNode([
      "--gateway",
      gw.url,
      "--join",
      await joinToken(gw),
      "--port",
      "0",
      "--heartbeat-ms",
      "100",
    ], {
      ORCHARD_NODE_ENGINE: "openai",
      ORCHARD_UPSTREAM_URL: up.url,
      ORCHARD_NODE_STATE_DIR: dir,
      ORCHARD_NODE_HOST: "127.0.0.1",
    });
    const nodeId = /^Orchard node (\S+) serving/.exec(node.line)?.[1];
    assert.ok(nodeId, node.line);
    await until("healthy", async () => {
      await gw.fleet.refresh();
      return gw.fleet.candidates("tiny-chat")[0]?.id === nodeId;
    }, 5000);
    const removedAt = Date.now();
    const del = await gw.admin("DELETE", `/nodes/${nodeId}`);
    assert.equal(del.status, 200);
    await del.body?.cancel();
    const status = await node.child.status;
    assert.equal(status.code, 3);
    assert.ok(
      Date.now() - removedAt < 2000,
      "stopped within a heartbeat or so",
    );
    const err = await new Response(node.child.stderr).text();
    assert.match(err, /removed from the gateway/);
    assert.match(err, /deno task node --gateway .* --join TOKEN/);
    await node.child.stdout.cancel().catch(() => {});
  } finally {
    await gw.close();
    await up.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a busy port is refused with an error naming the port", async () => {
  const busy = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const up = startFakeUpstream();
  const dir = await Deno.makeTempDir({ prefix: "orchard-node-port-" });
  try {
    const port = (busy.addr as Deno.NetAddr).port;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "node/main.ts", "--gateway", "http://127.0.0.1:9"],
      env: {
        ORCHARD_NODE_ENGINE: "openai",
        ORCHARD_UPSTREAM_URL: up.url,
        ORCHARD_NODE_STATE_DIR: dir,
        ORCHARD_NODE_HOST: "127.0.0.1",
        ORCHARD_NODE_PORT: String(port),
        ORCHARD_LOG_LEVEL: "error",
      },
      stdout: "null",
      stderr: "piped",
    }).output();
    assert.equal(out.code, 1);
    const err = new TextDecoder().decode(out.stderr);
    assert.match(
      err,
      new RegExp(`port ${port} on 127\\.0\\.0\\.1 is already in use`),
    );
  } finally {
    busy.close();
    await up.close();
    await Deno.remove(dir, { recursive: true });
  }
});
