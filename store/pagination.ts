/** Cursor pagination over a KV prefix; nothing loads a whole collection. */
import { ValidationError } from "./errors.ts";

/** A page of results and the cursor for the next one (null at the end). */
export interface Page<T> {
  items: T[];
  cursor: string | null;
}

/** Options every list operation accepts. */
export interface PageOptions {
  cursor?: string | null;
  limit?: number;
  /** Newest first when true. */
  reverse?: boolean;
}

/** Clamps a requested page size to 1..200 (default 50). */
export function pageSize(limit: number | undefined): number {
  if (limit === undefined || Number.isNaN(limit)) return 50;
  if (!Number.isInteger(limit) || limit < 1) {
    throw new ValidationError("limit must be a positive integer", "limit");
  }
  return Math.min(limit, 200);
}

/** A KV list cursor from a client, checked (undefined when none). */
export function checkCursor(
  cursor: string | null | undefined,
): string | undefined {
  if (!cursor) return undefined;
  if (cursor.length > 1024 || !/^[A-Za-z0-9_\-+/=]+$/.test(cursor)) {
    throw new ValidationError("cursor is invalid", "cursor");
  }
  return cursor;
}

/**
 * Lists one page of `selector`, mapping each value with `map` (return null
 * to skip an entry; skipped entries still advance the cursor).
 */
export async function listPage<V, T>(
  kv: Deno.Kv,
  selector: Deno.KvListSelector,
  opts: PageOptions,
  map: (value: V, key: Deno.KvKey) => T | null | Promise<T | null>,
): Promise<Page<T>> {
  const limit = pageSize(opts.limit);
  const cursor = checkCursor(opts.cursor);
  const iter = kv.list<V>(selector, {
    limit,
    cursor,
    reverse: opts.reverse ?? false,
  });
  const items: T[] = [];
  let count = 0;
  try {
    for await (const entry of iter) {
      count++;
      const item = await map(entry.value, entry.key);
      if (item !== null) items.push(item);
    }
  } catch (err) {
    if (cursor) throw new ValidationError("cursor is invalid", "cursor");
    throw err;
  }
  return { items, cursor: count === limit ? iter.cursor || null : null };
}
