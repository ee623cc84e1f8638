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

    // Not enrolled and no token: exit 3, which services do not restart
    // (under launchd, whose KeepAlive only tells 0 from non-zero: exit 0).
    for (const [service, code] of [["", 3], ["launchd", 0]] as const) {
      const refused = await spawnNode(["--gateway", "http://127.0.0.1:9"], {
        ...env,
        ORCHARD_NODE_STATE_DIR: `${dir}/other`,
        ORCHARD_NODE_SERVICE: service,
      });
      const status = await refused.child.status;
      assert.equal(status.code, code, service);
      const err = await new Response(refused.child.stderr).text();
      assert.match(
        err,
        /not enrolled with http:\/\/127\.0\.0\.1:9; pass --join TOKEN/,
      );
      assert.match(
        err,
        /deno task node join --gateway http:\/\/127\.0\.0\.1:9 --join TOKEN/,
      );
    }
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
    assert.match(err, /deno task node join --gateway .* --join TOKEN/);
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

Deno.test("a node advertising a URL the gateway cannot reach is told so: a warning naming the URL and what to try, and reachable: false in the admin API", async () => {
  const gw = await startGateway();
  const up = startFakeUpstream();
  const dir = await Deno.makeTempDir({ prefix: "orchard-node-unreachable-" });
  const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const deadPort = (closed.addr as Deno.NetAddr).port;
  closed.close(); // nothing listens there now
  const advertised = `http://127.0.0.1:${deadPort}`;
  let node: Awaited<ReturnType<typeof spawnNode>> | null = null;
  try {
    node = await spawnNode([
      "--gateway",
      gw.url,
      "--join",
      await joinToken(gw),
      "--port",
      "0",
      "--advertise",
      advertised,
      "--heartbeat-ms",
      "100",
    ], {
      ORCHARD_NODE_ENGINE: "openai",
      ORCHARD_UPSTREAM_URL: up.url,
      ORCHARD_NODE_STATE_DIR: dir,
      ORCHARD_NODE_HOST: "127.0.0.1",
    });
    const nodeId = /^Orchard node (\S+) serving at (\S+)$/.exec(node.line);
    assert.ok(nodeId, node.line);
    assert.equal(nodeId[2], advertised);
    const view = await until("reachable: false", async () => {
      const n = await (await gw.admin("GET", `/nodes/${nodeId[1]}`)).json();
      return n.reachable === false ? n : null;
    }, 10_000);
    assert.equal(view.reachability.url, advertised);
    assert.match(view.reachability.error, /connection refused/);
    // The node's own warning, once the next heartbeat carries the result.
    const reader = node.child.stderr.pipeThrough(new TextDecoderStream())
      .getReader();
    let err = "";
    while (!/Firewall/.test(err)) {
      const { value, done } = await reader.read();
      if (done) break;
      err += value;
    }
    reader.releaseLock();
    assert.match(
      err,
      new RegExp(
        `the gateway cannot reach this node at ${advertised}: connection refused`,
      ),
    );
    assert.match(err, /--advertise http:\/\/ADDRESS:\d+/);
    assert.match(err, /NAT, Docker, a VPN, a Thunderbolt bridge/);
  } finally {
    if (node) await stopNode(node.child);
    await gw.close();
    await up.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("without --port the node takes 8100, or the next free port when it is taken, and says so", async () => {
  const gw = await startGateway();
  const up = startFakeUpstream();
  const dir = await Deno.makeTempDir({ prefix: "orchard-node-defport-" });
  // Hold 8100 (or find it held already by another program).
  let held: Deno.Listener | null = null;
  try {
    held = Deno.listen({ hostname: "0.0.0.0", port: 8100 });
  } catch (err) {
    if (!(err instanceof Deno.errors.AddrInUse)) throw err;
  }
  let node: Awaited<ReturnType<typeof spawnNode>> | null = null;
  try {
    node = await spawnNode([
      "--gateway",
      gw.url,
      "--join",
      await joinToken(gw),
      "--heartbeat-ms",
      "100",
    ], {
      ORCHARD_NODE_ENGINE: "openai",
      ORCHARD_UPSTREAM_URL: up.url,
      ORCHARD_NODE_STATE_DIR: dir,
      ORCHARD_NODE_HOST: "0.0.0.0",
    });
    const m = /^Orchard node \S+ serving at http:\/\/\S+:(\d+)$/.exec(
      node.line,
    );
    assert.ok(m, node.line);
    const port = Number(m[1]);
    assert.notEqual(port, 8100);
    let said = node.rest;
    const reader = node.stdout.getReader();
    while (!said.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) break;
      said += value;
    }
    reader.releaseLock();
    assert.match(
      said,
      new RegExp(
        `Ports? 8100(, \\d+)* (is|are) in use by another program; this node listens on port ${port}`,
      ),
    );
    // Its settings are saved without the join token, and without a port (it stays automatic).
    const saved = JSON.parse(await Deno.readTextFile(`${dir}/options.json`));
    assert.equal(saved.flags.gateway, gw.url);
    assert.equal(saved.flags.engine, "openai");
    assert.equal("join" in saved.flags, false);
    assert.equal("port" in saved.flags, false);
  } finally {
    if (node) await stopNode(node.child);
    held?.close();
    await gw.close();
    await up.close();
    await Deno.remove(dir, { recursive: true });
  }
});
