/**
 * Budget alerts: when a budget's spend this month (store/spend.ts: what
 * the statement will bill) crosses one of its thresholds, ONE alert is
 * created for that threshold and month, whichever gateway sees it first
 * and however often it is checked (a marker written with a `check` in the
 * same commit), together with one webhook delivery per endpoint of the
 * tenant and of the provider (store/webhooks.ts). A hard budget that
 * refuses a request has reached its thresholds up to 100% even when what
 * it billed is a little under (it reserves each request's worst case).
 * Alerts show in the portal until acknowledged.
 */
import { type ApiKey } from "./api_keys.ts";
import { addAudit } from "./audit.ts";
import {
  type Budget,
  budgetsOf,
  type BudgetUnit,
  formatAmount,
} from "./budgets.ts";
import { ConflictError, NotFoundError } from "./errors.ts";
import { newId } from "./ids.ts";
import { moneyText } from "./money.ts";
import { k } from "./kv_keys.ts";
import { type Page, type PageOptions, pageSize } from "./pagination.ts";
import { getPricing } from "./pricing.ts";
import {
  type Principal,
  requirePlatform,
  requireTenantRead,
  requireTenantWrite,
} from "./principal.ts";
import { monthSpend } from "./spend.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";
import { monthOf } from "./usage_month.ts";
import {
  endpointsOf,
  enqueueDeliveries,
  type WebhookEvent,
} from "./webhooks.ts";

/** The webhook event type of an alert. */
export const ALERT_EVENT = "budget.threshold_reached";

/** How long the once-per-period markers are kept. */
const ONCE_TTL_MS = 400 * 86_400_000;

/** One threshold of one budget crossed in one month. */
export interface BudgetAlert {
  id: string;
  tenantId: string;
  tenantName: string;
  /** The key whose budget it is; null: the tenant's. */
  keyId: string | null;
  keyName: string | null;
  unit: BudgetUnit;
  hard: boolean;
  /** The budget when it fired: tokens, or micro-units. */
  amount: number;
  /** The currency of money budgets (the pricing's); null for tokens. */
  currency: string | null;
  /** The month (`YYYY-MM`, UTC). */
  period: string;
  /** The threshold crossed, percent. */
  threshold: number;
  /** Spent this month when it fired: tokens, or micro-units. */
  spent: number;
  /** spent / amount in percent, one decimal. */
  percent: number;
  /** "spend": what was billed crossed it; "refused": the hard budget refused a request. */
  cause: "spend" | "refused";
  createdAt: string;
  acknowledgedAt: string | null;
  acknowledgedBy: string | null;
}

/** `keyId|unit` of a budget (its key id "" for the tenant's): what `refused` names. */
export const budgetRef = (keyId: string | null, unit: BudgetUnit) =>
  `${keyId ?? ""}|${unit}`;

/** An alert as the admin API gives it: a money budget's amounts as decimal strings in major units. */
export function alertJson(a: BudgetAlert) {
  if (a.unit !== "money") return a;
  return { ...a, amount: moneyText(a.amount), spent: moneyText(a.spent) };
}

/** The event a webhook receives for an alert (no prompts, keys or secrets). */
export function alertEvent(a: BudgetAlert): WebhookEvent {
  // money as a decimal string in major units of `currency`, like the admin API
  const amount = (v: number) => a.unit === "money" ? moneyText(v) : v;
  return {
    id: `evt_${a.id}`,
    type: ALERT_EVENT,
    created: Math.floor(Date.parse(a.createdAt) / 1000),
    data: {
      alert: {
        id: a.id,
        tenant: { id: a.tenantId, name: a.tenantName },
        key: a.keyId ? { id: a.keyId, name: a.keyName } : null,
        budget: {
          unit: a.unit,
          amount: amount(a.amount),
          amountFormatted: formatAmount(a.unit, a.amount),
          currency: a.currency,
          hard: a.hard,
          period: a.period,
        },
        threshold: a.threshold,
        spent: amount(a.spent),
        spentFormatted: formatAmount(a.unit, a.spent),
        percent: a.percent,
        cause: a.cause,
        createdAt: a.createdAt,
      },
    },
  };
}

