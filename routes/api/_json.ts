/** JSON helpers for the admin API: bounded body reading with clear 400s. */
import type { Context } from "hono";
import { ServiceError, ValidationError } from "../../store/errors.ts";

/** Largest admin API body accepted. */
export const MAX_ADMIN_BODY = 64 * 1024;

/** Reads a JSON object body (≤ 64 KiB), or throws a 400 naming the problem. */
export async function readJson(c: Context): Promise<Record<string, unknown>> {
  const type = c.req.header("content-type") ?? "";
  if (!type.includes("application/json")) {
    throw new ValidationError(
      "Send a JSON body with content-type application/json",
      "body",
    );
  }
  const len = Number(c.req.header("content-length") ?? "0");
  if (len > MAX_ADMIN_BODY) {
    throw new ServiceError(
      413,
      "payload_too_large",
      "Body is too large (max 64 KiB)",
    );
  }
  const text = await c.req.text();
  if (text.length > MAX_ADMIN_BODY) {
    throw new ServiceError(
      413,
      "payload_too_large",
      "Body is too large (max 64 KiB)",
    );
  }
  let value: unknown;
  try {
    value = text === "" ? {} : JSON.parse(text);
  } catch {
    throw new ValidationError("Body is not valid JSON", "body");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ValidationError("Body must be a JSON object", "body");
  }
  return value as Record<string, unknown>;
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
