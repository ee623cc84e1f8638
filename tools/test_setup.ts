// deno-lint-ignore-file no-console -- command-line entry point.
/**
 * `deno task test` runs this first: it makes a fresh Debian machine with only
 * Deno on it ready for the test suite.
 *
 * 1. The Debian packages the tests need are the ones `.ci/apt-packages.txt`
 *    lists (the one list; CI and this script read it). Each is present when
 *    dpkg says so, or when what the tests use from it is found (so a machine
 *    without dpkg, or with `CHROMIUM_PATH` set, passes too). Missing ones are
 *    installed with apt-get when this runs as root; otherwise it prints the
 *    exact command and goes on (the tests that need them then skip or fail,
 *    each saying what is missing).
 * 2. liborchard and its C test binaries are built, or rebuilt when their
 *    inputs (sources, headers, the system headers they include) changed.
 * 3. llama.cpp is built from the pinned node-llama-cpp package's own source
 *    with ggml's RPC backend (node/native/llama_build.ts), or copied from the
 *    machine's cache (`~/.cache/orchard/llama-<input hash>/`) when any
 *    checkout built the same inputs before: about 5 minutes on 2 cores the
 *    first time, a second after. The whole suite then runs on it (the engine
 *    prefers it to the prebuilt libraries); the RPC tests need it. Without
 *    CMake or a C++ compiler it says so and goes on on the prebuilt
 *    libraries (the RPC tests are then ignored). `ORCHARD_LLAMA_BUILD=0`
 *    skips this step.
 * 4. The pinned coding agents (`tools/agents/package.json`: Claude Code and
 *    Codex CLI from npm) are installed with `npm ci` into
 *    `tools/agents/node_modules`, unless the installed versions are already
 *    the pinned ones. Without npm it says so and goes on (the agent tests
 *    then fail saying what is missing).
 *
 * `ORCHARD_TEST_SETUP=0` skips these steps. Exits 0 unless the list is
 * unreadable: the tests themselves report what is missing.
 *
 * @module
 */
import { ensureNativeBuilt } from "../node/native/build.ts";
import {
  ensureLlamaBuilt,
  LLAMA_LIB_DIR,
  llamaInputs,
  readLlamaManifest,
} from "../node/native/llama_build.ts";

const LIST = new URL("../.ci/apt-packages.txt", import.meta.url);

