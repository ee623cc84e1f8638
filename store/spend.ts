/**
 * Spend: what usage costs, per tenant, key and model, for a range or a
 * month. Always the statement's pricing (`tokenLines`, store/statements.ts):
 * the token lines of the tokens in question, each rounded to the cent, and
 * their sum. A tenant's spend per model comes from the same rollups as its
 * statement (tenant × model), so the usage page's total over a calendar
 * month is the statement's token lines to the cent; per key from the key ×
 * model rollups written in the same commit (store/usage_rollups.ts).
 * Amounts are integer micro-units.
 */
import { k } from "./kv_keys.ts";
import { getPricing, type Pricing } from "./pricing.ts";
import { type ModelTokens, tokenLines } from "./statements.ts";
import type { Store } from "./store.ts";
import { rollupFields, timeBucket } from "./usage.ts";
import { monthOf, tenantModelMonth } from "./usage_month.ts";

/** Tokens and what they cost. */
export interface SpendRow {
  requests: number;
  promptTokens: number;
  completionTokens: number;
  amountMicro: number;
}

/** Spend of a range or month, with its parts. */
export interface Spend {
  currency: string;
  totalMicro: number;
  promptTokens: number;
  completionTokens: number;
  byModel: (SpendRow & { model: string })[];
  /** Per key (a tenant's spend only; null for the whole cluster). */
  byKey: (SpendRow & { keyId: string })[] | null;
  /** Unpriced models used (their tokens are free). */
  notes: string[];
}

/** What a range query selects (as store/usage_report.ts validates it). */
export interface SpendQuery {
  tenantId: string | null;
  keyId: string | null;
  model: string | null;
  granularity: "hour" | "day";
  from: number;
  to: number;
}

type Use = ModelTokens & { requests: number };

/**
 * The priced total of some models' tokens (their statement token lines),
 * and each model's part: its own lines.
 */
export function priceModels(
  pricing: Pricing,
  models: readonly ModelTokens[],
): { total: number; byModel: Map<string, number>; notes: string[] } {
  const byModel = new Map<string, number>();
  const notes: string[] = [];
  let total = 0;
  for (const m of models) {
    const priced = tokenLines(pricing, [m]);
    const amount = priced.lines.reduce((a, l) => a + l.amountMicro, 0);
    byModel.set(m.model, (byModel.get(m.model) ?? 0) + amount);
    notes.push(...priced.notes);
    total += amount;
  }
  return { total, byModel, notes };
}

function row(use: Use, amountMicro: number): SpendRow {
  return {
    requests: use.requests,
    promptTokens: use.prompt,
    completionTokens: use.completion,
    amountMicro,
  };
}

/** The months (`YYYY-MM`) a range touches. */
function monthsOf(from: number, to: number): string[] {
  const out: string[] = [];
  const d = new Date(from);
  let y = d.getUTCFullYear(), m = d.getUTCMonth();
  for (;;) {
    const start = Date.UTC(y, m, 1);
    if (start > to) break;
    out.push(monthOf(start));
    if (++m === 12) [y, m] = [y + 1, 0];
  }
  return out;
}

const STEP = { hour: 3_600_000, day: 86_400_000 };

/** Sums a rollup group's tokens over [from, to] (the buckets usageSeries reads). */
async function sumRollup(
  store: Store,
  g: "hour" | "day",
  dimension: "tenant_model" | "model",
  subject: string,
  from: number,
  to: number,
): Promise<Use> {
  const use = { model: "", requests: 0, prompt: 0, completion: 0 };
  const start = from - (from % STEP[g]);
  const prefix = k.usageRollupPrefix(g, dimension, subject);
  const iter = store.kv.list({
    start: [...prefix, timeBucket(g, start)],
    end: [...prefix, timeBucket(g, to), "\uffff"],
  });
  for await (const e of iter) add(use, e);
  return use;
}

function add(use: Use, e: Deno.KvEntry<unknown>): void {
  for (const [f, v] of rollupFields(e)) {
    if (f === "requests") use.requests += v;
    else if (f === "prompt") use.prompt += v;
    else if (f === "completion") use.completion += v;
  }
}

/**
 * A tenant's tokens per key and model over [from, to] in `g` buckets (one
 * range read): key → model → use.
 */
export async function keyModelUse(
  store: Store,
  tenantId: string,
  g: "hour" | "day",
  from: number,
  to: number,
): Promise<Map<string, Map<string, Use>>> {
  const out = new Map<string, Map<string, Use>>();
  const start = from - (from % STEP[g]);
  const prefix = k.usageKeyModelPrefix(g, tenantId);
  const iter = store.kv.list({
    start: [...prefix, timeBucket(g, start)],
    end: [...prefix, timeBucket(g, to), "\uffff"],
  }, { batchSize: 500 });
  for await (const e of iter) {
    const keyId = e.key[prefix.length + 1] as string;
    const model = e.key[prefix.length + 2] as string;
    let models = out.get(keyId);
    if (!models) out.set(keyId, models = new Map());
    let use = models.get(model);
    if (!use) {
      models.set(
        model,
        use = { model, requests: 0, prompt: 0, completion: 0 },
      );
    }
    add(use, e);
  }
  return out;
}

