/** Limit plans: the rules of a (tenant, key), and what admission derives from them. */
import type { Limits } from "../limits.ts";
import type { LimitPlan, Rule } from "./types.ts";

/** Builds the rules of a (tenant, key) from their limits; nulls are skipped. */
export function limitPlan(
  tenantId: string,
  keyId: string,
  tenant: Limits,
  key: Limits | null,
): LimitPlan {
  const rules: Rule[] = [];
  const add = (subject: string, l: Limits) => {
    if (l.rpm !== null) rules.push({ subject, kind: "rpm", limit: l.rpm });
    if (l.tpm !== null) rules.push({ subject, kind: "tpm", limit: l.tpm });
    if (l.concurrency !== null) {
      rules.push({ subject, kind: "concurrency", limit: l.concurrency });
    }
    if (l.tokensPerDay !== null) {
      rules.push({ subject, kind: "day", limit: l.tokensPerDay });
    }
    if (l.tokensPerMonth !== null) {
      rules.push({ subject, kind: "month", limit: l.tokensPerMonth });
    }
  };
  add(`t:${tenantId}`, tenant);
  if (key) add(`k:${keyId}`, key);
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
      signature: p.rules.map((r) => `${r.subject}:${r.kind}:${r.limit}`)
        .join(","),
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
