/**
 * llama.cpp built from the pinned bundle with ggml's RPC backend
 * (node/native/llama_build.ts), loaded through the same FFI as the engine:
 * the engine reports the build it loaded, and the `small` fixture with every
 * layer on a `ggml-rpc-server` over loopback generates, greedily, exactly the
 * tokens a local run does.
 *
 * The tests that need the build build it first (`ensureLlamaBuilt`: nothing
 * to do after `deno task test`'s setup or `deno task build:native`, a copy
 * from the machine's cache, else minutes); a failed build fails them. They
 * are ignored, saying why, only where the build cannot run at all (no CMake
 * or compiler: CI installs both, .ci/apt-packages.txt) or
 * `ORCHARD_LLAMA_LIB_DIR` chooses the libraries.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { writeFixtureModel } from "../tools/fixture_model.ts";
import { log } from "../lib/log.ts";
import {
  CP,
  findLibraries,
  libraryDirCandidates,
  LLAMA_PACKAGE_VERSION,
  MP,
  openLlama,
} from "../node/llama/ffi.ts";
import { LoadedLlama } from "../node/llama/model.ts";
import { openRpc, rpcServerPath } from "../node/llama/rpc.ts";
import { createLlamaEngine } from "../node/llama/engine.ts";
import {
  ensureLlamaBuilt,
  LLAMA_LIB_DIR,
  llamaInputs,
  type LlamaManifest,
  MANIFEST_NAME,
} from "../node/native/llama_build.ts";
import { hardwareOf } from "../routes/_fleet.ts";

Deno.env.set("ORCHARD_LOG_LEVEL", "silent");
log.reload();

const cannot = Deno.env.get("ORCHARD_LLAMA_LIB_DIR")
  ? "ORCHARD_LLAMA_LIB_DIR chooses the library folder"
  : (await llamaInputs()).missing;
const ignore = !!cannot;
if (cannot) {
  // deno-lint-ignore no-console -- says why the tests below are ignored
  console.error(`llama_rpc_test: build tests ignored: ${cannot}`);
}
let building: Promise<LlamaManifest> | undefined;
/** The build's manifest, once `build/llama/lib` holds the current build. */
const built = () =>
  building ??= ensureLlamaBuilt({ log: () => {} }).then((r) => r.manifest);

const ROOT = join(import.meta.dirname!, "..");
/** The npm package's prebuilt library folder (the fallback). */
const PREBUILT = libraryDirCandidates(ROOT).find((d) =>
  d.includes("node_modules") && (() => {
    try {
      return Deno.statSync(d).isDirectory;
    } catch {
      return false;
    }
  })()
);

