/**
 * API key authentication with a cache: a verified key, its tenant and its
 * precomputed limit plan are reused as long as the auth epoch
 * (store/auth_epoch.ts) has not changed. Every revocation, suspension and
 * limit change rewrites the epoch. A change made in this process (admin
 * API, portal) empties the cache before the call that made it returns; one
 * made by another gateway instance (remote KV) is seen through a KV watch
 * when `watch()` runs, and in any case within `ttlMs` (≤ 1 s), while a busy
 * gateway reads KV for authentication a few times a second instead of per
 * request.
 *
 * The epoch is one read shared by all requests: re-read in the background
 * once it is half of `ttlMs` old (with a remote KV the read takes
 * milliseconds, and requests keep going), waited for only at `ttlMs`.
 * Each entry is also read again after `maxAgeMs` (default 5 minutes; half
 * to all of it, so reads spread out). With the epoch doing the
 * invalidation (every change Orchard makes to keys, tenants and limits
 * bumps it), that age limit is only a safety net for KV changed behind
 * Orchard's back (a restored backup): a valid key's entry past it is still
 * served, and read again in the background. 1,000 busy keys are read again
 * ~4 times a second (~20 at 60 s), none on a request's path.
 */
import { OpenAIError } from "../protocol/openai/errors.ts";
import { type ApiKey, parseApiKey, verifyApiKey } from "../store/api_keys.ts";
import {
  onAuthChange,
  readAuthEpoch,
  watchAuthEpoch,
} from "../store/auth_epoch.ts";
import { type Budget, budgetsOf, hardBudgets } from "../store/budgets.ts";
import { getTenantLimitsRaw, type Limits } from "../store/limits.ts";
import { type LimitPlan, limitPlan } from "../store/quota/mod.ts";
import type { Scope } from "../store/schemas.ts";
import type { Store } from "../store/store.ts";
import { getTenantRaw, type Tenant } from "../store/tenants.ts";

/** Who is calling, with everything the hot path needs precomputed. */
export interface AuthContext {
  key: ApiKey;
  tenant: Tenant;
  plan: LimitPlan;
  /** The key's model allow-list as a set; null = every model. */
  models: Set<string> | null;
  /** The tenant or this key has a budget: its spend is checked after writes. */
  budgeted: boolean;
  /** The plan has a money budget: requests are priced at admission. */
  priced: boolean;
  /** The key presented is a rotated key's previous secret, accepted until then (epoch ms). */
  graceUntil: number | null;
}

/**
 * A cached value and when it must be read again (epoch ms); `valid` once
 * it has been read as a valid key's.
 */
type Entry = {
  until: number;
  value: Promise<AuthContext | OpenAIError>;
  valid?: AuthContext;
};

/** Extracts the presented key: `Authorization: Bearer …` or `x-api-key`. */
export function presentedKey(headers: Headers): string | null {
  const auth = headers.get("authorization");
  if (auth) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(auth);
    return m ? m[1]! : null;
  }
  return headers.get("x-api-key");
}

const invalidKey = (why = "Incorrect API key provided") =>
  new OpenAIError(401, "invalid_api_key", why, {
    type: "authentication_error",
  });

const rotatedKey = () =>
  invalidKey(
    "This API key was rotated and its grace period has ended; use the new key",
  );

/** Verifies keys with a cache bounded in time (≤ ttlMs) and size. */
export class KeyCache {
  readonly #store: Store;
  readonly #ttlMs: number;
  readonly #maxAgeMs: number;
  readonly #max: number;
  #epoch: string | null | undefined = undefined;
  #epochAt = -Infinity;
  #epochCheck: Promise<void> | null = null;
  readonly #unsubscribe: () => void;
  #unwatch: (() => void) | null = null;
  readonly #map = new Map<string, Entry>();
  readonly #tenants = new Map<
    string,
    { until: number; value: Promise<[Tenant | null, Limits, Budget[]]> }
  >();

  constructor(
    store: Store,
    opts: { ttlMs?: number; maxAgeMs?: number; maxEntries?: number } = {},
  ) {
    this.#store = store;
    this.#ttlMs = Math.min(opts.ttlMs ?? 500, 1000);
    this.#maxAgeMs = Math.max(opts.maxAgeMs ?? 300_000, this.#ttlMs);
    this.#max = opts.maxEntries ?? 50_000;
    this.#unsubscribe = onAuthChange(store.kv, (e) => this.#changed(e));
  }

  /** Also follows the epoch through a KV watch (for changes made by other processes); idempotent. */
  watch(): void {
    this.#unwatch ??= watchAuthEpoch(this.#store.kv, (e) => this.#changed(e));
  }

  /** Stops following the epoch (this process's changes and the watch); idempotent. */
  close(): void {
    this.#unsubscribe();
    this.#unwatch?.();
    this.#unwatch = null;
  }

