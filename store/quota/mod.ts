/**
 * Exact admission and settlement for limits and quotas (README.md tells
 * how, and draws a lease's lifecycle): the public API of store/quota/.
 */
export { Admitter, type AdmitterOptions } from "./admitter.ts";
export { CHECKPOINT_MS } from "./checkpoints.ts";
export { counterValue, seedCounter } from "./counters.ts";
export { Lease } from "./lease.ts";
export { type HardBudgets, limitPlan } from "./plan.ts";
export { countReservations, reclaimExpired, reclaimOwned } from "./reclaim.ts";
export { settle } from "./settlement.ts";
export { billedCost, worstCost } from "./spend.ts";
export { QUOTA_WARN_PERCENT, quotaStatus, type QuotaUse } from "./status.ts";
export {
  type Admission,
  type AdmissionRequest,
  type LimitPlan,
  QuotaUnavailableError,
  type QuotaView,
  type RequestPrice,
  type Reservation,
  type Rule,
  type RuleKind,
} from "./types.ts";
export { windowOf } from "./windows.ts";
