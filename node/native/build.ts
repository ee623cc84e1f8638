/**
 * Builds liborchard, the orchard-linktest CLI and (on request) the C test
 * binaries with the system C compiler into `build/native/`, only when an
 * output is missing or its inputs changed: each output keeps, beside it
 * (`<output>.inputs`), a SHA-256 of the compiler, its arguments and every file
 * the compiler reads for it, system headers included (`cc -M`). So installing
 * `<infiniband/verbs.h>` after a first build without it (it is included through
 * `__has_include`), or upgrading it, rebuilds without `--force`.
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

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return false;
    throw err;
  }
}

/** Parses `cc -M` output (one make rule per source, `\\` continuations) into each source's files, keyed by the source (a rule's first prerequisite). */
function parseDeps(makeRules: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const rule of makeRules.replaceAll("\\\n", " ").split("\n")) {
    const colon = rule.indexOf(": ");
    if (colon < 0) continue;
    const files = rule.slice(colon + 2).split(/\s+/).filter((f) => f !== "");
    if (files[0]) out.set(files[0], files);
  }
  return out;
}

const isSource = (arg: string) => /\.(c|m)$/.test(arg);

/**
 * SHA-256 (hex) per target of what building it depends on: the compiler's
 * version line, the target's arguments, and the content of every source and
 * header the preprocessor reads for it (`cc -M`, which lists system headers
 * too, and only the ones found: a header that appears or changes changes the
 * digest). One `cc -M` run covers every target.
 */
export async function nativeInputDigests(
  cc: string,
  targets: Record<string, string[]>,
  env?: Record<string, string>,
): Promise<Record<string, string>> {
  const cwd = new URL("src/", NATIVE).pathname;
  const run = async (args: string[]) => {
    const { code, stdout, stderr } = await new Deno.Command(cc, {
      args,
      cwd,
      env,
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (code !== 0) {
      throw new Error(
        `Cannot build native code: ${cc} ${
          args.join(" ")
        } exited with ${code}\n${new TextDecoder().decode(stderr)}`,
      );
    }
    return new TextDecoder().decode(stdout);
  };
  const sources = [...new Set(Object.values(targets).flat().filter(isSource))];
  // Only flags that change what the preprocessor reads: link flags with -M
  // are unused arguments, which clang's -Werror refuses.
  const cpp = [...new Set(Object.values(targets).flat())]
    .filter((a) => /^-(D|I|fobjc-arc$)/.test(a));
  const [version, rules] = await Promise.all([
    run(["--version"]),
    run([...CFLAGS, ...cpp, "-M", ...sources]),
  ]);
  const deps = parseDeps(rules);
  const contents = new Map<string, Promise<Uint8Array>>();
  const read = (file: string) => {
    let p = contents.get(file);
    if (!p) {
      p = Deno.readFile(file.startsWith("/") ? file : cwd + file);
      contents.set(file, p);
    }
    return p;
  };
  const enc = new TextEncoder();
  const digests: Record<string, string> = {};
  for (const [name, args] of Object.entries(targets)) {
    const files = new Set<string>();
    for (const src of args.filter(isSource)) {
      const list = deps.get(src);
      if (!list) {
        throw new Error(
          `Cannot build native code: ${cc} -M listed nothing for ${src}`,
        );
      }
      for (const f of list) files.add(f);
    }
    const parts: Uint8Array[] = [
      enc.encode(
        `${cc}\n${version.split("\n")[0]}\n${[...CFLAGS, ...args].join(" ")}\n`,
      ),
    ];
    for (const f of [...files].sort()) {
      parts.push(enc.encode(`\0${f}\0`), await read(f));
    }
    const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      all.set(p, at);
      at += p.length;
    }
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
    digests[name] = Array.from(digest, (b) => b.toString(16).padStart(2, "0"))
      .join("");
  }
  return digests;
}

/** Writes a file through a temporary name, so readers never see half of it. */
async function writeAtomic(path: string, text: string): Promise<void> {
  const tmp = `${path}.tmp-${Deno.pid}`;
  await Deno.writeTextFile(tmp, text);
  await Deno.rename(tmp, path);
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

/** The compiler arguments of each artifact (relative to `native/src/`). */
function targetArgs(
  options: BuildOptions,
  verbsHeader: boolean,
): Partial<Record<keyof typeof nativePaths, string[]>> {
  const sources = [...COMMON, ...PLATFORM];
  const shared = isMac ? "-dynamiclib" : "-shared";
  const soname = isMac
    ? [shared, "-install_name", `@rpath/${LIB_NAME}`]
    : [shared];
  const targets: Partial<Record<keyof typeof nativePaths, string[]>> = {
    lib: [...soname, ...sources, ...LIBS],
    cli: ["../cli/orchard_linktest.c", ...sources, ...LIBS],
  };
  if (options.tests) {
    targets.cTest = ["../tests/c_test.c", ...sources, ...LIBS];
    // The fake verbs provider (a test double) and its checks need the verbs
    // header; without it liborchard reports RDMA unavailable and the tests
    // that need the double skip (see hasVerbsHeader).
    if (verbsHeader) {
      targets.fakeVerbs = [
        shared,
        "../tests/fake_verbs.c",
        ...(isMac ? [] : ["-lpthread"]),
      ];
      targets.fakeVerbsTest = [
        "../tests/fake_verbs_test.c",
        ...sources,
        ...LIBS,
      ];
    }
    targets.abiMismatch = [shared, "../tests/abi_mismatch.c"];
  }
  if (options.bench) targets.tcpBaseline = ["../bench/tcp_baseline.c"];
  return targets;
}

/** Builds already checked in this process (headers do not change under a running process's feet). */
const checked = new Map<string, Promise<void>>();

async function build(options: BuildOptions, cc: string): Promise<void> {
  const verbs = options.tests ? await hasVerbsHeader(cc) : false;
  const targets = targetArgs(options, verbs) as Record<
    keyof typeof nativePaths,
    string[]
  >;
  const digests = await nativeInputDigests(cc, targets);
  for (const [name, args] of Object.entries(targets)) {
    const out = nativePaths[name as keyof typeof nativePaths];
    const stamp = `${out}.inputs`;
    const digest = digests[name]!;
    const built = await exists(out) &&
      await Deno.readTextFile(stamp).catch(() => "") === digest;
    if (built && !options.force) continue;
    await compile(cc, out, args);
    await writeAtomic(stamp, digest);
  }
}

/**
 * Builds the native artifacts into build/native/ when missing or when their
 * inputs (sources, headers, system headers, flags, compiler) changed since
 * they were built; returns their paths. Checked once per process and option
 * set. Throws with the compiler output on failure.
 */
export async function ensureNativeBuilt(
  options: BuildOptions = {},
): Promise<typeof nativePaths> {
  const cc = options.cc ?? Deno.env.get("CC") ?? "cc";
  if (options.force) {
    await build(options, cc);
  } else {
    const key = JSON.stringify([cc, !!options.tests, !!options.bench]);
    let done = checked.get(key);
    if (!done) {
      done = build(options, cc);
      checked.set(key, done);
      done.catch(() => checked.delete(key));
    }
    await done;
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
