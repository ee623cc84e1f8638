import assert from "node:assert/strict";
import { joinToken, startFakeUpstream, startGateway, until } from "./_fleet.ts";

/** Starts `node/main.ts` as a real process; resolves with its first stdout line. */
async function spawnNode(args: string[], env: Record<string, string>) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "node/main.ts", ...args],
    env: { ...env, ORCHARD_LOG_LEVEL: "error" },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  while (!out.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) break;
    out += value;
  }
  reader.releaseLock();
  return { child, line: out.trim() };
}

async function stop(child: Deno.ChildProcess) {
  child.kill("SIGTERM");
  await child.status;
  await child.stdout.cancel().catch(() => {});
  await child.stderr.cancel().catch(() => {});
}

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
    await stop(first.child);

    const second = await spawnNode(["--gateway", gw.url, "--port", "0"], env);
    assert.match(second.line, new RegExp(`^Orchard node ${nodeId} serving at`));
    await stop(second.child);

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
