/**
 * The small checks the Responses request readers share (responses_request.ts,
 * responses_tools.ts): each refuses with a 400 naming the param path.
 */
import {
  invalidParam as bad,
  unsupportedParam,
} from "../protocol/openai/errors.ts";
import { NAME_PATTERN } from "../protocol/openai/output_controls.ts";

export const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);
export const given = (v: unknown) => v !== undefined && v !== null;
export const str = (v: unknown): v is string => typeof v === "string";
export const nonEmpty = (v: unknown): v is string => str(v) && v.length > 0;

export function object(v: unknown, at: string): Record<string, unknown> {
  if (!given(v)) {
    throw bad(at, `${at} is required`, "missing_required_parameter");
  }
  if (!isObj(v)) throw bad(at, `${at} must be an object`, "invalid_type");
  return v;
}

export function typed(v: unknown, at: string, ok: boolean, what: string): void {
  if (given(v) && !ok) throw bad(at, `${at} must be ${what}`, "invalid_type");
}

/** Refuses keys of `o` outside `known` that ask for something (not null or false). */
export function onlyKeys(
  o: Record<string, unknown>,
  at: string,
  known: readonly string[],
): void {
  for (const [key, v] of Object.entries(o)) {
    if (known.includes(key) || v === null || v === false) continue;
    const p = `${at}.${key.slice(0, 64)}`;
    throw unsupportedParam(p, `${p} is not supported`);
  }
}

export function name(v: unknown, at: string): string {
  if (!str(v) || !NAME_PATTERN.test(v)) {
    throw bad(at, `${at} must match ${NAME_PATTERN.source}`);
  }
  return v;
}
