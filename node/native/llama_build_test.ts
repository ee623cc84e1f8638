/**
 * llama_build.ts: the input key, what it says is missing, and that a current
 * build is not redone. The build itself and what it produces are exercised
 * by tests/llama_rpc_test.ts.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  ensureLlamaBuilt,
  LLAMA_LIB_DIR,
  llamaInputs,
  readLlamaManifest,
} from "./llama_build.ts";

/** Runs `fn` with environment variables set (undefined: unset), then restores them. */
async function withEnv<T>(
  vars: Record<string, string | undefined>,
  fn: () => Promise<T>,
): Promise<T> {
  const before = Object.fromEntries(
    Object.keys(vars).map((k) => [k, Deno.env.get(k)]),
  );
  const set = (v: Record<string, string | undefined>) => {
    for (const [k, val] of Object.entries(v)) {
      if (val === undefined) Deno.env.delete(k);
      else Deno.env.set(k, val);
    }
  };
  set(vars);
  try {
    return await fn();
  } finally {
    set(before);
  }
}

const inputs = await llamaInputs();
const LIBLLAMA = join(
  LLAMA_LIB_DIR,
  Deno.build.os === "darwin" ? "libllama.dylib" : "libllama.so",
);

Deno.test({
  name:
    "llamaInputs() gives the same key for the same inputs and another for another C++ compiler",
  ignore: !!inputs.missing,
  async fn() {
    assert.match(inputs.key, /^[0-9a-f]{64}$/);
    assert.equal(inputs.tag, "v0.4.0");
    assert.equal(inputs.packageVersion, "3.21.1");
    assert.equal((await llamaInputs()).key, inputs.key);
    const dir = await Deno.makeTempDir({ prefix: "orchard-cxx-" });
    try {
      const cxx = join(dir, "c++");
      await Deno.writeTextFile(cxx, "#!/bin/sh\necho 'other c++ 99.1'\n");
      await Deno.chmod(cxx, 0o755);
      const other = await withEnv({ CXX: cxx }, llamaInputs);
      assert.equal(other.missing, null);
      assert.notEqual(other.key, inputs.key);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("llamaInputs() says CMake is missing when it is not on PATH", async () => {
  const dir = await Deno.makeTempDir({ prefix: "orchard-path-" });
  try {
    const got = await withEnv({ PATH: dir }, llamaInputs);
    assert.equal(got.missing, "CMake is not installed");
    await assert.rejects(
      withEnv({ PATH: dir }, () => ensureLlamaBuilt({ log: () => {} })),
      /^Error: Cannot build llama\.cpp: CMake is not installed$/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name:
    "ensureLlamaBuilt() does nothing when build/llama/lib already holds the build of these inputs",
  ignore: !!inputs.missing || !!Deno.env.get("ORCHARD_LLAMA_LIB_DIR"),
  async fn() {
    await ensureLlamaBuilt({ log: () => {} }); // builds or copies when needed
    const before = (await Deno.stat(LIBLLAMA)).mtime;
    const started = performance.now();
    const again = await ensureLlamaBuilt({ log: () => {} });
    assert.equal(again.source, "current");
    assert.ok(performance.now() - started < 5000);
    assert.equal(again.manifest.key, inputs.key);
    assert.equal(readLlamaManifest(LLAMA_LIB_DIR)?.key, inputs.key);
    const after = (await Deno.stat(LIBLLAMA)).mtime;
    assert.deepEqual(after, before, "the library was not copied again");
  },
});
