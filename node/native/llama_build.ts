/**
 * Builds llama.cpp from the source the pinned `node-llama-cpp` package ships
 * (`node_modules/node-llama-cpp/llama/gitRelease.bundle`, the release named in
 * `llama.cpp.info.json`), with ggml's RPC backend on: Metal on macOS, CPU
 * elsewhere, and ggml-rpc's RDMA transport wherever CMake finds libibverbs
 * (Linux) or librdma (macOS 26.2+, weak-linked). Only the shared libraries the
 * node loads (libllama, libggml, libggml-base, libggml-cpu, libggml-rpc, and
 * libggml-metal/blas on macOS) and the `ggml-rpc-server` program are built;
 * the release's headers (`include/llama.h`, ggml's) are kept beside them.
 *
 * The build is keyed by a SHA-256 of its inputs: the bundle's bytes, the
 * CMake arguments, the C and C++ compilers' and CMake's version lines, the
 * RDMA library CMake would find, and the CPU (the build uses `GGML_NATIVE`).
 * A finished build is kept in a cache folder outside the clone,
 * `${ORCHARD_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/orchard}/llama-<key>/`,
 * so every checkout on the machine (CI runs included) reuses it; it is copied
 * into `build/llama/lib/`, where the llama engine looks first
 * (node/llama/ffi.ts). Nothing is downloaded: the source is the npm package's
 * own bundle. ccache is used when installed.
 *
 * `deno run -A node/native/llama_build.ts [--force] [--jobs N]`
 *
 * @module
 */
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** Where the build lives in the checkout (gitignored). */
export const LLAMA_BUILD_DIR = join(ROOT, "build", "llama");
/** The folder the llama engine loads the built libraries from. */
export const LLAMA_LIB_DIR = join(LLAMA_BUILD_DIR, "lib");
/** The manifest written beside the built libraries, last, once they are complete. */
export const MANIFEST_NAME = "orchard-llama.json";
/** The package whose bundled source is built. */
export const PACKAGE_DIR = join(ROOT, "node_modules", "node-llama-cpp");

/**
 * Bumped whenever the recipe below changes in a way the other inputs do not
 * capture (which targets, how outputs are collected).
 */
const RECIPE = 2;

const isMac = Deno.build.os === "darwin";

/** CMake targets: the libraries come with `llama` (it links ggml and its backends). */
export const TARGETS = ["llama", "ggml-rpc-server"] as const;

/** The CMake cache arguments (options checked against the bundle's CMakeLists). */
export const CMAKE_ARGS: readonly string[] = [
  "-DCMAKE_BUILD_TYPE=Release",
  "-DBUILD_SHARED_LIBS=ON",
  // the libraries find each other beside themselves ($ORIGIN, @loader_path),
  // so they still load once copied out of the build tree
  "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
  "-DGGML_RPC=ON",
  "-DGGML_NATIVE=ON",
  "-DGGML_CCACHE=ON",
  // ggml's own thread pool, as node-llama-cpp builds its prebuilt libraries,
  // so the engine behaves alike on either (measured here: equal tokens/s on
  // the small fixture, 1 and 2 threads)
  "-DGGML_OPENMP=OFF",
  // backends linked into libggml: ggml-rpc's C API is then a plain export
  "-DGGML_BACKEND_DL=OFF",
  ...(isMac
    ? [
      "-DGGML_METAL=ON",
      "-DGGML_METAL_EMBED_LIBRARY=ON",
      // @rpath/libggml….dylib resolves beside the loading library, not in
      // the (removed) build tree
      "-DCMAKE_BUILD_RPATH=@loader_path",
    ]
    : []),
  "-DLLAMA_BUILD_TESTS=OFF",
  "-DLLAMA_BUILD_EXAMPLES=OFF",
  "-DLLAMA_BUILD_SERVER=OFF",
  "-DLLAMA_BUILD_APP=OFF",
  // tools/ must be configured for its rpc/ folder (ggml-rpc-server); only
  // that target is built from it
  "-DLLAMA_BUILD_TOOLS=ON",
  "-DLLAMA_BUILD_COMMON=ON",
  "-DLLAMA_OPENSSL=OFF",
];

