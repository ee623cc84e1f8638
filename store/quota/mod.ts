/**
 * Exact admission and settlement for limits and quotas (README.md tells
 * how, and draws a lease's lifecycle): the public API of store/quota/.
 */
export { Admitter, type AdmitterOptions } from "./admitter.ts";
export { CHECKPOINT_MS } from "./checkpoints.ts";
export { counterValue } from "./counters.ts";
export { Lease } from "./lease.ts";
export { limitPlan } from "./plan.ts";
export { countReservations, reclaimExpired, reclaimOwned } from "./reclaim.ts";
export { settle } from "./settlement.ts";
export { QUOTA_WARN_PERCENT, quotaStatus, type QuotaUse } from "./status.ts";
export {
  type Admission,
  type AdmissionRequest,
  type LimitPlan,
  QuotaUnavailableError,
  type QuotaView,
  type Reservation,
  type Rule,
  type RuleKind,
} from "./types.ts";
export { windowOf } from "./windows.ts";
