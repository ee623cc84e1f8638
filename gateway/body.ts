/**
 * Request bodies: the size cap is enforced while reading (never buffering
 * more than the cap), and JSON nesting is bounded before parsing.
 */
import { concat } from "../lib/bytes.ts";
import { OpenAIError } from "../lib/openai_errors.ts";

/** The deepest JSON nesting accepted. */
export const MAX_JSON_DEPTH = 64;

/** Reads a request body, failing with 413 as soon as it passes `maxBytes`. */
export async function readBody(
  req: Request,
  maxBytes: number,
): Promise<Uint8Array> {
  const declared = Number(req.headers.get("content-length") ?? "NaN");
  if (declared > maxBytes) throw tooLarge(maxBytes);
  if (!req.body) return new Uint8Array();
  if (Number.isSafeInteger(declared) && declared >= 0) {
    // The server frames the body by its content-length, so it cannot pass
    // it: read it in one go (one native read instead of a reader loop).
    try {
      return new Uint8Array(await req.arrayBuffer());
    } catch {
      throw unreadable();
    }
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
    if (e instanceof OpenAIError) throw e;
    throw unreadable();
  }
  return concat(chunks, size);
}

const unreadable = () =>
  new OpenAIError(400, "invalid_body", "Cannot read the request body");

function tooLarge(maxBytes: number): OpenAIError {
  return new OpenAIError(
    413,
    "request_too_large",
    `The request body is larger than the limit of ${maxBytes} bytes`,
  );
}

const decoder = new TextDecoder("utf-8", { fatal: true });

/** Parses a JSON object body; 400 for invalid UTF-8/JSON, non-objects or nesting past MAX_JSON_DEPTH. */
export function parseJsonObject(bytes: Uint8Array): Record<string, unknown> {
  let text: string;
  try {
    text = decoder.decode(bytes);
  } catch {
    throw invalid("The request body is not valid UTF-8");
  }
  if (jsonDepth(text) > MAX_JSON_DEPTH) {
    throw invalid(
      `The request body nests deeper than ${MAX_JSON_DEPTH} levels`,
    );
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw invalid(
      "We could not parse the JSON body of your request. The OpenAI API expects a JSON payload",
    );
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw invalid("The request body must be a JSON object");
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

function invalid(message: string): OpenAIError {
  return new OpenAIError(400, "invalid_json", message);
}
