import assert from "node:assert/strict";
import { join } from "node:path";
import { secureDataDir } from "./data_dir.ts";

const modeOf = async (p: string) => ((await Deno.stat(p)).mode ?? 0) & 0o777;

Deno.test("secureDataDir() creates the directory 0700 and tightens what an older start left readable", async () => {
  const root = await Deno.makeTempDir();
  try {
    const fresh = join(root, "fresh");
    assert.deepEqual(await secureDataDir(fresh), []);
    assert.equal(await modeOf(fresh), 0o700);

    const old = join(root, "old");
    await Deno.mkdir(join(old, "usage-journal"), { recursive: true });
    await Deno.chmod(old, 0o755);
    await Deno.chmod(join(old, "usage-journal"), 0o755);
    await Deno.writeTextFile(join(old, "orchard.kv"), "x", { mode: 0o644 });
    await Deno.chmod(join(old, "orchard.kv"), 0o644);
    await Deno.writeTextFile(join(old, "usage-journal", "1.log"), "y");
    await Deno.chmod(join(old, "usage-journal", "1.log"), 0o640);
    await Deno.writeTextFile(join(old, "instance_id"), "z");
    await Deno.chmod(join(old, "instance_id"), 0o600);
    const changed = await secureDataDir(old);
    assert.deepEqual(
      changed.map((c) => [c.path.slice(old.length), c.was]).sort(),
      [
        ["", 0o755],
        ["/orchard.kv", 0o644],
        ["/usage-journal", 0o755],
        ["/usage-journal/1.log", 0o640],
      ].sort(),
    );
    assert.equal(await modeOf(old), 0o700);
    assert.equal(await modeOf(join(old, "orchard.kv")), 0o600);
    assert.equal(await modeOf(join(old, "usage-journal")), 0o700);
    assert.equal(await modeOf(join(old, "usage-journal", "1.log")), 0o600);
    assert.equal(await modeOf(join(old, "instance_id")), 0o600);
    // a second start finds nothing to change
    assert.deepEqual(await secureDataDir(old), []);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
