/** Deciding one request against the counters of an admission commit. */
import { newIdAt } from "../ids.ts";
import { k } from "../kv_keys.ts";
import { type Counter, used, viewOf } from "./counters.ts";
import type {
  Admission,
  AdmissionRequest,
  StoredReservation,
} from "./types.ts";
import { DAY, isTokenRule } from "./windows.ts";

/** What a decision needs of its admitter. */
export interface Decider {
  /** The gateway instance recorded as each reservation's owner. */
  owner: string | undefined;
  /** How long until stopped gateways' holds are reclaimed (a concurrency refusal's retry-after). */
  reclaimDueMs: () => number;
}

/**
 * Decides one request against the running counters (`cs`, one per rule of
 * its plan, in order), adding what it takes to them and its reservation
 * to `op`.
 */
export function decide(
  req: AdmissionRequest,
  cs: Counter[],
  now: number,
  op: Deno.AtomicOperation,
  by: Decider,
): Admission {
  const rules = req.plan.rules;
  let grant = req.tokens;
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    if (isTokenRule(r.kind)) grant = Math.min(grant, r.limit - used(cs[i]!));
  }
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    const over = isTokenRule(r.kind)
      ? grant < req.minTokens || grant <= 0
      : used(cs[i]!) + 1 > r.limit;
    if (over) {
      const quota = r.kind === "day" || r.kind === "month";
      return {
        ok: false,
        reason: quota ? "quota" : "rate",
        rule: r,
        // A slot frees when a request ends (any moment: 1 s), or when a
        // gateway that stopped beating is reclaimed.
        retryAfterMs: r.kind === "concurrency"
          ? Math.max(1000, by.reclaimDueMs())
          : cs[i]!.end - now,
        view: viewOf(rules, cs, now),
      };
    }
  }
  const tokenCounters: [string, string][] = [];
  const concCounters: [string, string][] = [];
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    const c = cs[i]!;
    const window = c.id.slice(r.subject.length + 1);
    if (isTokenRule(r.kind)) {
      c.added += grant;
      tokenCounters.push([r.subject, window]);
    } else {
      c.added += 1;
      if (r.kind === "concurrency") concCounters.push([r.subject, window]);
    }
  }
  const view = viewOf(rules, cs, now);
  if (tokenCounters.length === 0 && concCounters.length === 0) {
    return { ok: true, reservation: null, view };
  }
  const deadline = now + req.ttlMs;
  const id = newIdAt(deadline);
  const stored: StoredReservation = {
    tenantId: req.plan.tenantId,
    keyId: req.plan.keyId,
    owner: by.owner,
    deadline,
    tokens: grant,
    reclaimTokens: Math.min(grant, req.reclaimTokens),
    tokenCounters,
    concCounters,
  };
  op.set(k.reservation(id), stored, { expireIn: req.ttlMs + 7 * DAY });
  return {
    ok: true,
    reservation: {
      id,
      versionstamp: "",
      tokens: grant,
      tokenCounters,
      concCounters,
    },
    view,
  };
}
