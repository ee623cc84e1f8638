import assert from "node:assert/strict";
import type { LinkTester } from "../node/server.ts";
import { startNodeWorker } from "../node/worker.ts";
import { joinToken, startFakeUpstream, startGateway, until } from "./_fleet.ts";

/**
 * A TCP ping-pong link tester written for this test (the native one needs
 * liborchard built): A listens once, B connects, sends 8 pings, and reports
 * an `orchard.linktest/1`-shaped result.
 */
function tcpLinkTester(): LinkTester {
  return {
    listen() {
      const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      (async () => {
        const conn = await l.accept();
        l.close();
        const buf = new Uint8Array(1);
        for (let i = 0; i < 8; i++) {
          if (await conn.read(buf) === null) break;
          await conn.write(buf);
        }
        conn.close();
      })();
      return Promise.resolve({ port: l.addr.port });
    },
    async connect(body) {
      const conn = await Deno.connect({
        hostname: String(body.host),
        port: Number(body.port),
      });
      const buf = new Uint8Array(1);
      const t0 = performance.now();
      for (let i = 0; i < 8; i++) {
        await conn.write(buf);
        await conn.read(buf);
      }
      conn.close();
      return {
        schema: "orchard.linktest/1",
        transport: "tcp",
        latencyUs: ((performance.now() - t0) / 8) * 1000,
      };
    },
  };
}

Deno.test("link tests run between two nodes, one pair or all pairs in the background", async () => {
  const gw = await startGateway();
  const up = startFakeUpstream();
  const dirs = [await Deno.makeTempDir(), await Deno.makeTempDir()];
  const nodes = [];
  try {
    const token = await joinToken(gw, { uses: 2 });
    for (const dir of dirs) {
      nodes.push(
        await startNodeWorker({
          gatewayUrl: gw.url,
          joinToken: token,
          engine: "openai",
          upstreamUrl: up.url,
          port: 0,
          host: "127.0.0.1",
          stateDir: dir,
          heartbeatMs: 100,
          linktest: tcpLinkTester(),
        }),
      );
    }
    const [a, b] = nodes.map((n) => n.nodeId) as [string, string];
    const same = await gw.admin("POST", "/links/test", { a, b: a });
    assert.equal(same.status, 400);

    const one = await gw.admin("POST", "/links/test", { a, b });
    assert.equal(one.status, 200);
    const rec = await one.json();
    assert.equal(rec.ok, true, rec.error);
    assert.equal(rec.result.schema, "orchard.linktest/1");
    assert.ok(rec.result.latencyUs > 0);
    assert.ok(Date.parse(rec.at) > 0);

    await until("both healthy", async () => {
      const list = await (await gw.admin("GET", "/nodes")).json();
      return list.items.every((n: { state: string }) => n.state === "healthy");
    });
    const started = await gw.admin("POST", "/links/test-all");
    assert.equal(started.status, 202);
    assert.equal((await started.json()).total, 1);
    const progress = await until("run finished", async () => {
      const p = await (await gw.admin("GET", "/links/progress")).json();
      return p.running ? null : p;
    });
    assert.deepEqual([progress.done, progress.failed], [1, 0]);
    const links = await (await gw.admin("GET", "/links")).json();
    assert.equal(links.items.length, 1);
    assert.equal(links.items[0].a, a);
    assert.equal(links.items[0].ok, true);
  } finally {
    for (const n of nodes) await n.close();
    await gw.close();
    await up.close();
    for (const d of dirs) await Deno.remove(d, { recursive: true });
  }
});
