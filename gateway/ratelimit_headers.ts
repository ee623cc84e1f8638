/** `x-ratelimit-*` headers and the 429 errors built from an admission. */
import { OpenAIError } from "../protocol/openai/errors.ts";
import { formatMoney } from "../store/money.ts";
import type { Admission, QuotaView } from "../store/quota/mod.ts";

/** Formats a duration like OpenAI's reset headers: `20ms`, `6s`, `1m30s`, `3h2m0s`. */
export function formatReset(ms: number): string {
  if (ms < 1000) return `${Math.max(0, Math.ceil(ms))}ms`;
  let s = Math.ceil(ms / 1000);
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  if (h > 0) return `${h}h${m}m${s}s`;
  if (m > 0) return `${m}m${s}s`;
  return `${s}s`;
}

/** The rate-limit headers of the tightest request and token windows. */
export function quotaHeaders(view: QuotaView): Record<string, string> {
  const h: Record<string, string> = {};
  if (view.requests) {
    h["x-ratelimit-limit-requests"] = String(view.requests.limit);
    h["x-ratelimit-remaining-requests"] = String(view.requests.remaining);
    h["x-ratelimit-reset-requests"] = formatReset(view.requests.resetMs);
  }
  if (view.tokens) {
    h["x-ratelimit-limit-tokens"] = String(view.tokens.limit);
    h["x-ratelimit-remaining-tokens"] = String(view.tokens.remaining);
    h["x-ratelimit-reset-tokens"] = formatReset(view.tokens.resetMs);
  }
  return h;
}

const WHAT: Record<string, string> = {
  rpm: "requests per minute",
  tpm: "tokens per minute",
  concurrency: "concurrent requests",
  day: "tokens per day",
  month: "tokens per month",
  spend: "spend per month",
};

/** OpenAI's names of token limits in "Request too large" errors. */
const OPENAI_NAME: Record<string, string> = {
  tpm: "tokens per min (TPM)",
  day: "tokens per day (TPD)",
  month: "tokens per month",
};

/** How a refusal is answered beyond the admission itself. */
export interface RejectionContext {
  /**
   * Refused only for what requests in flight hold: the window's settled
   * use leaves room for this request (gateway/settled_use.ts), so it is
   * a retryable rate limit, not quota used up.
   */
  held?: boolean;
  /** The model asked for, named in "Request too large" errors. */
  model?: string;
  /** The currency of spend budgets (the pricing's). */
  currency?: string | null;
}

/** Roughly how long requests in flight take to settle: the retry-after of a refusal they cause. */
export const HELD_RETRY_MS = 2000;

/**
 * The 429 for a refused admission:
 * - a rate (rpm, tpm, concurrency), or a quota only held by requests in
 *   flight: `rate_limit_exceeded` with `retry-after` (seconds);
 * - a quota really spent: `insufficient_quota`, `x-should-retry: false`
 *   and when it resets, saying what is left and what the request needs;
 * - a request larger than the limit itself (it never fits): as OpenAI's
 *   "Request too large …", `x-should-retry: false`, no `retry-after`.
 */
export function rejectionError(
  a: Admission & { ok: false },
  headers: Record<string, string>,
  rc: RejectionContext = {},
): OpenAIError {
  const r = a.rule;
  const who = r.subject.startsWith("k:") ? "this API key" : "your organization";
  const money = r.kind === "spend";
  const amount = (v: number) =>
    money
      ? `${formatMoney(v, v % 10_000 === 0 ? 2 : 4)}${
        rc.currency ? ` ${rc.currency}` : ""
      }`
      : `${Math.round(v).toLocaleString("en-US")} tokens`;
  const what = r.budget
    ? `the monthly ${money ? "spend" : "token"} budget of ${amount(r.limit)}`
    : `${WHAT[r.kind]} (limit ${r.limit})`;
  const needs = a.needed === undefined
    ? ""
    : `${
      a.remaining === undefined ? "" : `${amount(a.remaining)} left`
    }; this request needs up to ${amount(a.needed)}${
      money ? " (its prompt and max_tokens at the model's prices)" : ""
    }`;
  const noRetry: Record<string, string> = {
    ...headers,
    "x-should-retry": "false",
  };

  if (a.reason === "too_large") {
    const msg = r.budget
      ? `Request too large for ${who}'s ${what.replace(/^the /, "")}: Limit ${
        amount(r.limit)
      }, Requested ${
        amount(a.needed ?? 0)
      }. Reduce the prompt or max_tokens, or raise the budget.`
      : `Request too large for ${rc.model || "this model"} for ${who} on ${
        OPENAI_NAME[r.kind] ?? WHAT[r.kind]
      }: Limit ${r.limit}, Requested ${
        a.needed ?? 0
      }. The input or output tokens must be reduced in order to run successfully.`;
    return new OpenAIError(429, "rate_limit_exceeded", msg, {
      type: "rate_limit_error",
      headers: noRetry,
    });
  }
  if (a.reason === "quota" && !rc.held) {
    const state = a.remaining === undefined || a.remaining <= 0
      ? `is used up${
        a.needed === undefined
          ? ""
          : ` (this request needs up to ${amount(a.needed)})`
      }`
      : `has ${needs}`;
    return new OpenAIError(
      429,
      "insufficient_quota",
      `${
        r.budget ? "Budget" : "Limit"
      } reached for ${who}: ${what} ${state}. The ${
        r.budget ? "budget" : "quota"
      } resets in ${formatReset(a.retryAfterMs)}.`,
      {
        type: "insufficient_quota",
        headers: {
          ...noRetry,
          "retry-after": String(Math.max(1, Math.ceil(a.retryAfterMs / 1000))),
        },
      },
    );
  }
  const retryMs = a.reason === "quota" ? HELD_RETRY_MS : a.retryAfterMs;
  const msg = a.reason === "quota"
    ? `Busy: ${what} for ${who} is held by requests in flight (${needs}). Retry in ${
      formatReset(retryMs)
    }, once they finish.`
    : `Limit reached for ${who}: ${what}. Retry in ${formatReset(retryMs)}.`;
  return new OpenAIError(429, "rate_limit_exceeded", msg, {
    type: "rate_limit_error",
    headers: {
      ...headers,
      "retry-after": String(Math.max(1, Math.ceil(retryMs / 1000))),
    },
  });
}
