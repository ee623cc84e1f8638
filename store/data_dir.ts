/**
 * The data directory holds the embedded KV (`orchard.kv`: the key pepper,
 * the session key and the gateway's private key among its values), the
 * usage journal, the gateway instance id and the local node's identity.
 * None of it is for other users of the machine: the directory and every
 * folder in it are 0700, every file 0600. `secureDataDir` makes them so at
 * start (creating the directory 0700 when missing) and says what it had to
 * tighten, so a directory made by an older version, a copy or a restore is
 * fixed with a warning rather than left readable. Files created later are
 * created 0600 by their writers (the journal, the instance id), and
 * SQLite gives the KV's `-wal` and `-shm` files the database file's mode.
 *
 * Only POSIX permissions: on Windows `Deno.chmod` is not available and
 * nothing is done.
 *
 * @module
 */
import { join } from "node:path";

/** Mode of the data directory and the folders in it. */
export const DIR_MODE = 0o700;
/** Mode of every file in the data directory. */
export const FILE_MODE = 0o600;

/** A path whose mode was tightened, and the mode it had. */
export interface Tightened {
  path: string;
  was: number;
}

/**
 * Creates `dir` (0700) if missing, then tightens it and everything in it
 * to 0700 (folders) and 0600 (files); returns what it changed. Links are
 * not followed.
 */
export async function secureDataDir(dir: string): Promise<Tightened[]> {
  await Deno.mkdir(dir, { recursive: true, mode: DIR_MODE });
  if (Deno.build.os === "windows") return [];
  const changed: Tightened[] = [];
  const fix = async (path: string, info: Deno.FileInfo, want: number) => {
    const mode = (info.mode ?? 0) & 0o777;
    if ((mode & ~want) === 0) return;
    await Deno.chmod(path, want);
    changed.push({ path, was: mode });
  };
  const walk = async (path: string) => {
    await fix(path, await Deno.lstat(path), DIR_MODE);
    for await (const e of Deno.readDir(path)) {
      const p = join(path, e.name);
      if (e.isSymlink) continue;
      if (e.isDirectory) await walk(p);
      else if (e.isFile) await fix(p, await Deno.lstat(p), FILE_MODE);
    }
  };
  await walk(dir);
  return changed;
}
