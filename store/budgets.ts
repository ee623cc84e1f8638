/**
 * Budgets per tenant and per key, per calendar month (UTC), in tokens or in
 * money (micro-units, priced like statements: store/spend.ts), with alert
 * thresholds in percent (store/budget_alerts.ts). A soft budget only
 * alerts; a hard one is also enforced by the gateway's admission, exactly
 * like token quotas (store/quota: a token budget is the month's token
 * quota, a money budget a `spend` rule), refusing requests with 429
 * `insufficient_quota` once reached.
 *
 * The provider (platform admins) sets tenants' budgets; a tenant's admins
 * set its keys' budgets, within the tenant's budget of the same unit.
 * Every change is audited and rewrites the auth epoch, so gateways enforce
 * it at once (store/auth_epoch.ts).
 */
import { z } from "zod";
import { addAudit } from "./audit.ts";
import { commitAuthChange } from "./auth_epoch.ts";
import type { ApiKey } from "./api_keys.ts";
import { ConflictError, NotFoundError, ValidationError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import { formatMoney, MICRO, moneyText } from "./money.ts";
import {
  type Principal,
  requirePlatform,
  requireTenantRead,
  requireTenantWrite,
} from "./principal.ts";
import type { HardBudgets } from "./quota/mod.ts";
import { seedBudgetCounter } from "./usage_seed.ts";
import { getPricing } from "./pricing.ts";
import { moneySchema, parse } from "./schemas.ts";
import { monthSpend } from "./spend.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";
import { monthOf } from "./usage_month.ts";

/** What a budget counts. */
export const BUDGET_UNITS = ["tokens", "money"] as const;
export type BudgetUnit = typeof BUDGET_UNITS[number];

/** Alert thresholds when none are given (percent of the budget). */
export const DEFAULT_THRESHOLDS = [80, 100];

/** Largest money budget: 10^9 currency units a month. */
const MAX_MONEY = 1e9 * MICRO;

/** A budget of a tenant (`keyId` null) or of one of its keys. */
export interface Budget {
  tenantId: string;
  keyId: string | null;
  unit: BudgetUnit;
  /** Per calendar month (UTC): tokens, or money in micro-units. */
  amount: number;
  /** Refuse requests once reached (else alerts only). */
  hard: boolean;
  /** Percents of `amount` at which an alert fires, ascending. */
  thresholds: number[];
  updatedAt: string;
  updatedBy: string;
}

const thresholdsSchema = z.array(
  z.coerce.number({ error: "must be numbers" }).int(
    "must be whole percents",
  ).min(1, "must be at least 1%").max(1000, "must be at most 1000%"),
  { error: "must be a list of percents" },
).min(1, "give at least one threshold").max(10, "at most 10 thresholds")
  .transform((ts) => [...new Set(ts)].sort((a, b) => a - b));

const tokensAmount = z.coerce.number({ error: "must be a number" }).int(
  "must be a whole number of tokens",
).min(1, "must be at least 1").max(1e12, "must be at most 10^12");

const moneyAmount = moneySchema({
  positive: true,
  maxMicro: MAX_MONEY,
  what: "must be an amount above 0 and at most 10^9, with at most 6 decimals",
});

/** Fields a read gives that a write may send back unchanged (and are ignored). */
const readOnly = Object.fromEntries(
  [
    "tenantId",
    "keyId",
    "unit",
    "currency",
    "spent",
    "percent",
    "updatedAt",
    "updatedBy",
  ].map((f) => [f, z.unknown().optional().meta({ readOnly: true })]),
);

const budgetSchema = (unit: BudgetUnit) =>
  z.object({
    amount: unit === "money" ? moneyAmount : tokensAmount,
    hard: z.boolean({ error: "must be true or false" }).optional().default(
      false,
    ),
    thresholds: thresholdsSchema.optional().default(DEFAULT_THRESHOLDS),
    ...readOnly,
  }).strict().transform(({ amount, hard, thresholds }) => ({
    amount,
    hard,
    thresholds,
  }));

/** The request body of a budget in `unit`, for the OpenAPI document. */
export const budgetBodySchema = budgetSchema;

/** Validates a unit (a path segment). */
export function parseUnit(raw: string | undefined): BudgetUnit {
  if (raw === "tokens" || raw === "money") return raw;
  throw new ValidationError("unit: must be tokens or money", "unit");
}

/** Formats a budget amount for people: tokens, or money with 2 decimals. */
export function formatAmount(unit: BudgetUnit, amount: number): string {
  return unit === "money"
    ? formatMoney(amount)
    : Math.round(amount).toLocaleString("en-US");
}

/** Every budget of a tenant and of its keys (no access checks: the gateway's). */
export async function budgetsOf(
  store: Store,
  tenantId: string,
): Promise<Budget[]> {
  const out: Budget[] = [];
  const iter = store.kv.list<Budget>({ prefix: k.budgetPrefix(tenantId) });
  for await (const e of iter) out.push(e.value);
  return out;
}

/** The hard budgets of a tenant and of one key, as the limit plan takes them. */
export function hardBudgets(
  budgets: readonly Budget[],
  keyId: string,
): { tenant: HardBudgets; key: HardBudgets } {
  const pick = (owner: string | null): HardBudgets => {
    const of = (unit: BudgetUnit) =>
      budgets.find((b) => b.keyId === owner && b.unit === unit && b.hard)
        ?.amount ?? null;
    return { tokens: of("tokens"), money: of("money") };
  };
  return { tenant: pick(null), key: pick(keyId) };
}

/** A tenant's budgets and its keys' (tenant's own first). */
export async function listBudgets(
  store: Store,
  p: Principal,
  tenantId: string,
): Promise<Budget[]> {
  requireTenantRead(p, tenantId);
  if (!(await getTenantRaw(store, tenantId))) throw new NotFoundError("Tenant");
  return await budgetsOf(store, tenantId);
}

/** Sets a tenant's budget in `unit` (platform admins: what the provider sells). */
export async function setTenantBudget(
  store: Store,
  p: Principal,
  tenantId: string,
  unit: BudgetUnit,
  input: unknown,
): Promise<Budget> {
  requirePlatform(p);
  const tenant = await store.kv.get(k.tenant(tenantId));
  if (!tenant.value) throw new NotFoundError("Tenant");
  const data = parse(budgetSchema(unit), input);
  return await write(store, p, tenant, { tenantId, keyId: null, unit }, data);
}

/**
 * Sets a key's budget in `unit` (the tenant's admins, or platform admins),
 * within the tenant's budget of the same unit when it has one.
 */
export async function setKeyBudget(
  store: Store,
  p: Principal,
  keyId: string,
  unit: BudgetUnit,
  input: unknown,
  tenantId?: string,
): Promise<Budget> {
  const key = await keyOf(store, p, keyId, tenantId);
  const data = parse(budgetSchema(unit), input);
  const tb = await store.kv.get<Budget>(k.budget(key.tenantId, "", unit));
  if (tb.value && data.amount > tb.value.amount) {
    throw new ValidationError(
      `amount: must be within the tenant's ${unit} budget of ${
        formatAmount(unit, tb.value.amount)
      }`,
      "amount",
    );
  }
  return await write(
    store,
    p,
    tb,
    { tenantId: key.tenantId, keyId: key.id, unit },
    data,
    key.name,
  );
}

/** Removes a tenant's budget in `unit` (platform admins). Idempotent. */
export async function deleteTenantBudget(
  store: Store,
  p: Principal,
  tenantId: string,
  unit: BudgetUnit,
): Promise<void> {
  requirePlatform(p);
  if (!(await getTenantRaw(store, tenantId))) throw new NotFoundError("Tenant");
  await remove(store, p, { tenantId, keyId: null, unit });
}

/** Removes a key's budget in `unit`. Idempotent. */
export async function deleteKeyBudget(
  store: Store,
  p: Principal,
  keyId: string,
  unit: BudgetUnit,
  tenantId?: string,
): Promise<void> {
  const key = await keyOf(store, p, keyId, tenantId);
  await remove(
    store,
    p,
    { tenantId: key.tenantId, keyId: key.id, unit },
    key.name,
  );
}

/** A key the principal may change budgets of (404 otherwise; viewers 403). */
async function keyOf(
  store: Store,
  p: Principal,
  keyId: string,
  tenantId?: string,
): Promise<ApiKey> {
  const key = keyId.length <= 64
    ? (await store.kv.get<ApiKey>(k.apiKey(keyId))).value
    : null;
  if (!key || (tenantId && key.tenantId !== tenantId)) {
    throw new NotFoundError("API key");
  }
  requireTenantWrite(p, key.tenantId, "API key");
  return key;
}

type Owner = Pick<Budget, "tenantId" | "keyId" | "unit">;

async function write(
  store: Store,
  p: Principal,
  guard: Deno.KvEntryMaybe<unknown>,
  owner: Owner,
  data: Pick<Budget, "amount" | "hard" | "thresholds">,
  label?: string,
): Promise<Budget> {
  const key = k.budget(owner.tenantId, owner.keyId ?? "", owner.unit);
  const before = await store.kv.get<Budget>(key);
  const budget: Budget = {
    ...owner,
    ...data,
    updatedAt: new Date().toISOString(),
    updatedBy: p.label,
  };
  const op = store.kv.atomic().check(guard).check(before).set(key, budget);
  addAudit(op, p, {
    action: "budget.set",
    target: target(owner, label),
    tenantId: owner.tenantId,
    before: before.value ?? null,
    after: budget,
  });
  if (!(await commitAuthChange(store.kv, op)).ok) {
    throw new ConflictError("The budget changed meanwhile; try again");
  }
  await seedBudgetCounter(store, budget);
  return budget;
}

async function remove(
  store: Store,
  p: Principal,
  owner: Owner,
  label?: string,
): Promise<void> {
  const key = k.budget(owner.tenantId, owner.keyId ?? "", owner.unit);
  const before = await store.kv.get<Budget>(key);
  if (!before.value) return;
  const op = store.kv.atomic().check(before).delete(key);
  addAudit(op, p, {
    action: "budget.delete",
    target: target(owner, label),
    tenantId: owner.tenantId,
    before: before.value,
    after: null,
  });
  if (!(await commitAuthChange(store.kv, op)).ok) {
    throw new ConflictError("The budget changed meanwhile; try again");
  }
}

function target(owner: Owner, label?: string) {
  return owner.keyId
    ? { type: "api_key", id: owner.keyId, label: label ?? owner.keyId }
    : { type: "tenant", id: owner.tenantId };
}

/** A budget with what it has used this month. */
export interface BudgetUse extends Budget {
  /** Spent this month: tokens, or micro-units (what the statement bills). */
  spent: number;
  /** spent / amount in percent, one decimal. */
  percent: number;
}

/** A tenant's budgets and its keys', each with this month's spend. */
export async function budgetStatus(
  store: Store,
  p: Principal,
  tenantId: string,
  now = Date.now(),
): Promise<{ period: string; currency: string; budgets: BudgetUse[] }> {
  const budgets = await listBudgets(store, p, tenantId);
  const period = monthOf(now);
  const pricing = await getPricing(store);
  const spend = budgets.length === 0 ? null : await monthSpend(
    store,
    tenantId,
    period,
    pricing,
    budgets.some((b) => b.keyId !== null),
  );
  return {
    period,
    currency: pricing.currency,
    budgets: budgets.map((b) => {
      const use = b.keyId === null
        ? spend!.tenant
        : spend!.keys.get(b.keyId) ?? { tokens: 0, money: 0 };
      const spent = b.unit === "tokens" ? use.tokens : use.money;
      return {
        ...b,
        spent,
        percent: Math.floor((spent / b.amount) * 1000) / 10,
      };
    }),
  };
}

/**
 * A budget as the admin API reads and writes it: a money budget's amount
 * and spend as decimal strings in major units of `currency`
 * (store/money.ts), a token budget's as whole tokens.
 */
export function budgetJson(b: Budget | BudgetUse, currency: string) {
  const money = b.unit === "money";
  const amount = (v: number) => money ? moneyText(v) : v;
  return {
    ...b,
    amount: amount(b.amount),
    currency: money ? currency : null,
    ...("spent" in b ? { spent: amount(b.spent) } : {}),
  };
}