/** What a finished build says about itself (`orchard-llama.json`). */
export interface LlamaManifest {
  schema: "orchard.llama-build/1";
  /** The input key (SHA-256 hex). */
  key: string;
  /** The release tag from `llama.cpp.info.json`. */
  tag: string;
  /** The bundle's commit that was built. */
  commit: string;
  /** node-llama-cpp's version. */
  packageVersion: string;
  os: string;
  arch: string;
  /** ggml's RPC backend is in (always, for this build). */
  rpc: true;
  /** ggml-rpc's RDMA transport was compiled in, and over what. */
  rdma: { enabled: boolean; detail: string };
  metal: boolean;
  cmakeArgs: string[];
  /** The RPC server program's file name in the same folder. */
  rpcServer: string;
  /** Seconds the configure + build took on the machine that built it. */
  buildSeconds: number;
  jobs: number;
  builtAt: string;
}

/** Reads a lib folder's manifest; null when there is none (or it is not ours). */
export function readLlamaManifest(dir: string): LlamaManifest | null {
  try {
    const m = JSON.parse(
      Deno.readTextFileSync(join(dir, MANIFEST_NAME)),
    ) as LlamaManifest;
    return m?.schema === "orchard.llama-build/1" ? m : null;
  } catch {
    return null;
  }
}

/** The cache root shared by every checkout on this machine. */
export function cacheRoot(): string {
  const env = Deno.env.get("ORCHARD_CACHE_DIR");
  if (env) return env;
  const xdg = Deno.env.get("XDG_CACHE_HOME");
  const home = Deno.env.get("HOME") ?? "/tmp";
  return join(xdg || join(home, ".cache"), "orchard");
}

async function output(
  cmd: string,
  args: string[],
  cwd?: string,
): Promise<string | null> {
  try {
    const out = await new Deno.Command(cmd, {
      args,
      cwd,
      stdout: "piped",
      stderr: "null",
    }).output();
    return out.success ? new TextDecoder().decode(out.stdout) : null;
  } catch {
    return null; // not installed
  }
}

const firstLine = (s: string | null) => s?.split("\n")[0]?.trim() ?? "";

