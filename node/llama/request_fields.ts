/**
 * Which request fields the llama engine honours: the API's field table
 * (protocol/openai/request_fields.ts, shared with the gateway) less the fields
 * this engine cannot do. A field it cannot honour is refused with 400
 * `unsupported_parameter` naming it, never accepted and ignored; that holds
 * for calls straight to the node too, which skip the gateway's checks.
 * `reasoning_effort` depends on the model (its template's reasoning
 * control): the engine checks it once the model is known.
 */
import {
  CHAT_FIELDS,
  COMPLETION_FIELDS,
  EMBEDDING_FIELDS,
  type FieldRule,
} from "../../protocol/openai/request_fields.ts";
import { OpenAIError } from "../../protocol/openai/errors.ts";
import type { OpenAIBody } from "../engine.ts";

/** The endpoints whose bodies the engine reads. */
export type Endpoint = "chat" | "completions" | "embeddings";

const TABLES: Record<Endpoint, Readonly<Record<string, FieldRule>>> = {
  chat: CHAT_FIELDS,
  completions: COMPLETION_FIELDS,
  embeddings: EMBEDDING_FIELDS,
};

/** Fields the API has but this engine honours only with some values (`ok`), and why. */
const LLAMA_LIMITS: Record<
  string,
  { ok: (v: unknown) => boolean; why: string }
> = {
  logit_bias: {
    ok: () => false,
    why: "its token ids are another tokenizer's; this engine applies no bias",
  },
  echo: { ok: (v) => v === false, why: "this engine does not echo the prompt" },
  suffix: {
    ok: (v) => v === "",
    why: "this engine does not fill in the middle",
  },
  dimensions: {
    ok: () => false,
    why: "this engine returns the model's full embedding size",
  },
};

function refuse(key: string, why: string): never {
  throw new OpenAIError(
    400,
    "unsupported_parameter",
    `Unsupported parameter: '${key}' (${why}).`,
    { param: key },
  );
}

/** Throws 400 `unsupported_parameter` for the first field the engine cannot honour. */
export function refuseUnsupported(body: OpenAIBody, endpoint: Endpoint) {
  const table = TABLES[endpoint];
  for (const [key, value] of Object.entries(body)) {
    if (value === undefined || value === null) continue;
    const rule = table[key];
    if (!rule) refuse(key, "it is not a field of this endpoint");
    if (rule.use === "refused") refuse(key, rule.why ?? "not supported");
    if (rule.use === "default_only" && !rule.isDefault?.(value)) {
      refuse(key, rule.why ?? "only its default value is supported");
    }
    const limit = LLAMA_LIMITS[key];
    if (limit && !limit.ok(value)) refuse(key, limit.why);
  }
}
