/**
 * The Messages fields that steer how an answer is made rather than what it
 * must be (`thinking`, `output_config`, `safeguards`, `metadata`): checked
 * as Anthropic checks them, then given their nearest meaning here; those
 * that have none on Orchard's nodes are listed in `ignored` (the
 * `x-orchard-ignored` response header). `thinking` and
 * `output_config.effort` become a chat `reasoning_effort` for models with a
 * reasoning control, and are reported only where the model has none. `output_config.format` is the
 * exception that decides the answer: it becomes an enforced
 * `response_format`.
 */
import { bad, isObj, refuse } from "./_anthropic_checks.ts";

/** `output_config.effort` values (Anthropic's, as of the effort beta). */
const EFFORTS = new Set(["low", "medium", "high", "xhigh", "max"]);

/** What a request's hints come to. */
export interface Hints {
  /** Request paths of hints accepted without effect here. */
  ignored: string[];
  /** `metadata.user_id`: the chat `user`. */
  user: string | null;
  /** Claude Code's session id from `metadata.user_id`: the chat `prompt_cache_key`. */
  session: string | null;
  /** `output_config.format` as a chat `response_format`. */
  format: Record<string, unknown> | null;
  /**
   * The chat `reasoning_effort` that `thinking` and `output_config.effort`
   * come to (null: neither was given): `thinking` disabled is `none`;
   * enabled or adaptive is the effort given, else `high` (Anthropic's
   * default); an effort without `thinking` is that effort. Sent only to a
   * model with a reasoning control (gateway/effort.ts).
   */
  effort: string | null;
  /** The paths to report in `x-orchard-ignored` when the model has no reasoning control. */
  effortPaths: string[];
  /** Thinking asked for (enabled or adaptive): how thinking blocks show it; null: no thinking blocks. */
  thinking: { display: "summarized" | "omitted" } | null;
}

/** Anthropic's `output_config.effort` as a chat `reasoning_effort` (`max` is the highest there is). */
const CHAT_EFFORT: Record<string, string> = {
  low: "low",
  medium: "medium",
  high: "high",
  xhigh: "xhigh",
  max: "xhigh",
};

/** Reads and checks the hint fields of a Messages body. */
export function readHints(
  body: Record<string, unknown>,
  maxTokens: number,
): Hints {
  const ignored: string[] = [];
  const effortPaths: string[] = [];
  const asked = thinking(body.thinking, maxTokens);
  if (asked) effortPaths.push("thinking");
  const config = outputConfig(body.output_config);
  if (config.effort) effortPaths.push("output_config.effort");
  if (safeguards(body.safeguards)) ignored.push("safeguards");
  const user = metadataUser(body.metadata) ?? null;
  const given = config.effort ? CHAT_EFFORT[config.effort]! : null;
  const disabled = isObj(body.thinking) && body.thinking.type === "disabled";
  return {
    ignored,
    user,
    session: user === null ? null : sessionOf(user),
    format: config.format,
    effort: disabled ? "none" : asked ? given ?? "high" : given,
    effortPaths,
    thinking: asked
      ? {
        display: (body.thinking as Record<string, unknown>).display ===
            "omitted"
          ? "omitted"
          : "summarized",
      }
      : null,
  };
}

/**
 * Checks `thinking`; returns whether it asks for reasoning (enabled or
 * adaptive). `display` says how thinking blocks show it: `omitted` leaves
 * their text empty (the signature stays); `summarized` and `updates` show
 * the model's reasoning as it is.
 */
function thinking(v: unknown, maxTokens: number): boolean {
  if (v === undefined || v === null) return false;
  if (!isObj(v)) throw bad("thinking", "must be an object");
  for (const k of Object.keys(v)) {
    if (!["type", "budget_tokens", "display"].includes(k)) {
      throw refuse(`thinking.${k}`, "is not a known field");
    }
  }
  const d = v.display;
  if (
    d !== undefined && d !== null &&
    !(typeof d === "string" && ["summarized", "omitted", "updates"].includes(d))
  ) {
    throw bad(
      "thinking.display",
      'must be "summarized", "omitted" or "updates"',
    );
  }
  if (v.type === "disabled") return false;
  if (v.type === "adaptive") return true;
  if (v.type !== "enabled") {
    throw bad("thinking.type", 'must be "enabled", "adaptive" or "disabled"');
  }
  const b = v.budget_tokens;
  if (!Number.isSafeInteger(b) || (b as number) < 1024) {
    throw bad("thinking.budget_tokens", "must be an integer ≥ 1024");
  }
  if ((b as number) >= maxTokens) {
    throw bad("thinking.budget_tokens", "must be less than max_tokens");
  }
  return true;
}

/** Reads `output_config`: the effort it sets, and the response format it asks for. */
function outputConfig(
  v: unknown,
): { effort: string | null; format: Record<string, unknown> | null } {
  if (v === undefined || v === null) return { effort: null, format: null };
  if (!isObj(v)) throw bad("output_config", "must be an object");
  for (const k of Object.keys(v)) {
    if (
      k !== "effort" && k !== "format" && v[k] !== undefined && v[k] !== null
    ) {
      throw refuse(`output_config.${k}`, "is not supported by this gateway");
    }
  }
  const e = v.effort;
  if (e !== undefined && e !== null && !EFFORTS.has(e as string)) {
    throw bad(
      "output_config.effort",
      `must be one of ${[...EFFORTS].join(", ")}`,
    );
  }
  const f = v.format;
  let format: Record<string, unknown> | null = null;
  if (f !== undefined && f !== null) {
    if (!isObj(f) || f.type !== "json_schema" || !isObj(f.schema)) {
      throw bad(
        "output_config.format",
        'must be {"type": "json_schema", "schema": {…}}',
      );
    }
    // Anthropic's structured outputs guarantee the schema: enforced exactly
    format = {
      type: "json_schema",
      json_schema: { name: "output", schema: f.schema, strict: true },
    };
  }
  return { effort: e === undefined || e === null ? null : e as string, format };
}

/** `safeguards`: an array of typed requests for server-side checks, none of which run here. */
function safeguards(v: unknown): boolean {
  if (v === undefined || v === null) return false;
  if (
    !Array.isArray(v) ||
    !v.every((s) => isObj(s) && typeof s.type === "string")
  ) {
    throw bad("safeguards", "must be an array of objects with a type");
  }
  return v.length > 0;
}

function metadataUser(v: unknown): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (!isObj(v)) throw bad("metadata", "must be an object");
  for (const k of Object.keys(v)) {
    if (k !== "user_id") throw refuse(`metadata.${k}`, "is not a known field");
  }
  if (v.user_id === undefined || v.user_id === null) return undefined;
  if (typeof v.user_id !== "string" || v.user_id.length > 256) {
    throw bad("metadata.user_id", "must be a string of at most 256 characters");
  }
  return v.user_id;
}

/** Claude Code's `user_id` is JSON with a `session_id`: one conversation's stable key. */
function sessionOf(user: string): string | null {
  if (!user.startsWith("{")) return null;
  try {
    const id = (JSON.parse(user) as Record<string, unknown>)?.session_id;
    return typeof id === "string" && id.length > 0 && id.length <= 128
      ? id
      : null;
  } catch {
    return null;
  }
}
