/**
 * Request bodies read as JSON objects, the one implementation for every
 * API (the gateway's `/v1/*`, the node's, the admin and fleet APIs): never
 * more than `maxBytes` is read (a larger declared Content-Length is refused
 * before reading, a body without one as soon as it passes the cap), then
 * the bytes are decoded as strict UTF-8, optionally checked for nesting
 * depth, and parsed. Failures are `JsonBodyError`s naming the problem;
 * each API maps them to its own error shape, status and message.
 */
import { concat } from "./bytes.ts";

/** What was wrong with a body. */
export type JsonBodyProblem =
  /** The content-type is not application/json (checked only when required). */
  | "not_json_type"
  /** Larger than the cap (declared or streamed). */
  | "too_large"
  /** The body stream failed (the client went away, a broken connection). */
  | "unreadable"
  /** Not valid UTF-8. */
  | "not_utf8"
  /** Nested deeper than `maxDepth`. */
  | "too_deep"
  /** Not JSON (an empty body too, unless `emptyIsObject`). */
  | "not_json"
  /** JSON, but not an object. */
  | "not_object";

/** Why a body could not be read as a JSON object. */
export class JsonBodyError extends Error {
  readonly problem: JsonBodyProblem;
  /** The cap that applied (bytes for "too_large", levels for "too_deep"). */
  readonly limit: number | null;
  constructor(
    problem: JsonBodyProblem,
    message: string,
    limit: number | null = null,
  ) {
    super(message);
    this.name = "JsonBodyError";
    this.problem = problem;
    this.limit = limit;
  }
}

/** How to read a body. */
export interface JsonBodyOptions {
  /** Largest body accepted, in bytes. */
  maxBytes: number;
  /** Deepest bracket nesting accepted (default: no limit). */
  maxDepth?: number;
  /** Reads an empty body as `{}` (default: it is "not_json"). */
  emptyIsObject?: boolean;
  /** Refuses a content-type other than application/json (default: any). */
  requireJsonType?: boolean;
}

/** Reads `req`'s JSON object body within the options' caps, or throws `JsonBodyError`. */
export async function readJsonObject(
  req: Request,
  opts: JsonBodyOptions,
): Promise<Record<string, unknown>> {
  if (
    opts.requireJsonType &&
    !(req.headers.get("content-type") ?? "").includes("application/json")
  ) {
    throw new JsonBodyError(
      "not_json_type",
      "The content-type is not application/json",
    );
  }
  return parseJsonObject(await readBodyBytes(req, opts.maxBytes), opts);
}

/** Reads a whole body of at most `maxBytes`, refusing a larger one as early as it shows. */
export async function readBodyBytes(
  req: Request,
  maxBytes: number,
): Promise<Uint8Array> {
  const declared = Number(req.headers.get("content-length") ?? "NaN");
  if (declared > maxBytes) throw tooLarge(maxBytes);
  if (!req.body) return new Uint8Array();
  if (Number.isSafeInteger(declared) && declared >= 0) {
    // The server frames the body by its content-length, so it cannot pass
    // it: read it in one go (one native read instead of a reader loop).
    let bytes: Uint8Array;
    try {
      bytes = new Uint8Array(await req.arrayBuffer());
    } catch {
      throw unreadable();
    }
    // (A Request built in-process is not framed: its header may lie.)
    if (bytes.byteLength > maxBytes) throw tooLarge(maxBytes);
    return bytes;
  }
  const reader = req.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      size += value.byteLength;
      if (size > maxBytes) {
        reader.cancel().catch(() => {});
        throw tooLarge(maxBytes);
      }
      chunks.push(value);
    }
  } catch (e) {
    if (e instanceof JsonBodyError) throw e;
    throw unreadable();
  }
  return concat(chunks, size);
}

const decoder = new TextDecoder("utf-8", { fatal: true });

/** Parses bytes as a JSON object, checking UTF-8, then nesting, then syntax, then the type. */
export function parseJsonObject(
  bytes: Uint8Array,
  opts: Pick<JsonBodyOptions, "maxDepth" | "emptyIsObject"> = {},
): Record<string, unknown> {
  if (bytes.byteLength === 0 && opts.emptyIsObject) return {};
  let text: string;
  try {
    text = decoder.decode(bytes);
  } catch {
    throw new JsonBodyError("not_utf8", "The body is not valid UTF-8");
  }
  const max = opts.maxDepth;
  if (max !== undefined && jsonDepth(text) > max) {
    throw new JsonBodyError(
      "too_deep",
      `The body nests deeper than ${max} levels`,
      max,
    );
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new JsonBodyError("not_json", "The body is not valid JSON");
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new JsonBodyError("not_object", "The body is not a JSON object");
  }
  return value as Record<string, unknown>;
}

/** The maximum bracket nesting of a JSON text (strings skipped). */
export function jsonDepth(text: string): number {
  let depth = 0;
  let max = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34) {
      // A string: jump to its closing quote (one not escaped by an odd run
      // of backslashes) with a native search. Prompts are nearly all string
      // text, so this is ~4× faster than looking at every character.
      for (;;) {
        const end = text.indexOf('"', i + 1);
        if (end < 0) return max; // unterminated: JSON.parse rejects it
        let slashes = 0;
        while (text.charCodeAt(end - 1 - slashes) === 92) slashes++;
        i = end;
        if (slashes % 2 === 0) break;
      }
    } else if (c === 123 || c === 91) {
      if (++depth > max) max = depth;
    } else if (c === 125 || c === 93) depth--;
  }
  return max;
}

function tooLarge(maxBytes: number): JsonBodyError {
  return new JsonBodyError(
    "too_large",
    `The body is larger than ${maxBytes} bytes`,
    maxBytes,
  );
}

function unreadable(): JsonBodyError {
  return new JsonBodyError("unreadable", "The body could not be read");
}