/** Sums uses of models into one. */
function sumUses(uses: Iterable<Use>): Use {
  const t = { model: "", requests: 0, prompt: 0, completion: 0 };
  for (const u of uses) {
    t.requests += u.requests;
    t.prompt += u.prompt;
    t.completion += u.completion;
  }
  return t;
}

/**
 * What a range of usage cost (access checks are the caller's): for a
 * tenant, per model (its statement's rollups) and per key; for the whole
 * cluster, per priced model (an unpriced model is free).
 */
export async function rangeSpend(
  store: Store,
  q: SpendQuery,
  pricing?: Pricing,
): Promise<Spend> {
  pricing ??= await getPricing(store);
  const g = q.granularity;
  let uses: Use[];
  let byKey: Spend["byKey"] = null;
  if (q.tenantId) {
    const tenantId = q.tenantId;
    const perKey = await keyModelUse(store, tenantId, g, q.from, q.to);
    if (q.keyId) {
      const mine = perKey.get(q.keyId) ?? new Map<string, Use>();
      uses = [...mine.values()].filter((u) => !q.model || u.model === q.model);
    } else {
      // The statement's own rollups: every model the tenant used in the
      // range's months.
      const models = new Set<string>();
      for (const month of monthsOf(q.from, q.to)) {
        for (const m of await tenantModelMonth(store, tenantId, month)) {
          models.add(m.model);
        }
      }
      if (q.model) {
        for (const m of [...models]) if (m !== q.model) models.delete(m);
      }
      uses = await Promise.all(
        [...models].map(async (model) => ({
          ...await sumRollup(
            store,
            g,
            "tenant_model",
            `${tenantId}/${model}`,
            q.from,
            q.to,
          ),
          model,
        })),
      );
    }
    byKey = [];
    for (const [keyId, models] of perKey) {
      if (q.keyId && keyId !== q.keyId) continue;
      const mine = [...models.values()].filter((u) =>
        !q.model || u.model === q.model
      );
      if (mine.length === 0) continue;
      const { total } = priceModels(pricing, mine);
      byKey.push({ keyId, ...row(sumUses(mine), total) });
    }
    byKey.sort((a, b) =>
      b.amountMicro - a.amountMicro ||
      (b.promptTokens + b.completionTokens) -
        (a.promptTokens + a.completionTokens)
    );
  } else {
    const models = pricing.models.map((m) => m.model).filter((m) =>
      !q.model || m === q.model
    );
    uses = await Promise.all(
      models.map(async (model) => ({
        ...await sumRollup(store, g, "model", model, q.from, q.to),
        model,
      })),
    );
  }
  uses = uses.filter((u) => u.requests + u.prompt + u.completion > 0);
  uses.sort((a, b) => a.model.localeCompare(b.model));
  const priced = priceModels(pricing, uses);
  const total = sumUses(uses);
  return {
    currency: pricing.currency,
    totalMicro: priced.total,
    promptTokens: total.prompt,
    completionTokens: total.completion,
    byModel: uses.map((u) => ({
      model: u.model,
      ...row(u, priced.byModel.get(u.model) ?? 0),
    })),
    byKey,
    notes: priced.notes,
  };
}

/** A subject's use in a month: tokens, and what they cost (micro-units). */
export interface MonthUse {
  tokens: number;
  money: number;
}

/**
 * A tenant's spend in `month` (`YYYY-MM`): its own (the statement's token
 * lines) and, when `withKeys`, each key's (priced the same way).
 */
export async function monthSpend(
  store: Store,
  tenantId: string,
  month: string,
  pricing: Pricing,
  withKeys: boolean,
): Promise<{ tenant: MonthUse; keys: Map<string, MonthUse> }> {
  const models = await tenantModelMonth(store, tenantId, month);
  const tenant = {
    tokens: models.reduce((a, m) => a + m.prompt + m.completion, 0),
    money: priceModels(pricing, models).total,
  };
  const keys = new Map<string, MonthUse>();
  if (withKeys) {
    const start = Date.parse(`${month}-01T00:00:00Z`);
    const d = new Date(start);
    const end = Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1) - 1;
    const perKey = await keyModelUse(store, tenantId, "day", start, end);
    for (const [keyId, ms] of perKey) {
      const uses = [...ms.values()];
      keys.set(keyId, {
        tokens: uses.reduce((a, u) => a + u.prompt + u.completion, 0),
        money: priceModels(pricing, uses).total,
      });
    }
  }
  return { tenant, keys };
}