Deno.test("llama libraries: the build is preferred only when complete, else the prebuilt package", async () => {
  const root = await Deno.makeTempDir({ prefix: "orchard-root-" });
  const env = Deno.env.get("ORCHARD_LLAMA_LIB_DIR");
  Deno.env.delete("ORCHARD_LLAMA_LIB_DIR");
  try {
    await Deno.symlink(join(ROOT, "node_modules"), join(root, "node_modules"));
    // no build: the package's libraries
    const none = findLibraries(root);
    assert.equal(none.build, "prebuilt");
    assert.equal(none.dir, PREBUILT?.replace(ROOT, root));
    // a build without its manifest (interrupted; the manifest is written
    // last) is not used
    const lib = join(root, "build", "llama", "lib");
    await Deno.mkdir(lib, { recursive: true });
    for (const f of ["libllama.so", "libggml.so"]) {
      await Deno.writeTextFile(join(lib, f), "");
    }
    assert.equal(findLibraries(root).build, "prebuilt");
    // one built from another package version's source is stale
    const manifest = (packageVersion: string) =>
      Deno.writeTextFile(
        join(lib, MANIFEST_NAME),
        JSON.stringify({ schema: "orchard.llama-build/1", packageVersion }),
      );
    await manifest("3.20.0");
    assert.equal(findLibraries(root).build, "prebuilt");
    // this version's: the build
    await manifest(LLAMA_PACKAGE_VERSION);
    const built = findLibraries(root);
    assert.equal(built.build, "built");
    assert.equal(built.dir, lib);
    assert.equal(built.llama, join(lib, "libllama.so"));
  } finally {
    if (env !== undefined) Deno.env.set("ORCHARD_LLAMA_LIB_DIR", env);
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test({
  name:
    "llama engine: on the prebuilt package libraries it reports prebuilt, without RPC",
  ignore: !PREBUILT,
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "orchard-prebuilt-" });
    const env = Deno.env.get("ORCHARD_LLAMA_LIB_DIR");
    // the engine's library check runs in a child process, which inherits this
    Deno.env.set("ORCHARD_LLAMA_LIB_DIR", PREBUILT!);
    const engine = createLlamaEngine({ modelsDir: dir, idleUnloadMs: 0 });
    try {
      await engine.start();
      const facts = engine.facts() as { llama: Record<string, unknown> };
      assert.equal(facts.llama.build, "prebuilt");
      assert.equal(facts.llama.rpc, false);
      assert.equal(facts.llama.rdma, false);
      assert.equal(facts.llama.tag, null);
      assert.match(String(facts.llama.version), /^0\.4\.0/);
      const hw = hardwareOf({ os: "linux", ...facts });
      assert.deepEqual(hw.llama, {
        build: "prebuilt",
        version: facts.llama.version,
        tag: null,
        rpc: false,
        rdma: false,
      });
      // an older node or another engine reports nothing: nothing is shown
      assert.equal(hardwareOf({ os: "linux" }).llama, null);
    } finally {
      if (env === undefined) Deno.env.delete("ORCHARD_LLAMA_LIB_DIR");
      else Deno.env.set("ORCHARD_LLAMA_LIB_DIR", env);
      await engine.close();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

/** A free loopback TCP port. */
function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** Waits until something accepts connections on the port. */
async function listening(port: number, child: Deno.ChildProcess) {
  const until = Date.now() + 20_000;
  let exited = false;
  child.status.then(() => exited = true);
  while (Date.now() < until && !exited) {
    try {
      (await Deno.connect({ hostname: "127.0.0.1", port })).close();
      return;
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  throw new Error(`ggml-rpc-server did not listen on ${port}`);
}

/** A process's resident memory (Linux: /proc; macOS: `ps`). */
async function rssBytes(pid: number): Promise<number> {
  if (Deno.build.os === "linux") {
    const status = await Deno.readTextFile(`/proc/${pid}/status`);
    const kb = Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1]);
    assert.ok(kb > 0, `no VmRSS for ${pid}`);
    return kb * 1024;
  }
  const out = await new Deno.Command("ps", {
    args: ["-o", "rss=", "-p", String(pid)],
    stdout: "piped",
  }).output();
  const kb = Number(new TextDecoder().decode(out.stdout).trim());
  assert.ok(Number.isFinite(kb) && kb > 0, `ps gave no RSS for ${pid}`);
  return kb * 1024;
}

/** Greedy-decodes `n` tokens after the prompt. */
function greedy(m: LoadedLlama, prompt: string, n: number): number[] {
  const tokens = m.tokenize(prompt, true);
  const sampler = m.sampler({
    maxTokens: n,
    temperature: 0,
    topP: 1,
    topK: 0,
    minP: 0,
    repeatPenalty: 1,
    presencePenalty: 0,
    frequencyPenalty: 0,
    seed: 1,
    stop: [],
    grammar: null,
    logprobs: null,
  });
  const out: number[] = [];
  try {
    m.batch.clear();
    tokens.forEach((t, i) => m.batch.add(t, i, 0, i === tokens.length - 1));
    let pos = tokens.length;
    for (let i = 0; i < n; i++) {
      assert.equal(m.decode(), 0, "llama_decode failed");
      const t = m.sample(sampler, m.batch.n - 1);
      out.push(t);
      if (m.isEog(t)) break;
      m.batch.clear();
      m.batch.add(t, pos++, 0, true);
    }
  } finally {
    m.llama.symbols.llama_sampler_free(sampler);
  }
  return out;
}

Deno.test({
  name: "llama engine: loads the built llama.cpp and reports it (RPC on)",
  ignore,
  sanitizeResources: false,
  async fn() {
    const manifest = await built();
    const llama = openLlama();
    try {
      assert.equal(llama.build, "built");
      assert.equal(llama.libDir, LLAMA_LIB_DIR);
      assert.ok(llama.version.startsWith("0.4.0"), llama.version);
    } finally {
      llama.close();
    }
    const dir = await Deno.makeTempDir({ prefix: "orchard-rpc-models-" });
    const engine = createLlamaEngine({ modelsDir: dir, idleUnloadMs: 0 });
    try {
      await engine.start();
      const facts = engine.facts();
      assert.deepEqual(facts, {
        llama: {
          build: "built",
          version: (facts.llama as { version: string }).version,
          tag: manifest.tag,
          commit: manifest.commit,
          rpc: true,
          rdma: manifest.rdma.enabled,
        },
      });
      // what the portal's node page reads from the node's probe
      const hw = hardwareOf({ os: "linux", ...facts });
      assert.equal(hw.llama?.build, "built");
      assert.equal(hw.llama?.rpc, true);
      assert.equal(hw.llama?.tag, "v0.4.0");
    } finally {
      await engine.close();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name:
    "llama RPC: the small fixture with every layer on a loopback ggml-rpc-server generates the local run's tokens",
  ignore,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    await built();
    const dir = await Deno.makeTempDir({ prefix: "orchard-rpc-" });
    const path = join(dir, "small.gguf");
    await writeFixtureModel(path, { size: "small", seed: 7 });
    const server = rpcServerPath(LLAMA_LIB_DIR);
    assert.ok(server, "the build has ggml-rpc-server");
    const port = freePort();
    const child = new Deno.Command(server, {
      args: ["-H", "127.0.0.1", "-p", String(port), "-t", "1"],
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const stderr = child.stderr.pipeThrough(new TextDecoderStream())
      .getReader();
    let serverLog = "";
    const drain = (async () => {
      for (;;) {
        const { value, done } = await stderr.read();
        if (done) return;
        serverLog += value;
      }
    })();
    const llama = openLlama();
    const rpc = openRpc(llama);
    const opts = { path, ctxPerSeq: 256, slots: 1, threads: 1, batch: 64 };
    const prompt =
      "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n";
    try {
      await listening(port, child);
      const local = await LoadedLlama.load(llama, opts);
      const want = greedy(local, prompt, 24);
      local.close();
      assert.ok(want.length >= 8, `local run generated ${want.length} tokens`);

      const devices = await rpc.devices(`127.0.0.1:${port}`);
      assert.equal(devices.length, 1);
      assert.equal(devices[0]!.endpoint, `127.0.0.1:${port}`);
      assert.match(devices[0]!.name, /^RPC\d+$/);
      const memory = devices[0]!.memory();
      assert.ok(
        memory.totalBytes > 0 && memory.freeBytes <= memory.totalBytes,
        `the server reports its memory: ${JSON.stringify(memory)}`,
      );
      const rssBefore = await rssBytes(child.pid);

      const remote = await LoadedLlama.load(llama, {
        ...opts,
        devices: devices.map((d) => d.ptr),
      });
      try {
        // the weights (~100 M parameters in f16: ~200 MB) now live in the
        // server process
        const grew = await rssBytes(child.pid) - rssBefore;
        assert.ok(grew > 100e6, `the server's memory grew by ${grew} bytes`);
        const got = greedy(remote, prompt, 24);
        assert.deepEqual(got, want, `server log: ${serverLog.slice(-2000)}`);
      } finally {
        remote.close();
      }
    } finally {
      rpc.close();
      llama.close();
      child.kill("SIGTERM");
      await child.status;
      await drain.catch(() => {});
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name:
    "llama FFI: struct offsets and sizes match include/llama.h of the pinned bundle",
  ignore,
  async fn() {
    await built();
    const INCLUDE = join(LLAMA_LIB_DIR, "include");
    const dir = await Deno.makeTempDir({ prefix: "orchard-abi-" });
    try {
      const fields = (struct: string, offsets: Record<string, number>) =>
        Object.keys(offsets).filter((k) => k !== "size").map((k) =>
          `printf("\\"${struct}.${k}\\":%zu,", offsetof(struct ${struct}, ${k}));`
        ).join("\n");
      const c = `#include <stdio.h>
#include <stddef.h>
#include "llama.h"
int main(void) {
  printf("{");
  ${fields("llama_model_params", MP)}
  ${fields("llama_context_params", CP)}
  printf("\\"llama_model_params.size\\":%zu,", sizeof(struct llama_model_params));
  printf("\\"llama_context_params.size\\":%zu,", sizeof(struct llama_context_params));
  printf("\\"llama_batch.size\\":%zu}", sizeof(struct llama_batch));
  return 0;
}
`;
      await Deno.writeTextFile(join(dir, "abi.c"), c);
      const cc = await new Deno.Command(Deno.env.get("CC") ?? "cc", {
        args: [
          "-I",
          INCLUDE,
          "-o",
          join(dir, "abi"),
          join(dir, "abi.c"),
        ],
        stderr: "piped",
      }).output();
      assert.ok(cc.success, new TextDecoder().decode(cc.stderr));
      const out = await new Deno.Command(join(dir, "abi"), { stdout: "piped" })
        .output();
      const got = JSON.parse(new TextDecoder().decode(out.stdout));
      const want: Record<string, number> = { "llama_batch.size": 56 };
      for (const [k, v] of Object.entries(MP)) {
        want[`llama_model_params.${k}`] = v;
      }
      for (const [k, v] of Object.entries(CP)) {
        want[`llama_context_params.${k}`] = v;
      }
      assert.deepEqual(got, want);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
