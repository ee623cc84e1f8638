/**
 * Builds liborchard, the orchard-linktest CLI and (on request) the C test
 * binaries with the system C compiler into `build/native/`, only when an
 * output is missing or older than a source under `native/`.
 *
 * @module
 */

const ROOT = new URL("../../", import.meta.url);
const NATIVE = new URL("native/", ROOT);

/** Folder that holds the built native artifacts. */
export const BUILD_DIR = new URL("build/native/", ROOT).pathname;

const isMac = Deno.build.os === "darwin";

/** File name of the shared library on this platform. */
export const LIB_NAME = isMac ? "liborchard.dylib" : "liborchard.so";

/** Absolute paths of everything ensureNativeBuilt() can produce. */
export const nativePaths = {
  lib: BUILD_DIR + LIB_NAME,
  cli: BUILD_DIR + "orchard-linktest",
  cTest: BUILD_DIR + "test/c_test",
  fakeVerbs: BUILD_DIR + "test/" +
    (isMac ? "libfake_verbs.dylib" : "libfake_verbs.so"),
  fakeVerbsTest: BUILD_DIR + "test/fake_verbs_test",
  abiMismatch: BUILD_DIR + "test/" +
    (isMac ? "libabi_mismatch.dylib" : "libabi_mismatch.so"),
  tcpBaseline: BUILD_DIR + "bench/tcp_baseline",
} as const;

const COMMON = [
  "json.c",
  "core.c",
  "util.c",
  "net.c",
  "probe.c",
  "verbs.c",
  "sha256.c",
  "linktest.c",
  "linktest_rdma.c",
];
/** Platform code stays behind the C header: Metal/Objective-C only on macOS. */
const PLATFORM = isMac ? ["sys_macos.c", "apple.m"] : [
  "sys_linux.c",
  "gpu_none.c",
];
const CFLAGS = [
  "-std=gnu11",
  "-Wall",
  "-Wextra",
  "-Werror",
  "-O2",
  "-fPIC",
  "-fvisibility=hidden",
];
const LIBS = isMac
  ? [
    "-fobjc-arc",
    "-Wno-unused-command-line-argument",
    "-framework",
    "Foundation",
    "-framework",
    "Metal",
    "-framework",
    "IOKit",
    "-framework",
    "CoreFoundation",
  ]
  : ["-ldl", "-lpthread", "-lm"];

/** Options for ensureNativeBuilt(). */
export interface BuildOptions {
  /** Also build the C unit tests and the fake verbs provider (test double). */
  tests?: boolean;
  /** Also build the plain TCP ping-pong used as the benchmark baseline. */
  bench?: boolean;
  /** Rebuild even when outputs look fresh. */
  force?: boolean;
  /** C compiler; defaults to env CC, else `cc`. */
  cc?: string;
}

async function mtime(path: string): Promise<number> {
  try {
    return (await Deno.stat(path)).mtime?.getTime() ?? 0;
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return 0;
    throw err;
  }
}

async function newestSource(dir: URL): Promise<number> {
  let newest = 0;
  for await (const entry of Deno.readDir(dir)) {
    const url = new URL(entry.name + (entry.isDirectory ? "/" : ""), dir);
    if (entry.isDirectory) newest = Math.max(newest, await newestSource(url));
    else if (/\.(c|h|m)$/.test(entry.name)) {
      newest = Math.max(newest, await mtime(url.pathname));
    }
  }
  return newest;
}

async function compile(cc: string, out: string, args: string[]): Promise<void> {
  await Deno.mkdir(out.slice(0, out.lastIndexOf("/")), { recursive: true });
  // Build to a temporary name and rename: concurrent callers never see a half-written file.
  const tmp = `${out}.tmp-${Deno.pid}`;
  const { code, stderr } = await new Deno.Command(cc, {
    args: [...CFLAGS, "-o", tmp, ...args],
    cwd: new URL("src/", NATIVE).pathname,
    stdout: "null",
    stderr: "piped",
  }).output();
  if (code !== 0) {
    await Deno.remove(tmp).catch(() => {});
    throw new Error(
      `Cannot build ${out}: ${cc} exited with ${code}\n${
        new TextDecoder().decode(stderr)
      }`,
    );
  }
  await Deno.rename(tmp, out);
}

