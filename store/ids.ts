import { encodeTime, monotonicFactory } from "ulid";

const ulid = monotonicFactory();

/** A new time-ordered, URL-safe id (ULID, lower-cased). */
export function newId(): string {
  return ulid().toLowerCase();
}

/** A time-ordered id for a given moment (used for audit and usage records). */
export function newIdAt(ms: number): string {
  return ulid(ms).toLowerCase();
}

/**
 * The least (or, `high`, the greatest) id of a moment: bounds of a KV range
 * over time-ordered ids.
 */
export function idBoundAt(ms: number, high: boolean): string {
  const t = Math.min(Math.max(0, Math.floor(ms)), 2 ** 48 - 1);
  return encodeTime(t, 10).toLowerCase() + (high ? "z" : "0").repeat(16);
}
