/** Deciding one request against the counters of an admission commit. */
import { newIdAt } from "../ids.ts";
import { k } from "../kv_keys.ts";
import { type Counter, used, viewOf } from "./counters.ts";
import type {
  Admission,
  AdmissionRequest,
  StoredReservation,
} from "./types.ts";
import { affordableTokens, worstCost } from "./spend.ts";
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
  // The most tokens each rule lets this request take (a spend rule: as
  // many as its room pays for), and the grant: the least of them.
  const rooms: number[] = [];
  let grant = req.tokens;
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    const room = isTokenRule(r.kind)
      ? r.limit - used(cs[i]!)
      : r.kind === "spend"
      ? affordableTokens(req.price, r.limit - used(cs[i]!))
      : Infinity;
    rooms.push(room);
    grant = Math.min(grant, room);
  }
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    const room = rooms[i]!;
    const over = isTokenRule(r.kind) || r.kind === "spend"
      ? room < req.minTokens || room <= 0 || req.tokens <= 0 ||
        req.tokens < req.minTokens
      : used(cs[i]!) + 1 > r.limit;
    if (over) {
      const quota = r.kind === "day" || r.kind === "month" ||
        r.kind === "spend";
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
  const money = worstCost(req.price, grant);
  const tokenCounters: [string, string][] = [];
  const concCounters: [string, string][] = [];
  const moneyCounters: [string, string][] = [];
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    const c = cs[i]!;
    const window = c.id.slice(r.subject.length + 1);
    if (isTokenRule(r.kind)) {
      c.added += grant;
      tokenCounters.push([r.subject, window]);
    } else if (r.kind === "spend") {
      c.added += money;
      moneyCounters.push([r.subject, window]);
    } else {
      c.added += 1;
      if (r.kind === "concurrency") concCounters.push([r.subject, window]);
    }
  }
  const view = viewOf(rules, cs, now);
  if (
    tokenCounters.length === 0 && concCounters.length === 0 &&
    moneyCounters.length === 0
  ) {
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
  if (moneyCounters.length > 0) {
    stored.money = money;
    // A reclaimed request is billed its prompt estimate: at the prompt price.
    stored.reclaimMoney = Math.min(
      money,
      worstCost(req.price, stored.reclaimTokens),
    );
    stored.moneyCounters = moneyCounters;
  }
  op.set(k.reservation(id), stored, { expireIn: req.ttlMs + 7 * DAY });
  return {
    ok: true,
    reservation: {
      id,
      versionstamp: "",
      tokens: grant,
      tokenCounters,
      concCounters,
      ...(moneyCounters.length > 0 ? { money, moneyCounters } : {}),
    },
    view,
  };
}
