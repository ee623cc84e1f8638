/**
 * JSON helpers of the admin APIs (the portal's `/api/admin` and the fleet's
 * node-facing and nodes admin APIs): bounded body reading with clear 400s
 * and 413s, and the error body they all use.
 */
import type { Context } from "hono";
import { JsonBodyError, readJsonObject } from "../../lib/json_body.ts";
import { ServiceError, ValidationError } from "../../store/errors.ts";

/** Largest admin API body accepted. */
export const MAX_ADMIN_BODY = 64 * 1024;

/** Reads a JSON object body (≤ 64 KiB), or throws a 400 naming the problem. */
export function readJson(c: Context): Promise<Record<string, unknown>> {
  return readJsonBody(c, MAX_ADMIN_BODY, "Body is too large (max 64 KiB)");
}

/**
 * Reads a JSON object body of at most `max` bytes (an empty one is `{}`),
 * sent as application/json, or throws a 400 naming the problem, or a 413.
 */
export async function readJsonBody(
  c: Context,
  max: number,
  tooLarge = `Body is over ${max} bytes`,
): Promise<Record<string, unknown>> {
  try {
    return await readJsonObject(c.req.raw, {
      maxBytes: max,
      emptyIsObject: true,
      requireJsonType: true,
    });
  } catch (e) {
    if (!(e instanceof JsonBodyError)) throw e;
    switch (e.problem) {
      case "not_json_type":
        throw new ValidationError(
          "Send a JSON body with content-type application/json",
          "body",
        );
      case "too_large":
        throw new ServiceError(413, "payload_too_large", tooLarge);
      case "unreadable":
        throw new ValidationError("Cannot read the request body", "body");
      case "not_object":
        throw new ValidationError("Body must be a JSON object", "body");
      default:
        throw new ValidationError("Body is not valid JSON", "body");
    }
  }
}

/** The JSON error body every admin API failure uses. */
export function errorBody(err: ServiceError) {
  return {
    error: {
      message: err.message,
      code: err.code,
      field: err.field ?? null,
      ...(err instanceof ValidationError && err.issues.length > 1
        ? { issues: err.issues }
        : {}),
    },
  };
}

/** Parses `?limit=` (absent → undefined). */
export function limitParam(raw: string | undefined): number | undefined {
  if (raw === undefined || raw === "") return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) {
    throw new ValidationError("limit must be a positive integer", "limit");
  }
  return n;
}
