/**
 * The model prices the gateway counts money budgets at: the chargeback
 * settings (store/pricing.ts), read at most once a second and shared by
 * every request, so a price change applies within a second.
 */
import { getPricing, priceOf, type Pricing } from "../store/pricing.ts";
import type { Store } from "../store/store.ts";

/** Prices per 1M tokens (micro-units) of one model; zero when unpriced. */
export interface ModelRates {
  promptPerMillion: number;
  completionPerMillion: number;
}

const FREE: ModelRates = { promptPerMillion: 0, completionPerMillion: 0 };

/** The pricing settings, cached for `ttlMs`. */
export class PriceCache {
  readonly #store: Store;
  readonly #ttlMs: number;
  #at = -Infinity;
  #value: Promise<Pricing> | null = null;

  constructor(store: Store, ttlMs = 1000) {
    this.#store = store;
    this.#ttlMs = ttlMs;
  }

  /** The rates of `model` (its id), as of at most `ttlMs` ago. */
  async of(model: string): Promise<ModelRates> {
    return priceOf(await this.#pricing(), model) ?? FREE;
  }

  /** The currency prices are in (ISO 4217), as of at most `ttlMs` ago. */
  async currency(): Promise<string> {
    return (await this.#pricing()).currency;
  }

  #pricing(): Promise<Pricing> {
    const now = Date.now();
    if (!this.#value || now - this.#at >= this.#ttlMs) {
      this.#at = now;
      const v = getPricing(this.#store);
      this.#value = v;
      v.catch(() => {
        if (this.#value === v) this.#value = null;
      });
    }
    return this.#value;
  }
}
