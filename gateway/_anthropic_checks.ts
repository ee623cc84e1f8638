/**
 * Checks shared by the Anthropic request translation
 * (gateway/anthropic_request.ts, gateway/anthropic_tools.ts): errors naming
 * the field's path, `cache_control`, text blocks and tool names.
 */
import { OpenAIError, unsupportedParam } from "../protocol/openai/errors.ts";
import { NAME_PATTERN } from "../protocol/openai/output_controls.ts";

export const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);

export function bad(param: string, message: string): OpenAIError {
  return new OpenAIError(400, "invalid_value", `${param}: ${message}`, {
    param,
  });
}

export function refuse(param: string, why: string): OpenAIError {
  return unsupportedParam(param, `${param}: ${why}`);
}

/** `cache_control` is a prompt-caching hint: the llama engine caches prefixes on its own. */
export function cacheControl(v: unknown, at: string): void {
  if (v === undefined || v === null) return;
  if (!isObj(v) || v.type !== "ephemeral") {
    throw bad(`${at}.cache_control`, 'must be {"type": "ephemeral"}');
  }
}

/**
 * A block array or string of text blocks, as text (system, tool results).
 * `other` reads the blocks of other types it knows (their text, "" for
 * none), returning null for those it does not.
 */
export function textOf(
  content: unknown,
  at: string,
  other?: (b: Record<string, unknown>, at: string) => string | null,
): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) {
    throw bad(at, "must be a string or an array of text blocks");
  }
  return content.map((b, k) => {
    const known = isObj(b) && b.type !== "text" && other
      ? other(b, `${at}.${k}`)
      : null;
    if (known !== null) return known;
    if (!isObj(b) || b.type !== "text" || typeof b.text !== "string") {
      const type = isObj(b) ? String(b.type).slice(0, 40) : typeof b;
      throw refuse(
        `${at}.${k}`,
        `only text blocks are supported here, not ${type}`,
      );
    }
    cacheControl(b.cache_control, `${at}.${k}`);
    return b.text;
  }).join("");
}

export function toolName(v: unknown, at: string): string {
  if (typeof v !== "string" || !NAME_PATTERN.test(v)) {
    throw bad(at, `must match ${NAME_PATTERN.source}`);
  }
  return v;
}
