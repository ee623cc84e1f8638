/** `x-ratelimit-*` headers and the 429 errors built from an admission. */
import { OpenAIError } from "../lib/openai_errors.ts";
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

/** The 429 for a refused admission: a rate (retry later) or an exhausted quota (`x-should-retry: false`). */
export function rejectionError(
  a: Admission & { ok: false },
  headers: Record<string, string>,
): OpenAIError {
  const who = a.rule.subject.startsWith("k:")
    ? "this API key"
    : "your organization";
  const retryAfter = String(Math.max(1, Math.ceil(a.retryAfterMs / 1000)));
  const msg = a.rule.budget
    ? `Budget reached for ${who}: the monthly ${
      a.rule.kind === "spend"
        ? `spend budget of ${formatMoney(a.rule.limit)}`
        : `token budget of ${a.rule.limit} tokens`
    } is used up.`
    : `Limit reached for ${who}: ${WHAT[a.rule.kind]} (limit ${a.rule.limit}).`;
  if (a.reason === "quota") {
    return new OpenAIError(
      429,
      "insufficient_quota",
      `${msg} The ${a.rule.budget ? "budget" : "quota"} resets in ${
        formatReset(a.retryAfterMs)
      }.`,
      {
        type: "insufficient_quota",
        headers: {
          ...headers,
          "retry-after": retryAfter,
          "x-should-retry": "false",
        },
      },
    );
  }
  return new OpenAIError(
    429,
    "rate_limit_exceeded",
    `${msg} Retry in ${formatReset(a.retryAfterMs)}.`,
    {
      type: "rate_limit_error",
      headers: { ...headers, "retry-after": retryAfter },
    },
  );
}