/**
 * Checks a tenant's budgets against this month's spend and creates the
 * alerts due (no access checks: the gateway's). `refused` names budgets
 * (budgetRef) that just refused a request. Resolves with the alerts
 * created (each with its webhook deliveries queued).
 */
export async function checkBudgets(
  store: Store,
  tenantId: string,
  opts: { now?: number; refused?: ReadonlySet<string> } = {},
): Promise<BudgetAlert[]> {
  const budgets = await budgetsOf(store, tenantId);
  if (budgets.length === 0) return [];
  const now = opts.now ?? Date.now();
  const period = monthOf(now);
  const pricing = await getPricing(store);
  const spend = await monthSpend(
    store,
    tenantId,
    period,
    pricing,
    budgets.some((b) => b.keyId !== null),
  );
  const due: {
    b: Budget;
    threshold: number;
    spent: number;
    cause: BudgetAlert["cause"];
  }[] = [];
  for (const b of budgets) {
    const use = b.keyId === null
      ? spend.tenant
      : spend.keys.get(b.keyId) ?? { tokens: 0, money: 0 };
    const spent = b.unit === "tokens" ? use.tokens : use.money;
    const refused = opts.refused?.has(budgetRef(b.keyId, b.unit)) ?? false;
    for (const t of b.thresholds) {
      if (spent * 100 >= b.amount * t) {
        due.push({ b, threshold: t, spent, cause: "spend" });
      } else if (refused && b.hard && t <= 100) {
        due.push({ b, threshold: t, spent, cause: "refused" });
      }
    }
  }
  if (due.length === 0) return [];
  // Already alerted: most checks end here, with one read.
  const marks = await getManyChunked(
    store,
    due.map(({ b, threshold }) => onceKey(b, period, threshold)),
  );
  const fresh = due.filter((_, i) => marks[i]!.versionstamp === null);
  if (fresh.length === 0) return [];
  const tenant = await getTenantRaw(store, tenantId);
  if (!tenant) return [];
  const keyNames = new Map<string, string>();
  for (const { b } of fresh) {
    if (b.keyId && !keyNames.has(b.keyId)) {
      const key = (await store.kv.get<ApiKey>(k.apiKey(b.keyId))).value;
      keyNames.set(b.keyId, key?.name ?? b.keyId);
    }
  }
  const endpoints = [
    ...await endpointsOf(store, tenantId),
    ...await endpointsOf(store, null),
  ];
  const created: BudgetAlert[] = [];
  for (const { b, threshold, spent, cause } of fresh) {
    const alert: BudgetAlert = {
      id: newId(),
      tenantId,
      tenantName: tenant.name,
      keyId: b.keyId,
      keyName: b.keyId ? keyNames.get(b.keyId) ?? null : null,
      unit: b.unit,
      hard: b.hard,
      amount: b.amount,
      currency: b.unit === "money" ? pricing.currency : null,
      period,
      threshold,
      spent,
      percent: Math.floor((spent / b.amount) * 1000) / 10,
      cause,
      createdAt: new Date(now).toISOString(),
      acknowledgedAt: null,
      acknowledgedBy: null,
    };
    const once = onceKey(b, period, threshold);
    const op = store.kv.atomic()
      .check({ key: once, versionstamp: null })
      .set(once, alert.id, { expireIn: ONCE_TTL_MS })
      .set(k.budgetAlert(tenantId, alert.id), alert)
      .set(k.budgetAlertAll(alert.id), alert)
      .sum(k.budgetAlertCount(tenantId, "created"), 1n)
      .sum(k.budgetAlertCount("provider", "created"), 1n);
    enqueueDeliveries(op, endpoints, alertEvent(alert), now);
    if ((await op.commit()).ok) created.push(alert);
  }
  return created;
}

