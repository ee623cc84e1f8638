/**
 * Usage reports as the portal and the admin API show them: the query is
 * validated (range, granularity, subject), the caller's tenant enforced
 * (a tenant's admins and viewers see only their tenant; another tenant
 * answers 404), and totals plus series are read from rollups only.
 */
import { z } from "zod";
import { ValidationError } from "./errors.ts";
import { isPlatform, type Principal } from "./principal.ts";
import { parse } from "./schemas.ts";
import type { Store } from "./store.ts";
import { rangeSpend, type Spend } from "./spend.ts";
import { getTenant } from "./tenants.ts";
import {
  type UsagePoint,
  usageSeries,
  type UsageTotals,
  usageTotalsOf,
} from "./usage.ts";

/** A validated usage query. */
export interface UsageReportQuery {
  tenantId: string | null;
  keyId: string | null;
  model: string | null;
  granularity: "hour" | "day";
  from: number;
  to: number;
}

/** Totals and series of one query. */
export interface UsageReport {
  query: {
    tenantId: string | null;
    keyId: string | null;
    model: string | null;
    granularity: "hour" | "day";
    from: string;
    to: string;
  };
  totals: UsageTotals;
  series: UsagePoint[];
  /**
   * What the range cost, per model and per key (a tenant's), priced like
   * statements (store/spend.ts).
   */
  spend: Spend;
}

const HOUR = 3_600_000;
const DAY = 86_400_000;
/** Largest range: 400 days (day points) or 62 days (hour points). */
const MAX_SPAN = { hour: 62 * DAY, day: 400 * DAY };

const time = z.string().trim().max(40).refine(
  (v) => !Number.isNaN(Date.parse(v)),
  "must be a date (YYYY-MM-DD) or an ISO 8601 date-time",
);

const querySchema = z.object({
  tenant: z.string().trim().max(64).optional(),
  key: z.string().trim().max(64).optional(),
  model: z.string().trim().max(200).optional(),
  granularity: z.enum(["hour", "day"], {
    error: "must be hour or day",
  }).optional(),
  from: time.optional(),
  to: time.optional(),
});

/**
 * Parses query-string parameters (`tenant`, `key`, `model`, `granularity`,
 * `from`, `to`); defaults: the last 24 hours by hour, or the last 30 days
 * by day. A date without a time in `to` includes that whole day.
 */
export function parseUsageQuery(
  params: Record<string, string | undefined>,
  now = Date.now(),
): UsageReportQuery {
  const clean = Object.fromEntries(
    Object.entries(params).filter(([, v]) => v !== undefined && v !== ""),
  );
  const q = parse(querySchema, clean);
  const granularity = q.granularity ?? "hour";
  const dateOnly = (v: string) => /^\d{4}-\d{2}-\d{2}$/.test(v);
  let to = q.to ? Date.parse(q.to) + (dateOnly(q.to) ? DAY - 1 : 0) : now;
  const from = q.from
    ? Date.parse(q.from)
    : to - (granularity === "hour" ? 24 * HOUR : 30 * DAY) + 1;
  if (to > now + DAY) to = now + DAY;
  if (from > to) {
    throw new ValidationError("from: must be before to", "from");
  }
  if (to - from > MAX_SPAN[granularity]) {
    throw new ValidationError(
      granularity === "hour"
        ? "to: an hourly range can span at most 62 days; use granularity=day"
        : "to: a daily range can span at most 400 days",
      "to",
    );
  }
  if (q.key && !q.tenant) {
    throw new ValidationError("key: give the tenant too", "key");
  }
  return {
    tenantId: q.tenant ?? null,
    keyId: q.key ?? null,
    model: q.model ?? null,
    granularity,
    from,
    to,
  };
}

/**
 * Runs a usage query for `p`. Tenant principals are confined to their own
 * tenant (their query defaults to it); a tenant they cannot see is 404.
 * Without a tenant, a platform admin gets the whole cluster (or a model).
 */
export async function usageReport(
  store: Store,
  p: Principal,
  q: UsageReportQuery,
): Promise<UsageReport> {
  const tenantId = q.tenantId ?? (isPlatform(p) ? null : p.tenantId);
  if (tenantId) await getTenant(store, p, tenantId);
  const [series, spend] = await Promise.all([
    usageSeries(store, {
      tenantId: tenantId ?? undefined,
      keyId: q.keyId ?? undefined,
      model: q.model ?? undefined,
      granularity: q.granularity,
      from: q.from,
      to: q.to,
    }),
    rangeSpend(store, { ...q, tenantId }),
  ]);
  return {
    query: {
      tenantId,
      keyId: q.keyId,
      model: q.model,
      granularity: q.granularity,
      from: new Date(q.from).toISOString(),
      to: new Date(q.to).toISOString(),
    },
    totals: usageTotalsOf(series),
    series,
    spend,
  };
}