let verbsHeader: Promise<boolean> | undefined;

/** Whether the C compiler finds `<infiniband/verbs.h>` (Debian libibverbs-dev, the macOS SDK). */
export function hasVerbsHeader(
  cc = Deno.env.get("CC") ?? "cc",
): Promise<boolean> {
  verbsHeader ??= (async () => {
    try {
      const child = new Deno.Command(cc, {
        args: ["-fsyntax-only", "-x", "c", "-"],
        stdin: "piped",
        stdout: "null",
        stderr: "null",
      }).spawn();
      const w = child.stdin.getWriter();
      await w.write(
        new TextEncoder().encode("#include <infiniband/verbs.h>\nint x;\n"),
      );
      await w.close();
      return (await child.status).success;
    } catch {
      return false;
    }
  })();
  return verbsHeader;
}

/**
 * Builds the native artifacts into build/native/ when missing or older than
 * the sources; returns their paths. Throws with the compiler output on failure.
 */
export async function ensureNativeBuilt(
  options: BuildOptions = {},
): Promise<typeof nativePaths> {
  const cc = options.cc ?? Deno.env.get("CC") ?? "cc";
  const src = await newestSource(NATIVE);
  const stale = async (p: string) =>
    options.force || (await mtime(p)) < src || (await mtime(p)) === 0;
  const sources = [...COMMON, ...PLATFORM];
  if (await stale(nativePaths.lib)) {
    const soname = isMac
      ? ["-dynamiclib", "-install_name", `@rpath/${LIB_NAME}`]
      : ["-shared"];
    await compile(cc, nativePaths.lib, [...soname, ...sources, ...LIBS]);
  }
  if (await stale(nativePaths.cli)) {
    await compile(cc, nativePaths.cli, [
      "../cli/orchard_linktest.c",
      ...sources,
      ...LIBS,
    ]);
  }
  if (options.tests) {
    if (await stale(nativePaths.cTest)) {
      await compile(cc, nativePaths.cTest, [
        "../tests/c_test.c",
        ...sources,
        ...LIBS,
      ]);
    }
    // The fake verbs provider (a test double) and its checks need the verbs
    // header; without it liborchard reports RDMA unavailable and the tests
    // that need the double skip (see hasVerbsHeader).
    if (await hasVerbsHeader(cc)) {
      if (await stale(nativePaths.fakeVerbs)) {
        await compile(cc, nativePaths.fakeVerbs, [
          isMac ? "-dynamiclib" : "-shared",
          "../tests/fake_verbs.c",
          ...(isMac ? [] : ["-lpthread"]),
        ]);
      }
      if (await stale(nativePaths.fakeVerbsTest)) {
        await compile(cc, nativePaths.fakeVerbsTest, [
          "../tests/fake_verbs_test.c",
          ...sources,
          ...LIBS,
        ]);
      }
    }
    if (await stale(nativePaths.abiMismatch)) {
      await compile(cc, nativePaths.abiMismatch, [
        isMac ? "-dynamiclib" : "-shared",
        "../tests/abi_mismatch.c",
      ]);
    }
  }
  if (options.bench && await stale(nativePaths.tcpBaseline)) {
    await compile(cc, nativePaths.tcpBaseline, ["../bench/tcp_baseline.c"]);
  }
  return nativePaths;
}

if (import.meta.main) {
  const paths = await ensureNativeBuilt({
    force: Deno.args.includes("--force"),
    tests: Deno.args.includes("--tests"),
    bench: Deno.args.includes("--bench"),
  });
  await Deno.stdout.write(
    new TextEncoder().encode(`built ${paths.lib}\nbuilt ${paths.cli}\n`),
  );
}