  /** Resolves a presented key to its context; throws OpenAIError 401/403 or (KV down) lets the error through. */
  async authenticate(raw: string | null): Promise<AuthContext> {
    if (!raw) {
      throw invalidKey(
        "You didn't provide an API key. Provide it as a Bearer token in the Authorization header or in x-api-key",
      );
    }
    let now = Date.now();
    if (now - this.#epochAt >= this.#ttlMs) {
      await this.#checkEpoch();
      now = Date.now();
    } else if (2 * (now - this.#epochAt) >= this.#ttlMs) {
      this.#checkEpoch().catch(() => {}); // the next request past ttlMs waits
    }
    let e = this.#map.get(raw); // only well-formed keys are ever cached
    if (e?.valid && now >= e.until) {
      // Valid as of the epoch just checked: served, and read again meanwhile.
      this.#reload(raw, e, now);
      return this.#unexpired(e.valid);
    }
    if (!e || now >= e.until) {
      if (!parseApiKey(raw)) throw invalidKey(); // checksum: no KV read, no cache entry
      if (this.#map.size >= this.#max) this.#evict(now);
      const entry: Entry = {
        until: this.#until(now),
        value: this.#load(raw, now),
      };
      this.#map.set(raw, entry);
      entry.value.then(
        (v) => {
          if (!(v instanceof OpenAIError)) entry.valid = v;
        },
        () => this.#map.delete(raw), // KV failures are not cached
      );
      e = entry;
    }
    const v = await e.value;
    if (v instanceof OpenAIError) throw v;
    return this.#unexpired(v);
  }

  #unexpired(v: AuthContext): AuthContext {
    const now = Date.now();
    if (v.key.expiresAt && Date.parse(v.key.expiresAt) <= now) {
      throw invalidKey("This API key has expired");
    }
    if (v.graceUntil !== null && v.graceUntil <= now) throw rotatedKey();
    return v;
  }

  /** Reads a served entry again; what it reads (a revocation too) replaces it. */
  #reload(raw: string, e: Entry, now: number): void {
    e.until = this.#until(now);
    this.#load(raw, now).then((v) => {
      if (this.#map.get(raw) !== e) return; // emptied meanwhile
      e.value = Promise.resolve(v);
      e.valid = v instanceof OpenAIError ? undefined : v;
    }, () => {}); // KV down: served until the epoch check fails
  }

  /** Re-reads the auth epoch (one read shared by concurrent callers); a change empties the caches. */
  #checkEpoch(): Promise<void> {
    this.#epochCheck ??= (async () => {
      try {
        const started = Date.now();
        this.#changed(await readAuthEpoch(this.#store.kv));
        this.#epochAt = started;
      } finally {
        this.#epochCheck = null;
      }
    })();
    return this.#epochCheck;
  }

  /** Takes an epoch read, committed or watched: a new one empties the caches. */
  #changed(epoch: string | null): void {
    if (epoch === this.#epoch) return;
    this.clear();
    this.#epoch = epoch;
  }

  /**
   * When an entry read now must be read again: between half and all of
   * maxAgeMs, at random, so keys first seen together (a restart, a warm-up)
   * are not all read again in the same second.
   */
  #until(now: number): number {
    return now + this.#maxAgeMs * (0.5 + 0.5 * Math.random());
  }

  /** Forgets every cached entry. */
  clear(): void {
    this.#map.clear();
    this.#tenants.clear();
  }

  #evict(now: number): void {
    for (const [k, e] of this.#map) {
      if (now >= e.until) this.#map.delete(k);
    }
    if (this.#map.size >= this.#max) this.#map.clear();
  }

  /** A tenant, its limits and its (and its keys') budgets, cached per tenant for the same ≤ 1 s. */
  #tenant(
    id: string,
    now: number,
  ): Promise<[Tenant | null, Limits, Budget[]]> {
    const c = this.#tenants.get(id);
    if (c && now < c.until) return c.value;
    if (this.#tenants.size >= this.#max) this.#tenants.clear();
    const value = Promise.all([
      getTenantRaw(this.#store, id),
      getTenantLimitsRaw(this.#store, id),
      budgetsOf(this.#store, id),
    ]);
    this.#tenants.set(id, { until: this.#until(now), value });
    value.catch(() => this.#tenants.delete(id));
    return value;
  }

  async #load(raw: string, now: number): Promise<AuthContext | OpenAIError> {
    const r = await verifyApiKey(this.#store, raw, now);
    if (!r.ok) {
      if (r.reason === "rotated") return rotatedKey();
      return invalidKey(
        r.reason === "revoked"
          ? "This API key has been revoked"
          : r.reason === "expired"
          ? "This API key has expired"
          : "Incorrect API key provided",
      );
    }
    const key = r.key;
    const [tenant, limits, budgets] = await this.#tenant(key.tenantId, now);
    if (!tenant) return invalidKey();
    if (tenant.status !== "active") {
      return new OpenAIError(
        403,
        "account_suspended",
        "This organization is suspended",
        {
          type: "permission_error",
        },
      );
    }
    const plan = limitPlan(
      tenant.id,
      key.id,
      limits,
      key.limits,
      hardBudgets(budgets, key.id),
    );
    return {
      key,
      tenant,
      plan,
      models: key.models ? new Set(key.models) : null,
      budgeted: budgets.some((b) => b.keyId === null || b.keyId === key.id),
      priced: plan.rules.some((r) => r.kind === "spend"),
      graceUntil: r.graceUntil,
    };
  }
}

/** Throws 403 unless the key holds `scope`. */
export function requireScope(ctx: AuthContext, scope: Scope): void {
  if (!ctx.key.scopes.includes(scope)) {
    throw new OpenAIError(
      403,
      "insufficient_scope",
      `This API key lacks the "${scope}" scope`,
      { type: "permission_error" },
    );
  }
}

/** Whether the key may use `model` (its id or the alias the client named). */
export function modelAllowed(
  ctx: AuthContext,
  id: string,
  named: string,
): boolean {
  return !ctx.models || ctx.models.has(id) || ctx.models.has(named);
}
