/**
 * Audit entries as the admin API and the tenant export give them: the
 * money in a pricing or budget change's `before` and `after` as decimal
 * strings in major units, like every other money field on the wire
 * (store/money.ts). The stored entries keep what the store keeps
 * (integer micro-units), so old and new entries read the same.
 */
import type { AuditEntry } from "./audit.ts";
import { type Budget, budgetJson } from "./budgets.ts";
import { type Pricing, pricingJson } from "./pricing.ts";

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);

function pricingSide(v: unknown): unknown {
  if (!isObject(v) || !Array.isArray(v.models) || !isObject(v.cluster)) {
    return v;
  }
  const { updatedAt, updatedBy, ...json } = pricingJson(
    v as unknown as Pricing,
  );
  return "updatedAt" in v ? { ...json, updatedAt, updatedBy } : json;
}

function budgetSide(v: unknown, currency: string): unknown {
  if (!isObject(v) || v.unit !== "money" || typeof v.amount !== "number") {
    return v;
  }
  return budgetJson(v as unknown as Budget, currency);
}

/** `e` with the money in its before and after written as the admin API writes money. */
export function auditJson(e: AuditEntry, currency: string): AuditEntry {
  if (e.action === "pricing.set") {
    return { ...e, before: pricingSide(e.before), after: pricingSide(e.after) };
  }
  if (e.action === "budget.set" || e.action === "budget.delete") {
    return {
      ...e,
      before: budgetSide(e.before, currency),
      after: budgetSide(e.after, currency),
    };
  }
  return e;
}
