/**
 * Bundles `islands/*.tsx` for the browser with the built-in `deno bundle`
 * (code-split, minified), fingerprints each entry by content hash, and
 * returns the manifest the server uses to emit one `<script>` per island a
 * page actually renders. Pages without islands ship no JavaScript.
 */
import { sha256 } from "./crypto.ts";

/** Island name → URL of its fingerprinted entry script. */
export type IslandManifest = Record<string, string>;

const ROOT = new URL("../", import.meta.url);

/** Builds the island bundles into `static/build/` and returns the manifest. */
export async function buildIslands(): Promise<IslandManifest> {
  const islandsDir = new URL("islands/", ROOT);
  const entriesDir = new URL("build/island-entries/", ROOT);
  const outDir = new URL("static/build/", ROOT);
  await Deno.mkdir(entriesDir, { recursive: true });
  await Deno.remove(outDir, { recursive: true }).catch(() => {});
  const names: string[] = [];
  for await (const f of Deno.readDir(islandsDir)) {
    const m = /^([A-Z][A-Za-z0-9]*)\.tsx$/.exec(f.name);
    if (f.isFile && m) names.push(m[1]!);
  }
  names.sort();
  if (names.length === 0) return {};
  const entries: string[] = [];
  for (const name of names) {
    const entry = new URL(`${name}.ts`, entriesDir);
    await Deno.writeTextFile(
      entry,
      `import { h, hydrate } from "preact";\n` +
        `import Island from "../../islands/${name}.tsx";\n` +
        `for (const el of document.querySelectorAll<HTMLElement>('orchard-island[data-name="${name}"]')) {\n` +
        `  hydrate(h(Island, JSON.parse(el.dataset.props ?? "{}")), el);\n}\n`,
    );
    entries.push(entry.pathname);
  }
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "bundle",
      "--quiet",
      "--code-splitting",
      "--platform",
      "browser",
      "--minify",
      "--outdir",
      outDir.pathname,
      ...entries,
    ],
    cwd: ROOT.pathname,
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(
      `Cannot bundle islands: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
  const manifest: IslandManifest = {};
  for (const name of names) {
    const file = new URL(`${name}.js`, outDir);
    const hash = (await sha256(await Deno.readTextFile(file))).slice(0, 12);
    const fingerprinted = `${name}-${hash}.js`;
    await Deno.rename(file, new URL(fingerprinted, outDir));
    manifest[name] = `/static/build/${fingerprinted}`;
  }
  return manifest;
}
