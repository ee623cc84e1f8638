/**
 * What a quota window has really used, as the usage rollups have it (a
 * few seconds behind), as opposed to its counter, which also holds the
 * worst case of every request in flight. A day, month or spend refusal
 * asks it whether the request would fit once those requests settle: if
 * so the refusal is a retryable 429 (`rate_limit_exceeded` with a
 * `retry-after`), not "used up". Reads are cached per window for
 * `ttlMs`, so a burst of refusals costs one read.
 */
import { getPricing, priceOf } from "../store/pricing.ts";
import { billedCost, type Rule } from "../store/quota/mod.ts";
import { keyModelUse } from "../store/spend.ts";
import type { Store } from "../store/store.ts";
import { monthOf, tenantModelMonth } from "../store/usage_month.ts";
import { tokensUsedIn } from "../store/usage_seed.ts";

/** Settled use per (subject, window kind), cached briefly. */
export class SettledUse {
  readonly #store: Store;
  readonly #ttlMs: number;
  readonly #cache = new Map<string, { at: number; value: Promise<number> }>();

  constructor(store: Store, ttlMs = 1000) {
    this.#store = store;
    this.#ttlMs = ttlMs;
  }

  /**
   * What `rule`'s current window has used (tokens, or micro-units for a
   * spend rule) by settled requests of `tenantId` (`rule.subject` names
   * the tenant or the key), as read at `notBefore` or later (default: at
   * most `ttlMs` ago).
   */
  of(
    rule: Rule,
    tenantId: string,
    notBefore = Date.now() - this.#ttlMs,
  ): Promise<number> {
    const now = Date.now();
    const id = `${rule.subject}\u0000${rule.kind}`;
    const hit = this.#cache.get(id);
    if (hit && hit.at >= notBefore && now - hit.at < this.#ttlMs) {
      return hit.value;
    }
    const value = this.#read(rule, tenantId, now);
    if (this.#cache.size >= 10_000) this.#cache.clear();
    this.#cache.set(id, { at: now, value });
    value.catch(() => this.#cache.delete(id));
    return value;
  }

  async #read(rule: Rule, tenantId: string, now: number): Promise<number> {
    const keyId = rule.subject.startsWith("k:") ? rule.subject.slice(2) : null;
    if (rule.kind === "day" || rule.kind === "month") {
      return await tokensUsedIn(this.#store, tenantId, keyId, rule.kind, now);
    }
    if (rule.kind !== "spend") return 0;
    // The spend counter adds each request's own cost (store/quota/spend.ts):
    // price the month's tokens per model unrounded (not the statement's
    // cents), plus a micro-unit a request for that rounding, so that
    // nothing spent is ever taken for held.
    const d = new Date(now);
    const start = Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
    const uses = keyId
      ? [
        ...(await keyModelUse(this.#store, tenantId, "day", start, now))
          .get(keyId)?.values() ?? [],
      ]
      : await tenantModelMonth(this.#store, tenantId, monthOf(now));
    const pricing = await getPricing(this.#store);
    let money = 0;
    for (const u of uses) {
      const p = priceOf(pricing, u.model);
      if (!p) continue;
      money += billedCost(p, u.prompt, u.completion) + u.requests;
    }
    return money;
  }
}
