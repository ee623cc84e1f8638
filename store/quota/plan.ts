/** Limit plans: the rules of a (tenant, key), and what admission derives from them. */
import type { Limits } from "../limits.ts";
import type { LimitPlan, Rule } from "./types.ts";

/**
 * A subject's hard budgets for the month (store/budgets.ts): tokens, and
 * money in micro-units; null when it has none.
 */
export interface HardBudgets {
  tokens: number | null;
  money: number | null;
}

/**
 * Builds the rules of a (tenant, key) from their limits and hard budgets;
 * nulls are skipped. A token budget is the month's token quota when it is
 * the tighter of the two; a money budget is a `spend` rule.
 */
export function limitPlan(
  tenantId: string,
  keyId: string,
  tenant: Limits,
  key: Limits | null,
  budgets: { tenant?: HardBudgets; key?: HardBudgets } = {},
): LimitPlan {
  const rules: Rule[] = [];
  const add = (subject: string, l: Limits | null, b?: HardBudgets) => {
    if (l?.rpm != null) rules.push({ subject, kind: "rpm", limit: l.rpm });
    if (l?.tpm != null) rules.push({ subject, kind: "tpm", limit: l.tpm });
    if (l?.concurrency != null) {
      rules.push({ subject, kind: "concurrency", limit: l.concurrency });
    }
    if (l?.tokensPerDay != null) {
      rules.push({ subject, kind: "day", limit: l.tokensPerDay });
    }
    const month = l?.tokensPerMonth ?? null;
    const budget = b?.tokens ?? null;
    if (budget !== null && (month === null || budget <= month)) {
      rules.push({ subject, kind: "month", limit: budget, budget: true });
    } else if (month !== null) {
      rules.push({ subject, kind: "month", limit: month });
    }
    if (b?.money != null) {
      rules.push({ subject, kind: "spend", limit: b.money, budget: true });
    }
  };
  add(`t:${tenantId}`, tenant, budgets.tenant);
  add(`k:${keyId}`, key, budgets.key);
  return { tenantId, keyId, rules };
}

/** What admission derives from a plan, memoized per plan object. */
interface PlanInfo {
  /** `tenant\0key`: its lease's key. */
  key: string;
  /** Its limits as one string (leases end when they change). */
  signature: string;
  /** `subject\0kind` of each rule: the counters a commit checks. */
  counters: string[];
}
const planInfos = new WeakMap<LimitPlan, PlanInfo>();

/** What admission derives from `p` (computed once per plan object). */
export function planInfo(p: LimitPlan): PlanInfo {
  let info = planInfos.get(p);
  if (info === undefined) {
    info = {
      key: `${p.tenantId}\u0000${p.keyId}`,
      signature: p.rules.map((r) =>
        `${r.subject}:${r.kind}:${r.limit}${r.budget ? "b" : ""}`
      ).join(","),
      counters: p.rules.map((r) => `${r.subject}\u0000${r.kind}`),
    };
    planInfos.set(p, info);
  }
  return info;
}

/** `tenant\0key`: the key of a plan's lease. */
export const planKey = (p: LimitPlan) => planInfo(p).key;
/** A plan's limits as one string (a lease ends when they change). */
export const signature = (p: LimitPlan) => planInfo(p).signature;
