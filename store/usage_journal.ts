/**
 * The usage journal: every usage record a gateway meters is appended to a
 * local file (`<root>/<instance>/<writer>/<first seq>.log`, one line per
 * record: `<seq>\t<JSON>`) before it waits to be written to KV, and the
 * files are deleted once everything in them is in KV. A gateway that was
 * killed leaves its files behind; the next one on the same data directory
 * (or the instance that reclaims a lapsed one) replays them
 * (`UsageRollups.replay`), exactly once: records and rollup shards in KV
 * say up to which sequence number they hold a writer's records.
 *
 * Lines are written to the file (the OS's page cache, which a `kill -9`
 * does not lose) every `flushMs`, and synced to disk every `syncMs`
 * (which a power cut would otherwise lose). Written here, not with a
 * library: no maintained Deno or npm package is an append-only record log
 * with numbered entries and deletion by watermark (the options are whole
 * databases, and Deno KV itself is what may be unreachable).
 */
import type { UsageRecord } from "./usage.ts";

/** One journaled record and its sequence number (per writer, from 1). */
export interface JournalEntry {
  seq: number;
  record: UsageRecord;
}

/** Tunables of a UsageJournal. */
export interface UsageJournalOptions {
  /** How often appended lines are written to the file (default 100 ms). */
  flushMs?: number;
  /** How often the file is synced to disk (default 1000 ms). */
  syncMs?: number;
  /** How long a file takes lines before a new one starts (default 10 s). */
  segmentMs?: number;
}

interface Segment {
  readonly path: string;
  /** The last sequence number written to it. */
  last: number;
}

/** One writer's journal: lines appended in order, files deleted once in KV. */
export class UsageJournal {
  readonly dir: string;
  readonly #flushMs: number;
  readonly #syncMs: number;
  readonly #segmentMs: number;
  /** Files no longer written to, oldest first. */
  readonly #closed: Segment[] = [];
  #current: (Segment & { file: Deno.FsFile; since: number }) | null = null;
  #lines: string[] = [];
  #firstBuffered = 0;
  #lastBuffered = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #lastSync = Date.now();
  #unsynced = false;
  #syncing: Promise<void> | null = null;
  #closedForGood = false;

  private constructor(dir: string, opts: UsageJournalOptions) {
    this.dir = dir;
    this.#flushMs = opts.flushMs ?? 100;
    this.#syncMs = opts.syncMs ?? 1000;
    this.#segmentMs = opts.segmentMs ?? 10_000;
  }

  /** Opens a new journal in `dir` (created; it must hold no journal yet). */
  static async open(
    dir: string,
    opts: UsageJournalOptions = {},
  ): Promise<UsageJournal> {
    await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
    return new UsageJournal(dir, opts);
  }

