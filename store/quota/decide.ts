/** Deciding one request against the counters of an admission commit. */
import { newIdAt } from "../ids.ts";
import { k } from "../kv_keys.ts";
import { type Counter, used, viewOf } from "./counters.ts";
import type {
  Admission,
  AdmissionRequest,
  Rule,
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

/** A refusal, without its view (the caller knows which counters it shows). */
export type Refusal = Omit<Extract<Admission, { ok: false }>, "view">;

/** What a request may take (tokens, and their worst case in money), or why not. */
export type Judgement = { ok: true; grant: number; money: number } | Refusal;

/**
 * Judges a request asking for `tokens` (≤ its own: a later group of a wide
 * plan asks for what the earlier ones granted) against `rules` and their
 * running counters `cs` (in order), adding nothing.
 */
export function judge(
  req: AdmissionRequest,
  tokens: number,
  rules: Rule[],
  cs: Counter[],
  now: number,
  by: Decider,
): Judgement {
  // The most tokens each rule lets this request take (a spend rule: as
  // many as its room pays for), and the grant: the least of them.
  const rooms: number[] = [];
  let grant = tokens;
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
      ? room < req.minTokens || room <= 0 || tokens <= 0 ||
        tokens < req.minTokens
      : used(cs[i]!) + 1 > r.limit;
    if (over) {
      const quota = r.kind === "day" || r.kind === "month" ||
        r.kind === "spend";
      const counted = isTokenRule(r.kind) || r.kind === "spend";
      const needed = r.kind === "spend"
        ? worstCost(req.price, Math.max(1, req.minTokens))
        : Math.max(1, req.minTokens);
      return {
        ok: false,
        // a limit of 0 blocks everything: refused as before, not "too large"
        reason: counted && r.limit > 0 && needed > r.limit
          ? "too_large"
          : quota
          ? "quota"
          : "rate",
        rule: r,
        ...(counted
          ? { remaining: Math.max(0, r.limit - used(cs[i]!)), needed }
          : {}),
        // A slot frees when a request ends (any moment: 1 s), or when a
        // gateway that stopped beating is reclaimed.
        retryAfterMs: r.kind === "concurrency"
          ? Math.max(1000, by.reclaimDueMs())
          : cs[i]!.end - now,
      };
    }
  }
  return { ok: true, grant, money: worstCost(req.price, grant) };
}

/** The `[subject, window]` counters a reservation holds something in, by what. */
export interface Held {
  tokenCounters: [string, string][];
  concCounters: [string, string][];
  moneyCounters: [string, string][];
  /** Its rpm counters (counted, never given back once admitted). */
  reqCounters: [string, string][];
}

/**
 * Adds a grant of `grant` tokens costing `money` to the counters of
 * `rules` (one request to the others), into `into`.
 */
export function take(
  rules: Rule[],
  cs: Counter[],
  grant: number,
  money: number,
  into: Held = {
    tokenCounters: [],
    concCounters: [],
    moneyCounters: [],
    reqCounters: [],
  },
): Held {
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    const c = cs[i]!;
    const window: [string, string] = [
      r.subject,
      c.id.slice(r.subject.length + 1),
    ];
    if (isTokenRule(r.kind)) {
      c.added += grant;
      into.tokenCounters.push(window);
    } else if (r.kind === "spend") {
      c.added += money;
      into.moneyCounters.push(window);
    } else {
      c.added += 1;
      (r.kind === "concurrency" ? into.concCounters : into.reqCounters)
        .push(window);
    }
  }
  return into;
}

/** A request's reservation record, holding `grant` tokens and `money` in `held`. */
export function storedReservation(
  req: AdmissionRequest,
  deadline: number,
  grant: number,
  money: number,
  held: Held,
  by: Decider,
): StoredReservation {
  const stored: StoredReservation = {
    tenantId: req.plan.tenantId,
    keyId: req.plan.keyId,
    owner: by.owner,
    deadline,
    tokens: grant,
    reclaimTokens: Math.min(grant, req.reclaimTokens),
    tokenCounters: held.tokenCounters,
    concCounters: held.concCounters,
  };
  if (held.moneyCounters.length > 0) {
    stored.money = money;
    // A reclaimed request is billed its prompt estimate: at the prompt price.
    stored.reclaimMoney = Math.min(
      money,
      worstCost(req.price, stored.reclaimTokens),
    );
    stored.moneyCounters = held.moneyCounters;
  }
  return stored;
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
  const j = judge(req, req.tokens, rules, cs, now, by);
  if (!j.ok) return { ...j, view: viewOf(rules, cs, now) };
  const { grant, money } = j;
  const held = take(rules, cs, grant, money);
  const view = viewOf(rules, cs, now);
  const { tokenCounters, concCounters, moneyCounters } = held;
  if (
    tokenCounters.length === 0 && concCounters.length === 0 &&
    moneyCounters.length === 0
  ) {
    return { ok: true, reservation: null, view };
  }
  const deadline = now + req.ttlMs;
  const id = newIdAt(deadline);
  const stored = storedReservation(req, deadline, grant, money, held, by);
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
