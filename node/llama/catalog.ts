/**
 * The models directory: every `*.gguf` is a model whose id is its file name
 * without extension. An optional sidecar `<id>.json` sets aliases and
 * per-model context size, slots and output cap (see LlamaEngineOptions):
 *
 *     { "aliases": ["gpt-4o-mini"], "contextSize": 4096, "slots": 4,
 *       "maxOutputTokens": 8192 }
 *
 * Each header is validated (node/llama/gguf.ts) before llama.cpp sees it; a
 * file that fails is listed as unavailable with the reason, never loaded.
 */
import { join } from "node:path";
import { z } from "zod";
import { log } from "../../lib/log.ts";
import { GgufError, type ModelFacts, readGguf, validateModel } from "./gguf.ts";

const sidecarSchema = z.object({
  aliases: z.array(z.string().min(1).max(256)).max(32).optional(),
  contextSize: z.number().int().min(64).max(1 << 20).optional(),
  slots: z.number().int().min(1).max(256).optional(),
  maxOutputTokens: z.number().int().min(1).max(1 << 20).optional(),
}).strict();

export type Sidecar = z.infer<typeof sidecarSchema>;

/** One file of the models directory. */
export interface CatalogEntry {
  id: string;
  path: string;
  mtime: number;
  size: number;
  facts: ModelFacts | null;
  /** Why the file cannot be served, when it cannot. */
  error: string | null;
  sidecar: Sidecar;
}

const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/** Scans `dir`, reusing entries whose file did not change. */
export async function scanModels(
  dir: string,
  previous: Map<string, CatalogEntry> = new Map(),
): Promise<Map<string, CatalogEntry>> {
  const out = new Map<string, CatalogEntry>();
  let names: string[];
  try {
    names = [];
    for await (const e of Deno.readDir(dir)) {
      if (e.isFile || e.isSymlink) names.push(e.name);
    }
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return out;
    throw err;
  }
  for (const name of names.sort()) {
    if (!name.endsWith(".gguf")) continue;
    const id = name.slice(0, -5);
    if (!ID.test(id)) {
      log.warn("model file name is not a valid model id; skipped", {
        file: name,
      });
      continue;
    }
    const path = join(dir, name);
    let stat: Deno.FileInfo;
    try {
      stat = await Deno.stat(path);
    } catch {
      continue;
    }
    const mtime = stat.mtime?.getTime() ?? 0;
    const sidecar = await readSidecar(join(dir, `${id}.json`));
    const prev = previous.get(id);
    if (prev && prev.mtime === mtime && prev.size === stat.size) {
      out.set(id, {
        ...prev,
        sidecar: sidecar.value,
        error: prev.facts ? sidecar.error : prev.error,
      });
      continue;
    }
    let facts: ModelFacts | null = null;
    let error: string | null = sidecar.error;
    try {
      facts = validateModel(await readGguf(path));
    } catch (err) {
      error = err instanceof GgufError
        ? err.message
        : `Cannot read ${name}: ${(err as Error).message}`;
      log.warn("model file rejected", { file: name, reason: error });
    }
    out.set(id, {
      id,
      path,
      mtime,
      size: stat.size,
      facts,
      error,
      sidecar: sidecar.value,
    });
  }
  return out;
}

async function readSidecar(
  path: string,
): Promise<{ value: Sidecar; error: string | null }> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch {
    return { value: {}, error: null };
  }
  try {
    return { value: sidecarSchema.parse(JSON.parse(text)), error: null };
  } catch (err) {
    const msg = err instanceof z.ZodError
      ? err.issues.map((i) => i.message).join("; ")
      : String(err);
    return { value: {}, error: `Cannot use ${path}: ${msg}` };
  }
}

/** Resolves a model id or alias to its entry. */
export function resolveModel(
  models: Map<string, CatalogEntry>,
  name: string,
): CatalogEntry | undefined {
  const direct = models.get(name);
  if (direct) return direct;
  for (const e of models.values()) {
    if (e.sidecar.aliases?.includes(name)) return e;
  }
  return undefined;
}
