/**
 * The layering protocol/ exists for, checked on the source: protocol/
 * imports only lib/, protocol/ and packages (npm:, jsr:, node: and the
 * import map's names for them); store/ and fleet/ never import node/.
 * Specifiers are read with a regex, not resolved by Deno: simple and fast.
 */
import assert from "node:assert/strict";
import { dirname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../", import.meta.url));

/** Static `import`/`export … from`, side-effect imports and `import()`. */
const STATIC =
  /(?:^|[;\n])\s*(?:import|export)\s(?:[^"'`;]*?\sfrom\s*)?["']([^"'\n]+)["']/g;
const DYNAMIC = /\bimport\(\s*["']([^"'\n]+)["']\s*\)/g;

/** The module specifiers a source file imports. */
function importsOf(source: string): string[] {
  return [...source.matchAll(STATIC), ...source.matchAll(DYNAMIC)]
    .map((m) => m[1]!);
}

/** The import map's bare names that stand for packages (npm:/jsr:). */
function packageNames(): Set<string> {
  const json = JSON.parse(Deno.readTextFileSync(join(ROOT, "deno.json")));
  const imports = json.imports as Record<string, string>;
  return new Set(
    Object.entries(imports)
      .filter(([, to]) => /^(npm|jsr):/.test(to))
      .map(([name]) => name),
  );
}

/** A relative specifier's target, as a root-relative path with `/`. */
function target(file: string, spec: string): string {
  return relative(ROOT, join(dirname(join(ROOT, file)), spec))
    .split(sep).join("/");
}

/** Root-relative paths of the .ts/.tsx files under `dir`. */
function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of Deno.readDirSync(join(ROOT, dir))) {
    const path = `${dir}/${e.name}`;
    if (e.isDirectory) out.push(...sourceFiles(path));
    else if (/\.tsx?$/.test(e.name)) out.push(path);
  }
  return out.sort();
}

/** Why `spec`, imported by protocol/'s `file`, breaks the rule (null: fine). */
function protocolViolation(
  file: string,
  spec: string,
  packages: Set<string>,
): string | null {
  if (spec.startsWith(".")) {
    const to = target(file, spec);
    return /^(lib|protocol)\//.test(to) ? null : `${file} imports ${to}`;
  }
  if (/^(npm|jsr|node):/.test(spec)) return null;
  const bare = spec.split("/")[0]!.startsWith("@")
    ? spec.split("/").slice(0, 2).join("/")
    : spec.split("/")[0]!;
  if (packages.has(spec) || packages.has(bare) || packages.has(`${bare}/`)) {
    return null;
  }
  return `${file} imports ${spec}`;
}

/** Why `spec`, imported by store/'s or fleet/'s `file`, breaks the rule. */
function nodeViolation(file: string, spec: string): string | null {
  if (!spec.startsWith(".")) return null;
  const to = target(file, spec);
  return to.startsWith("node/") ? `${file} imports ${to}` : null;
}

Deno.test("importsOf() finds static, multi-line, re-export, side-effect and dynamic imports", () => {
  const source = [
    `import { a } from "./a.ts";`,
    `import type {\n  B,\n  C,\n} from "../node/engine.ts";`,
    `export { d } from "../lib/d.ts";`,
    `import "./side.ts";`,
    `const m = await ${"import"}("../gateway/x.ts");`, // not spelled here
    ` * import nothing from "./in_a_comment.ts" (not at a line's start)`,
  ].join("\n");
  assert.deepEqual(importsOf(source).sort(), [
    "../gateway/x.ts",
    "../lib/d.ts",
    "../node/engine.ts",
    "./a.ts",
    "./side.ts",
  ]);
});

Deno.test("the rules flag a planted violation and pass what is allowed", () => {
  const packages = new Set(["zod", "hono/"]);
  const f = "protocol/openai/errors.ts";
  assert.equal(protocolViolation(f, "../../lib/sse.ts", packages), null);
  assert.equal(protocolViolation(f, "./tool_calls.ts", packages), null);
  assert.equal(protocolViolation(f, "../engine.ts", packages), null);
  assert.equal(protocolViolation(f, "zod", packages), null);
  assert.equal(protocolViolation(f, "hono/http-exception", packages), null);
  assert.equal(protocolViolation(f, "npm:jose@6", packages), null);
  assert.equal(
    protocolViolation(f, "../../gateway/core.ts", packages),
    "protocol/openai/errors.ts imports gateway/core.ts",
  );
  assert.equal(
    protocolViolation(f, "https://deno.land/x/y.ts", packages),
    "protocol/openai/errors.ts imports https://deno.land/x/y.ts",
  );
  assert.equal(
    nodeViolation("store/nodes.ts", "../node/engine.ts"),
    "store/nodes.ts imports node/engine.ts",
  );
  assert.equal(nodeViolation("fleet/types.ts", "../protocol/engine.ts"), null);
});

Deno.test("protocol/ imports only lib/, protocol/ and packages", () => {
  const packages = packageNames();
  const bad = sourceFiles("protocol").flatMap((file) =>
    importsOf(Deno.readTextFileSync(join(ROOT, file)))
      .map((spec) => protocolViolation(file, spec, packages))
      .filter((v) => v !== null)
  );
  assert.deepEqual(bad, []);
});

Deno.test("store/ and fleet/ never import node/", () => {
  const files = [...sourceFiles("store"), ...sourceFiles("fleet")];
  const bad = files.flatMap((file) =>
    importsOf(Deno.readTextFileSync(join(ROOT, file)))
      .map((spec) => nodeViolation(file, spec))
      .filter((v) => v !== null)
  );
  assert.deepEqual(bad, []);
});
