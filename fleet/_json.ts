/** Bounded JSON body reading for the fleet APIs (node-facing and admin). */
import type { Context } from "hono";
import { ServiceError, ValidationError } from "../store/errors.ts";

/** Reads a JSON object body of at most `max` bytes, or throws 400/413. */
export async function readJsonBody(
  c: Context,
  max: number,
): Promise<Record<string, unknown>> {
  const type = c.req.header("content-type") ?? "";
  if (!type.includes("application/json")) {
    throw new ValidationError(
      "Send a JSON body with content-type application/json",
      "body",
    );
  }
  const tooLarge = () =>
    new ServiceError(413, "payload_too_large", `Body is over ${max} bytes`);
  if (Number(c.req.header("content-length") ?? "0") > max) throw tooLarge();
  const body = c.req.raw.body;
  const chunks: Uint8Array[] = [];
  let size = 0;
  if (body) {
    for await (const chunk of body) {
      size += chunk.byteLength;
      if (size > max) throw tooLarge();
      chunks.push(chunk);
    }
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const ch of chunks) {
    bytes.set(ch, at);
    at += ch.byteLength;
  }
  let value: unknown;
  try {
    value = size === 0 ? {} : JSON.parse(new TextDecoder().decode(bytes));
  } catch {
    throw new ValidationError("Body is not valid JSON", "body");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ValidationError("Body must be a JSON object", "body");
  }
  return value as Record<string, unknown>;
}
