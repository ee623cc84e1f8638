/**
 * Quota counters that start from what was used: when a tokens/day or
 * tokens/month limit or a hard budget is set in the middle of its window,
 * its counter (store/quota) is raised to the window's usage so far, as
 * the usage rollups have it (a few seconds behind; requests in flight
 * are in the counter already). Without this a cap set mid-month would
 * count from zero and could be exceeded by what was used before it.
 */
import { type Budget } from "./budgets.ts";
import type { Limits } from "./limits.ts";
import { getPricing } from "./pricing.ts";
import {
  QuotaUnavailableError,
  seedCounter as raiseCounter,
  windowOf,
} from "./quota/mod.ts";
import { ConflictError } from "./errors.ts";
import { monthSpend } from "./spend.ts";
import type { Store } from "./store.ts";
import { usageTotals } from "./usage.ts";
import { monthOf } from "./usage_month.ts";

const DAY = 86_400_000;

/**
 * Raises a counter (quota/counters.ts seedCounter); a counter that kept
 * changing is a 409 that says the change was saved and to save it again
 * (the raise is idempotent), never a 500.
 */
async function seedCounter(
  store: Store,
  subject: string,
  window: string,
  value: number,
  now: number,
): Promise<void> {
  try {
    await raiseCounter(store, subject, window, value, now);
  } catch (e) {
    if (!(e instanceof QuotaUnavailableError)) throw e;
    throw new ConflictError(
      "Saved, but its counter could not start from this period's usage while requests kept changing it; save it again",
    );
  }
}

/** Tokens a tenant (or one of its keys) used in the window of `kind` containing `now`. */
export async function tokensUsedIn(
  store: Store,
  tenantId: string,
  keyId: string | null,
  kind: "day" | "month",
  now = Date.now(),
): Promise<number> {
  const d = new Date(now);
  const from = kind === "day"
    ? now - (now % DAY)
    : Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
  const t = await usageTotals(store, {
    tenantId,
    ...(keyId ? { keyId } : {}),
    granularity: kind === "day" ? "hour" : "day",
    from,
    to: now,
  });
  return t.promptTokens + t.completionTokens;
}

/** Starts the day and month counters of `limits` (those set) from their windows' usage. */
export async function seedLimitCounters(
  store: Store,
  tenantId: string,
  keyId: string | null,
  limits: Limits | null,
  now = Date.now(),
): Promise<void> {
  const subject = keyId ? `k:${keyId}` : `t:${tenantId}`;
  const kinds = [
    ...(limits?.tokensPerDay != null ? ["day" as const] : []),
    ...(limits?.tokensPerMonth != null ? ["month" as const] : []),
  ];
  await Promise.all(kinds.map(async (kind) => {
    const used = await tokensUsedIn(store, tenantId, keyId, kind, now);
    await seedCounter(store, subject, windowOf(kind, now)[0], used, now);
  }));
}

/**
 * Starts a hard budget's counter from its month's usage: tokens (the
 * month's token counter, which a tokens/month limit shares), or money
 * (what the month's statement bills so far).
 */
export async function seedBudgetCounter(
  store: Store,
  b: Budget,
  now = Date.now(),
): Promise<void> {
  if (!b.hard) return;
  const subject = b.keyId ? `k:${b.keyId}` : `t:${b.tenantId}`;
  if (b.unit === "tokens") {
    const used = await tokensUsedIn(store, b.tenantId, b.keyId, "month", now);
    await seedCounter(store, subject, windowOf("month", now)[0], used, now);
    return;
  }
  const spend = await monthSpend(
    store,
    b.tenantId,
    monthOf(now),
    await getPricing(store),
    b.keyId !== null,
  );
  const use = b.keyId ? spend.keys.get(b.keyId) : spend.tenant;
  if (use) {
    await seedCounter(
      store,
      subject,
      windowOf("spend", now)[0],
      use.money,
      now,
    );
  }
}