async function sha256Hex(data: Uint8Array<ArrayBuffer>): Promise<string> {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", data));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** The RDMA library ggml-rpc's CMakeLists would find (`find_library`), or "". */
async function rdmaLibrary(): Promise<string> {
  if (isMac) {
    const sdk = firstLine(await output("xcrun", ["--show-sdk-path"]));
    for (const f of [`${sdk}/usr/lib/librdma.tbd`, "/usr/lib/librdma.dylib"]) {
      if (sdk && await isFile(f)) return f;
    }
    return "";
  }
  const multiarch = firstLine(await output("cc", ["-print-multiarch"]));
  for (
    const d of [
      ...(multiarch ? [`/usr/lib/${multiarch}`, `/lib/${multiarch}`] : []),
      "/usr/lib64",
      "/usr/lib",
      "/usr/local/lib",
    ]
  ) {
    if (await isFile(`${d}/libibverbs.so`)) return `${d}/libibverbs.so`;
  }
  return "";
}

async function isFile(path: string): Promise<boolean> {
  try {
    return (await Deno.stat(path)).isFile;
  } catch {
    return false;
  }
}

/** What `-march=native` / `-mcpu=native` compiles for. */
async function cpuIdentity(): Promise<string> {
  if (isMac) {
    return firstLine(
      await output("sysctl", ["-n", "machdep.cpu.brand_string"]),
    );
  }
  try {
    const info = await Deno.readTextFile("/proc/cpuinfo");
    const pick = (k: string) =>
      info.split("\n").find((l) => l.startsWith(k))?.split(":")[1]?.trim() ??
        "";
    return `${pick("model name")}|${pick("flags")}${pick("Features")}`;
  } catch {
    return Deno.build.arch;
  }
}

/** The inputs of a build and their key. */
export interface LlamaInputs {
  key: string;
  bundle: string;
  tag: string;
  packageVersion: string;
  rdmaLib: string;
  /** Why the build cannot run here (no CMake, no C++ compiler, no bundle), else null. */
  missing: string | null;
}

/** Hashes everything the build depends on (reads the bundle: ~35 MB). */
export async function llamaInputs(): Promise<LlamaInputs> {
  const bundle = join(PACKAGE_DIR, "llama", "gitRelease.bundle");
  let tag = "", packageVersion = "";
  let bytes: Uint8Array<ArrayBuffer>;
  try {
    tag = JSON.parse(
      await Deno.readTextFile(
        join(PACKAGE_DIR, "llama", "llama.cpp.info.json"),
      ),
    ).tag;
    packageVersion = JSON.parse(
      await Deno.readTextFile(join(PACKAGE_DIR, "package.json")),
    ).version;
    bytes = await Deno.readFile(bundle);
  } catch (err) {
    return {
      key: "",
      bundle,
      tag,
      packageVersion,
      rdmaLib: "",
      missing: `no llama.cpp source bundle (${
        (err as Error).message
      }; run \`deno install\`)`,
    };
  }
  const cc = Deno.env.get("CC") ?? "cc";
  const cxx = Deno.env.get("CXX") ?? "c++";
  const [ccV, cxxV, cmakeV, git, rdmaLib, cpu] = await Promise.all([
    output(cc, ["--version"]),
    output(cxx, ["--version"]),
    output("cmake", ["--version"]),
    output("git", ["--version"]),
    rdmaLibrary(),
    cpuIdentity(),
  ]);
  const missing = !cmakeV
    ? "CMake is not installed"
    : !cxxV
    ? `no C++ compiler (${cxx})`
    : !ccV
    ? `no C compiler (${cc})`
    : !git
    ? "git is not installed"
    : null;
  const text = JSON.stringify({
    recipe: RECIPE,
    targets: TARGETS,
    args: CMAKE_ARGS,
    os: Deno.build.os,
    arch: Deno.build.arch,
    cc: `${cc} ${firstLine(ccV)}`,
    cxx: `${cxx} ${firstLine(cxxV)}`,
    cmake: firstLine(cmakeV),
    rdmaLib,
    cpu,
    bundle: await sha256Hex(bytes),
  });
  const key = await sha256Hex(new TextEncoder().encode(text));
  return { key, bundle, tag, packageVersion, rdmaLib, missing };
}

/** Options of ensureLlamaBuilt(). */
export interface LlamaBuildOptions {
  /** Rebuild even when a build with the same key exists. */
  force?: boolean;
  /** Parallel compile jobs (default: the CPU count). */
  jobs?: number;
  /** Where build progress goes (default: stderr). */
  log?: (line: string) => void;
}

/** The result of ensureLlamaBuilt(). */
export interface LlamaBuildResult {
  libDir: string;
  manifest: LlamaManifest;
  /** "fresh": this call built it; "cache": copied from the cache; "current": build/llama/lib was already it. */
  source: "fresh" | "cache" | "current";
}

async function run(
  cmd: string,
  args: string[],
  log: (line: string) => void,
  cwd?: string,
): Promise<string> {
  log(`$ ${cmd} ${args.join(" ")}`);
  const out = await new Deno.Command(cmd, {
    args,
    cwd,
    // ccache keys on paths relative to the build folder, so another
    // checkout's build of the same source hits the same entries
    env: { CCACHE_BASEDIR: LLAMA_BUILD_DIR },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) +
    new TextDecoder().decode(out.stderr);
  if (!out.success) {
    throw new Error(
      `Cannot build llama.cpp: ${cmd} ${
        args.join(" ")
      } exited with ${out.code}\n${text.slice(-4000)}`,
    );
  }
  return text;
}

/** Copies the named files, symlinks and folders of `from` into `to`, created fresh. */
async function copyTree(from: string, to: string, names: string[]) {
  await Deno.remove(to, { recursive: true }).catch(() => {});
  await Deno.mkdir(to, { recursive: true });
  for (const name of names) {
    const src = join(from, name);
    const st = await Deno.lstat(src);
    if (st.isSymlink) {
      await Deno.symlink(await Deno.readLink(src), join(to, name));
    } else if (st.isDirectory) {
      const inner: string[] = [];
      for await (const e of Deno.readDir(src)) inner.push(e.name);
      await copyTree(src, join(to, name), inner);
    } else await Deno.copyFile(src, join(to, name));
  }
}

/** The built files to keep: shared libraries (with their version links) and the RPC server. */
function keep(name: string): boolean {
  return /^lib(llama|ggml[a-z0-9-]*)(\.[0-9.]+)?\.(so(\.[0-9.]+)?|dylib)$/
    .test(name) || name === "ggml-rpc-server" || name === "default.metallib";
}

async function buildFresh(
  inputs: LlamaInputs,
  into: string,
  jobs: number,
  log: (line: string) => void,
): Promise<LlamaManifest> {
  const src = join(LLAMA_BUILD_DIR, "src");
  const work = join(LLAMA_BUILD_DIR, "cmake");
  const started = performance.now();
  await Deno.remove(src, { recursive: true }).catch(() => {});
  await Deno.mkdir(LLAMA_BUILD_DIR, { recursive: true });
  // The bundle holds one head (the release); clone it and check that out.
  await run("git", ["clone", "--quiet", inputs.bundle, src], log);
  const commit = (await run("git", ["rev-parse", "HEAD"], () => {}, src))
    .trim();
  const configure = await run(
    "cmake",
    ["-S", src, "-B", work, ...CMAKE_ARGS],
    log,
  );
  const rdmaLine =
    configure.split("\n").find((l) =>
      /RDMA transport (enabled|disabled)/.test(l)
    )?.replace(/^--\s*/, "").trim() ?? "RDMA transport not reported";
  await run(
    "cmake",
    ["--build", work, "--target", ...TARGETS, "-j", String(jobs)],
    log,
  );
  const bin = join(work, "bin");
  const names: string[] = [];
  for await (const e of Deno.readDir(bin)) if (keep(e.name)) names.push(e.name);
  if (!names.includes("ggml-rpc-server")) {
    throw new Error(`Cannot build llama.cpp: no ggml-rpc-server in ${bin}`);
  }
  await copyTree(bin, into, names);
  // the headers the libraries were built from, for checking the bindings
  // against them (tests/llama_rpc_test.ts)
  await Deno.mkdir(join(into, "include"));
  for (const dir of [join(src, "include"), join(src, "ggml", "include")]) {
    for await (const e of Deno.readDir(dir)) {
      if (e.isFile && e.name.endsWith(".h")) {
        await Deno.copyFile(join(dir, e.name), join(into, "include", e.name));
      }
    }
  }
  const manifest: LlamaManifest = {
    schema: "orchard.llama-build/1",
    key: inputs.key,
    tag: inputs.tag,
    commit,
    packageVersion: inputs.packageVersion,
    os: Deno.build.os,
    arch: Deno.build.arch,
    rpc: true,
    rdma: {
      enabled: /RDMA transport enabled/.test(rdmaLine),
      detail: rdmaLine,
    },
    metal: isMac,
    cmakeArgs: [...CMAKE_ARGS],
    rpcServer: "ggml-rpc-server",
    buildSeconds: Math.round((performance.now() - started) / 1000),
    jobs,
    builtAt: new Date().toISOString(),
  };
  await Deno.writeTextFile(
    join(into, MANIFEST_NAME),
    JSON.stringify(manifest, null, 2) + "\n",
  );
  return manifest;
}

/**
 * Makes `build/llama/lib/` hold llama.cpp built from the pinned bundle for
 * the current inputs: nothing to do when it already does, a copy from the
 * machine's cache when another checkout built it, else a build (minutes).
 * Throws, saying what is missing, when CMake, a compiler, git or the bundle
 * is not there; the engine then keeps using the prebuilt package libraries.
 */
export async function ensureLlamaBuilt(
  options: LlamaBuildOptions = {},
): Promise<LlamaBuildResult> {
  const log = options.log ??
    ((l: string) =>
      Deno.stderr.writeSync(new TextEncoder().encode(`llama.cpp: ${l}\n`)));
  const inputs = await llamaInputs();
  if (inputs.missing) {
    throw new Error(`Cannot build llama.cpp: ${inputs.missing}`);
  }
  const current = readLlamaManifest(LLAMA_LIB_DIR);
  if (!options.force && current?.key === inputs.key) {
    return { libDir: LLAMA_LIB_DIR, manifest: current, source: "current" };
  }
  const cached = join(cacheRoot(), `llama-${inputs.key.slice(0, 24)}`);
  let manifest = options.force ? null : readLlamaManifest(cached);
  let source: LlamaBuildResult["source"] = "cache";
  if (manifest?.key !== inputs.key) {
    source = "fresh";
    const jobs = options.jobs ?? navigator.hardwareConcurrency ?? 2;
    const tmp = `${cached}.tmp-${Deno.pid}`;
    log(`building from ${inputs.bundle} (${inputs.tag}) with ${jobs} jobs`);
    try {
      manifest = await buildFresh(inputs, tmp, jobs, log);
      await Deno.remove(cached, { recursive: true }).catch(() => {});
      await Deno.mkdir(dirname(cached), { recursive: true });
      await Deno.rename(tmp, cached);
      // the clone and the build tree (~240 MB) serve no later build: each
      // build clones afresh, and ccache keeps the compiled objects
      for (const d of ["src", "cmake"]) {
        await Deno.remove(join(LLAMA_BUILD_DIR, d), { recursive: true })
          .catch(() => {});
      }
    } catch (err) {
      await Deno.remove(tmp, { recursive: true }).catch(() => {});
      // another checkout may have finished the same build meanwhile
      const other = readLlamaManifest(cached);
      if (other?.key !== inputs.key) throw err;
      manifest = other;
      source = "cache";
    }
    log(`built in ${manifest.buildSeconds} s (${manifest.rdma.detail})`);
  }
  const names: string[] = [];
  for await (const e of Deno.readDir(cached)) {
    if (e.name !== MANIFEST_NAME) names.push(e.name);
  }
  // copy, manifest last: a reader that sees the manifest sees every library
  const tmpLib = `${LLAMA_LIB_DIR}.tmp-${Deno.pid}`;
  await copyTree(cached, tmpLib, names);
  await Deno.copyFile(join(cached, MANIFEST_NAME), join(tmpLib, MANIFEST_NAME));
  await Deno.remove(LLAMA_LIB_DIR, { recursive: true }).catch(() => {});
  await Deno.rename(tmpLib, LLAMA_LIB_DIR);
  return { libDir: LLAMA_LIB_DIR, manifest: manifest!, source };
}

if (import.meta.main) {
  const at = Deno.args.indexOf("--jobs");
  const jobs = at >= 0 ? Number(Deno.args[at + 1]) : undefined;
  let res: LlamaBuildResult;
  try {
    res = await ensureLlamaBuilt({
      force: Deno.args.includes("--force"),
      jobs: jobs && Number.isInteger(jobs) && jobs > 0 ? jobs : undefined,
    });
  } catch (err) {
    await Deno.stderr.write(
      new TextEncoder().encode(
        `${
          (err as Error).message
        }\nThe llama engine keeps using the prebuilt node-llama-cpp libraries (no RPC). ${
          isMac
            ? "On a Mac: xcode-select --install, and CMake (brew install cmake)."
            : "On Debian: apt-get install cmake g++ git (ccache optional)."
        }\n`,
      ),
    );
    Deno.exit(1);
  }
  await Deno.stdout.write(
    new TextEncoder().encode(
      `llama.cpp ${res.manifest.tag} (${res.source}) in ${res.libDir}: RPC on, ${res.manifest.rdma.detail}\n`,
    ),
  );
}
