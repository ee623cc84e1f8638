import { monotonicFactory } from "ulid";

const ulid = monotonicFactory();

/** A new time-ordered, URL-safe id (ULID, lower-cased). */
export function newId(): string {
  return ulid().toLowerCase();
}

/** A time-ordered id for a given moment (used for audit and usage records). */
export function newIdAt(ms: number): string {
  return ulid(ms).toLowerCase();
}