/** Reads the package list: one name a line, `#` comments and blank lines ignored. */
export async function aptPackages(): Promise<string[]> {
  return (await Deno.readTextFile(LIST)).split("\n")
    .map((l) => l.replace(/#.*/, "").trim())
    .filter((l) => l !== "");
}

function isFile(path: string | undefined): boolean {
  if (!path) return false;
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

async function runs(cmd: string, args: string[]): Promise<boolean> {
  try {
    const { success } = await new Deno.Command(cmd, {
      args,
      stdout: "null",
      stderr: "null",
    }).output();
    return success;
  } catch {
    return false; // not installed
  }
}

/** What the tests use from a package, for machines where dpkg cannot tell. */
const PROBES: Record<string, () => boolean | Promise<boolean>> = {
  chromium: () =>
    [
      Deno.env.get("CHROMIUM_PATH"),
      "/usr/bin/chromium",
      "/usr/bin/chromium-browser",
    ]
      .some(isFile),
  "fonts-dejavu-core": () =>
    isFile("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),
  "libibverbs-dev": () => isFile("/usr/include/infiniband/verbs.h"),
  prometheus: () => runs("promtool", ["--version"]),
  gcc: () => runs(Deno.env.get("CC") ?? "cc", ["--version"]),
  "libc6-dev": () => isFile("/usr/include/stdio.h"),
  cmake: () => runs("cmake", ["--version"]),
  "g++": () => runs(Deno.env.get("CXX") ?? "c++", ["--version"]),
  ccache: () => runs("ccache", ["--version"]),
  git: () => runs("git", ["--version"]),
};

async function dpkgInstalled(pkg: string): Promise<boolean> {
  try {
    const { success, stdout } = await new Deno.Command("dpkg-query", {
      args: ["-W", "-f=${Status}", pkg],
      stdout: "piped",
      stderr: "null",
    }).output();
    return success &&
      new TextDecoder().decode(stdout).endsWith("install ok installed");
  } catch {
    return false; // no dpkg: not Debian
  }
}

/** The packages of the list that are neither installed nor found otherwise. */
export async function missingPackages(pkgs: string[]): Promise<string[]> {
  const missing: string[] = [];
  for (const pkg of pkgs) {
    if (await dpkgInstalled(pkg)) continue;
    if (await PROBES[pkg]?.()) continue;
    missing.push(pkg);
  }
  return missing;
}

async function aptGet(args: string[]): Promise<boolean> {
  const { success } = await new Deno.Command("apt-get", {
    args,
    env: { DEBIAN_FRONTEND: "noninteractive" },
    stdout: "inherit",
    stderr: "inherit",
  }).output();
  return success;
}

async function installPackages(): Promise<void> {
  const missing = await missingPackages(await aptPackages());
  if (missing.length === 0) return;
  const install = [
    "apt-get",
    "install",
    "-y",
    "--no-install-recommends",
    ...missing,
  ];
  const hasApt = await runs("apt-get", ["--version"]);
  if (hasApt && Deno.uid() === 0) {
    console.error(
      `test setup: installing ${missing.join(", ")} (.ci/apt-packages.txt)`,
    );
    if (
      await aptGet(["update", "-qq"]) &&
      await aptGet([...install.slice(1), "-qq"])
    ) return;
    console.error(
      "test setup: apt-get failed; the tests that need these packages will fail or skip.",
    );
    return;
  }
  console.error(
    `test setup: missing Debian packages the tests need: ${
      missing.join(", ")
    }.\n` +
      `  Install them with:  sudo apt-get update && sudo ${
        install.join(" ")
      }\n` +
      "  (or run `deno task test` as root, which installs them). Going on: " +
      "the tests that need them will skip or fail, saying what is missing.",
  );
}

async function buildNative(): Promise<void> {
  try {
    await ensureNativeBuilt({ tests: true });
  } catch (err) {
    const msg = err instanceof Deno.errors.NotFound
      ? "no C compiler found (Debian: apt-get install gcc libc6-dev; or set CC)"
      : (err as Error).message;
    console.error(
      `test setup: cannot build liborchard: ${msg}\n  Going on: the native tests will fail with this error.`,
    );
  }
}

async function buildLlama(): Promise<void> {
  if (Deno.env.get("ORCHARD_LLAMA_BUILD") === "0") return;
  try {
    const inputs = await llamaInputs();
    if (inputs.missing) throw new Error(inputs.missing);
    if (readLlamaManifest(LLAMA_LIB_DIR)?.key !== inputs.key) {
      console.error(
        "test setup: llama.cpp with RPC: building from the pinned bundle, or taking it from ~/.cache/orchard (about 5 minutes on 2 cores when it builds)",
      );
    }
    const started = performance.now();
    const res = await ensureLlamaBuilt({ log: () => {} });
    if (res.source !== "current") {
      console.error(
        `test setup: llama.cpp ${res.manifest.tag} with RPC ready (${res.source}, ${
          ((performance.now() - started) / 1000).toFixed(0)
        } s): ${res.manifest.rdma.detail}`,
      );
    }
  } catch (err) {
    console.error(
      `test setup: cannot build llama.cpp with RPC: ${
        (err as Error).message
      }\n  Going on: the engine uses the prebuilt libraries and the RPC tests are ignored.`,
    );
  }
}

const AGENTS = new URL("./agents/", import.meta.url).pathname;

/** Whether every pinned agent is installed at its pinned version. */
async function agentsCurrent(): Promise<boolean> {
  const pins = JSON.parse(
    await Deno.readTextFile(`${AGENTS}package.json`),
  ).dependencies as Record<string, string>;
  for (const [name, version] of Object.entries(pins)) {
    try {
      const got = JSON.parse(
        await Deno.readTextFile(
          `${AGENTS}node_modules/${name}/package.json`,
        ),
      ).version;
      if (got !== version) return false;
    } catch {
      return false;
    }
  }
  return true;
}

async function installAgents(): Promise<void> {
  if (await agentsCurrent()) return;
  console.error("test setup: installing the pinned coding agents (npm ci)");
  try {
    const out = await new Deno.Command("npm", {
      args: ["ci", "--no-audit", "--no-fund", "--prefix", AGENTS],
      stdout: "null",
      stderr: "piped",
    }).output();
    if (!out.success) {
      console.error(
        `test setup: cannot install the coding agents: npm ci failed:\n${
          new TextDecoder().decode(out.stderr).slice(-2000)
        }\n  Going on: the agent tests will fail with this error.`,
      );
    }
  } catch (err) {
    console.error(
      `test setup: cannot install the coding agents: ${
        (err as Error).message
      } (is npm installed?)\n  Going on: the agent tests will fail.`,
    );
  }
}

if (import.meta.main && Deno.env.get("ORCHARD_TEST_SETUP") !== "0") {
  await installPackages();
  await buildNative();
  await buildLlama();
  await installAgents();
}