function onceKey(b: Budget, period: string, threshold: number) {
  return k.budgetAlertOnce(
    b.tenantId,
    b.keyId ?? "",
    b.unit,
    period,
    threshold,
  );
}

async function getManyChunked(
  store: Store,
  keys: Deno.KvKey[],
): Promise<Deno.KvEntryMaybe<unknown>[]> {
  const out: Deno.KvEntryMaybe<unknown>[] = [];
  for (let i = 0; i < keys.length; i += 10) {
    out.push(...await store.kv.getMany(keys.slice(i, i + 10)));
  }
  return out;
}

async function listFrom(
  store: Store,
  prefix: Deno.KvKey,
  opts: PageOptions,
): Promise<Page<BudgetAlert>> {
  const limit = pageSize(opts.limit);
  const iter = store.kv.list<BudgetAlert>({ prefix }, {
    reverse: true,
    limit,
    cursor: opts.cursor && /^[A-Za-z0-9_\-+/=]{1,1024}$/.test(opts.cursor)
      ? opts.cursor
      : undefined,
  });
  const items: BudgetAlert[] = [];
  for await (const e of iter) items.push(e.value);
  return {
    items,
    cursor: items.length === limit ? iter.cursor || null : null,
  };
}

/** A tenant's alerts, newest first. */
export async function listAlerts(
  store: Store,
  p: Principal,
  tenantId: string,
  opts: PageOptions = {},
): Promise<Page<BudgetAlert>> {
  requireTenantRead(p, tenantId);
  if (!(await getTenantRaw(store, tenantId))) throw new NotFoundError("Tenant");
  return await listFrom(store, k.budgetAlertPrefix(tenantId), opts);
}

/** Every tenant's alerts, newest first (platform admins). */
export async function listAllAlerts(
  store: Store,
  p: Principal,
  opts: PageOptions = {},
): Promise<Page<BudgetAlert>> {
  requirePlatform(p);
  return await listFrom(store, k.budgetAlertAllPrefix(), opts);
}

/** Alerts not acknowledged yet: a tenant's, or ("provider") every tenant's. */
export async function openAlertCount(
  store: Store,
  scope: string,
): Promise<number> {
  const [c, a] = await store.kv.getMany([
    k.budgetAlertCount(scope, "created"),
    k.budgetAlertCount(scope, "acked"),
  ]);
  const n = (v: unknown) => v instanceof Deno.KvU64 ? Number(v.value) : 0;
  return Math.max(0, n(c!.value) - n(a!.value));
}

/** Acknowledges an alert (the tenant's admins, or platform admins); idempotent. */
export async function acknowledgeAlert(
  store: Store,
  p: Principal,
  tenantId: string,
  alertId: string,
): Promise<BudgetAlert> {
  requireTenantWrite(p, tenantId);
  const entry = alertId.length <= 64
    ? await store.kv.get<BudgetAlert>(k.budgetAlert(tenantId, alertId))
    : null;
  if (!entry?.value) throw new NotFoundError("Alert");
  if (entry.value.acknowledgedAt) return entry.value;
  const after: BudgetAlert = {
    ...entry.value,
    acknowledgedAt: new Date().toISOString(),
    acknowledgedBy: p.label,
  };
  const op = store.kv.atomic().check(entry)
    .set(k.budgetAlert(tenantId, alertId), after)
    .set(k.budgetAlertAll(alertId), after)
    .sum(k.budgetAlertCount(tenantId, "acked"), 1n)
    .sum(k.budgetAlertCount("provider", "acked"), 1n);
  addAudit(op, p, {
    action: "alert.acknowledge",
    target: { type: "budget_alert", id: alertId },
    tenantId,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The alert changed meanwhile; try again");
  }
  return after;
}