  /** Appends a record (written to the file within `flushMs`). */
  append(seq: number, record: UsageRecord): void {
    if (this.#closedForGood) return;
    if (this.#lines.length === 0) this.#firstBuffered = seq;
    this.#lines.push(`${seq}\t${JSON.stringify(record)}\n`);
    this.#lastBuffered = seq;
    if (this.#timer === undefined) {
      this.#timer = setTimeout(() => {
        this.#timer = undefined;
        this.flush();
      }, this.#flushMs);
    }
  }

  /**
   * Writes the appended lines to the file now (synchronously: a few
   * hundred lines a tick, into the page cache), starting a new file when
   * the current one is older than `segmentMs`, and starts a sync to disk
   * when the last was `syncMs` ago.
   */
  flush(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#lines.length === 0) return;
    const now = Date.now();
    if (this.#current && now - this.#current.since >= this.#segmentMs) {
      this.#rotate();
    }
    if (!this.#current) {
      const path = `${this.dir}/${this.#firstBuffered}.log`;
      this.#current = {
        path,
        last: 0,
        since: now,
        file: Deno.openSync(path, { create: true, append: true, mode: 0o600 }),
      };
    }
    const bytes = new TextEncoder().encode(this.#lines.join(""));
    this.#lines = [];
    let off = 0;
    while (off < bytes.length) {
      off += this.#current.file.writeSync(bytes.subarray(off));
    }
    this.#current.last = this.#lastBuffered;
    this.#unsynced = true;
    if (now - this.#lastSync >= this.#syncMs && !this.#syncing) {
      this.#lastSync = now;
      this.#unsynced = false;
      const file = this.#current.file;
      this.#syncing = file.syncData().catch(() => {}).finally(() => {
        this.#syncing = null;
      });
    }
  }

  /**
   * Deletes the files whose every record is in KV: those whose last
   * sequence number is at most `upTo`. The current file too when it is
   * all in KV and nothing waits to be written to it.
   */
  prune(upTo: number): void {
    while (this.#closed.length > 0 && this.#closed[0]!.last <= upTo) {
      removeQuietly(this.#closed.shift()!.path);
    }
    if (
      this.#current && this.#lines.length === 0 && this.#current.last <= upTo
    ) {
      const { path } = this.#current;
      this.#rotate();
      this.#closed.pop();
      removeQuietly(path);
    }
  }

  /** Files on disk now (for tests and the status line). */
  get files(): number {
    return this.#closed.length + (this.#current ? 1 : 0);
  }

  /**
   * Writes what is buffered and closes the file. With `upTo`, deletes what
   * is in KV, and the directory when nothing is left.
   */
  async close(upTo?: number): Promise<void> {
    if (this.#closedForGood) return;
    this.flush();
    this.#closedForGood = true;
    await this.#syncing;
    if (this.#current && this.#unsynced) {
      await this.#current.file.syncData().catch(() => {});
    }
    if (upTo !== undefined) this.prune(upTo);
    this.#rotate();
    if (this.#closed.length === 0) {
      await Deno.remove(this.dir, { recursive: true }).catch(() => {});
    }
  }

  #rotate(): void {
    if (!this.#current) return;
    this.#current.file.close();
    this.#closed.push({ path: this.#current.path, last: this.#current.last });
    this.#current = null;
  }
}

function removeQuietly(path: string): void {
  try {
    Deno.removeSync(path);
  } catch { /* gone already */ }
}

/**
 * Reads a journal directory's records in sequence order. A last line cut
 * short by a crash is skipped; so are lines that do not parse (a disk
 * error), counted in `skipped`.
 */
export async function readJournal(
  dir: string,
): Promise<{ entries: JournalEntry[]; skipped: number }> {
  const files: { first: number; path: string }[] = [];
  for await (const e of Deno.readDir(dir)) {
    const m = /^(\d+)\.log$/.exec(e.name);
    if (e.isFile && m) {
      files.push({ first: Number(m[1]), path: `${dir}/${e.name}` });
    }
  }
  files.sort((a, b) => a.first - b.first);
  const entries: JournalEntry[] = [];
  let skipped = 0;
  for (const f of files) {
    const text = await Deno.readTextFile(f.path);
    const lines = text.split("\n");
    // The text after the last newline is a line cut short (or empty).
    if (lines.pop()) skipped++;
    for (const line of lines) {
      const tab = line.indexOf("\t");
      const seq = Number(line.slice(0, tab));
      try {
        if (tab < 1 || !Number.isSafeInteger(seq)) throw new Error("no seq");
        entries.push({ seq, record: JSON.parse(line.slice(tab + 1)) });
      } catch {
        skipped++;
      }
    }
  }
  entries.sort((a, b) => a.seq - b.seq);
  return { entries, skipped };
}

/** The journal directories under `root`: `{ instance, writer, dir }` each. */
export async function journalDirs(
  root: string,
): Promise<{ instance: string; writer: string; dir: string }[]> {
  const out: { instance: string; writer: string; dir: string }[] = [];
  try {
    for await (const i of Deno.readDir(root)) {
      if (!i.isDirectory) continue;
      for await (const w of Deno.readDir(`${root}/${i.name}`)) {
        if (!w.isDirectory) continue;
        out.push({
          instance: i.name,
          writer: w.name,
          dir: `${root}/${i.name}/${w.name}`,
        });
      }
    }
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
  return out;
}
