/** Quota status at a glance: each tenant limit with its current use. */
import { getTenantLimits, LIMIT_FIELDS, type Limits } from "../limits.ts";
import type { Principal } from "../principal.ts";
import type { Store } from "../store.ts";
import { counterValue } from "./counters.ts";
import type { RuleKind } from "./types.ts";
import { windowOf } from "./windows.ts";

/** One limit and how much of it is used in the current window. */
export interface QuotaUse {
  field: keyof Limits;
  /** The window's kind (`rpm`, `tpm`, `concurrency`, `day`, `month`). */
  kind: RuleKind;
  limit: number | null;
  used: number;
  /** used / limit in percent (null when unlimited). */
  percent: number | null;
  /** When the window ends (ISO), null for concurrency. */
  resetsAt: string | null;
}

const KIND: Record<keyof Limits, RuleKind> = {
  rpm: "rpm",
  tpm: "tpm",
  concurrency: "concurrency",
  tokensPerDay: "day",
  tokensPerMonth: "month",
};

/** Percent at and above which a limit is shown as nearly exhausted. */
export const QUOTA_WARN_PERCENT = 80;

/** The tenant's limits with current use (reservations in flight count as used). */
export async function quotaStatus(
  store: Store,
  p: Principal,
  tenantId: string,
  now = Date.now(),
): Promise<QuotaUse[]> {
  const limits = await getTenantLimits(store, p, tenantId);
  return await Promise.all(LIMIT_FIELDS.map(async (field) => {
    const kind = KIND[field];
    const [window, end] = windowOf(kind, now);
    const used = Math.max(
      0,
      await counterValue(store, `t:${tenantId}`, window),
    );
    const limit = limits[field];
    return {
      field,
      kind,
      limit,
      used,
      percent: limit === null
        ? null
        : limit === 0
        ? 100
        : Math.round((used / limit) * 1000) / 10,
      resetsAt: kind === "concurrency" ? null : new Date(end).toISOString(),
    };
  }));
}
