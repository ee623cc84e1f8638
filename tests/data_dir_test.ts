/**
 * Secrets at rest: a fresh `main.ts` makes its data directory 0700 and
 * every file in it 0600 (the KV with its `-wal`/`-shm`, the instance id,
 * the usage journal, the local node's identity), and a data directory an
 * older start left readable is tightened at the next start, with a
 * warning naming what changed.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startGatewayProcess } from "./fixtures/cluster.ts";

/** Every path under `dir` (itself included) with its permission bits. */
async function modes(dir: string): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  const walk = async (p: string) => {
    const info = await Deno.lstat(p);
    out.set(p.slice(dir.length) || "/", (info.mode ?? 0) & 0o777);
    if (info.isDirectory) {
      for await (const e of Deno.readDir(p)) await walk(join(p, e.name));
    }
  };
  await walk(dir);
  return out;
}

function assertPrivate(m: Map<string, number>) {
  for (const [p, mode] of m) {
    assert.equal(mode & 0o077, 0, `${p} is ${mode.toString(8)}`);
  }
}

Deno.test({
  name:
    "the data directory is 0700 and its files 0600 on a fresh start, and tightened with a warning on a later one",
  ignore: Deno.build.os === "windows",
}, async () => {
  const root = await Deno.makeTempDir({ prefix: "orchard-datadir-" });
  const dataDir = join(root, "data");
  const adminToken = `orchard-test-${crypto.randomUUID()}`;
  try {
    const gw = await startGatewayProcess({ dataDir, adminToken });
    // a write, so the KV's WAL exists too
    await gw.admin("POST", "/tenants", {
      name: "Acme",
      slug: "acme",
    });
    await gw.stop();
    const fresh = await modes(dataDir);
    assert.ok(fresh.has("/orchard.kv"), [...fresh.keys()].join(", "));
    assert.equal(fresh.get("/"), 0o700);
    assert.equal(fresh.get("/orchard.kv"), 0o600);
    assertPrivate(fresh);

    // an older start's modes: readable by everyone
    await Deno.chmod(dataDir, 0o755);
    await Deno.chmod(join(dataDir, "orchard.kv"), 0o644);
    const again = await startGatewayProcess({
      dataDir,
      adminToken,
      env: { ORCHARD_LOG_LEVEL: "warn" },
    });
    await again.stop();
    assertPrivate(await modes(dataDir));
    assert.match(again.stderr(), /permissions tightened/);
    assert.match(again.stderr(), /orchard\.kv/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
