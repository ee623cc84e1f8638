/**
 * Checks budgets as usage lands: when the usage writer has committed a
 * tenant's records (store/usage_rollups.ts `onWritten`) and that tenant
 * has budgets (its requests said so), its spend this month is checked
 * against their thresholds (store/budget_alerts.ts), at most once per
 * `minIntervalMs` per tenant; a hard budget's refusal is checked at once.
 * New alerts wake the webhook dispatcher.
 */
import type { Logger } from "../lib/log.ts";
import { budgetRef, checkBudgets } from "../store/budget_alerts.ts";
import type { Rule } from "../store/quota/mod.ts";
import type { Store } from "../store/store.ts";

/** Tunables of a BudgetMonitor. */
export interface BudgetMonitorOptions {
  /** Least time between two checks of one tenant (default 2 s). */
  minIntervalMs?: number;
  /** How long a tenant stays watched after its last budgeted request (default 10 min). */
  watchMs?: number;
  /** Called with the number of alerts a check created. */
  onAlerts?: (count: number) => void;
  log: Logger;
}

/** Budget checks of one gateway process. */
export class BudgetMonitor {
  readonly #store: Store;
  readonly #minIntervalMs: number;
  readonly #watchMs: number;
  readonly #onAlerts: (count: number) => void;
  readonly #log: Logger;
  /** Tenants with budgets, and when they were last seen. */
  readonly #watched = new Map<string, number>();
  /** Budgets (budgetRef) that refused a request, per tenant, not checked yet. */
  readonly #refused = new Map<string, Set<string>>();
  /** Tenants due for a check, and when each was last checked. */
  readonly #due = new Set<string>();
  readonly #lastCheck = new Map<string, number>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #running: Promise<void> | null = null;
  #closed = false;

  constructor(store: Store, opts: BudgetMonitorOptions) {
    this.#store = store;
    this.#minIntervalMs = opts.minIntervalMs ?? 2000;
    this.#watchMs = opts.watchMs ?? 600_000;
    this.#onAlerts = opts.onAlerts ?? (() => {});
    this.#log = opts.log;
  }

  /** A request of a tenant with budgets ended: its next usage write is checked. */
  watch(tenantId: string): void {
    if (this.#watched.size >= 100_000) this.#watched.clear();
    this.#watched.set(tenantId, Date.now());
  }

  /** A hard budget refused a request: its thresholds up to 100% are due. */
  refused(tenantId: string, rule: Rule): void {
    const keyId = rule.subject.startsWith("k:") ? rule.subject.slice(2) : null;
    const ref = budgetRef(keyId, rule.kind === "spend" ? "money" : "tokens");
    let set = this.#refused.get(tenantId);
    if (!set) this.#refused.set(tenantId, set = new Set());
    if (set.has(ref)) return;
    set.add(ref);
    this.#lastCheck.delete(tenantId); // at once
    this.#schedule(tenantId);
  }

  /** The usage writer committed these tenants' records. */
  written(tenantIds: string[]): void {
    const now = Date.now();
    for (const t of tenantIds) {
      const seen = this.#watched.get(t);
      if (seen === undefined) continue;
      if (now - seen > this.#watchMs) {
        this.#watched.delete(t);
        continue;
      }
      this.#schedule(t);
    }
  }

  #schedule(tenantId: string): void {
    if (this.#closed) return;
    this.#due.add(tenantId);
    if (this.#timer !== undefined || this.#running) return;
    const last = this.#lastCheck.get(tenantId) ?? -Infinity;
    const wait = Math.max(0, last + this.#minIntervalMs - Date.now());
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#running = this.#run().finally(() => {
        this.#running = null;
        if (this.#due.size > 0) this.#schedule([...this.#due][0]!);
      });
    }, wait);
  }

  async #run(): Promise<void> {
    const now = Date.now();
    const ready = [...this.#due].filter((t) =>
      now - (this.#lastCheck.get(t) ?? -Infinity) >= this.#minIntervalMs
    );
    for (const t of ready) {
      this.#due.delete(t);
      this.#lastCheck.set(t, now);
      if (this.#lastCheck.size >= 100_000) this.#lastCheck.clear();
      const refused = this.#refused.get(t);
      this.#refused.delete(t);
      try {
        const alerts = await checkBudgets(this.#store, t, { refused });
        if (alerts.length > 0) this.#onAlerts(alerts.length);
      } catch (e) {
        // KV unreachable: the next write checks again
        if (refused) this.#refused.set(t, refused);
        this.#log.warn("budget check failed", {
          tenant: t,
          error: String(e),
        });
      }
    }
  }

  /** Runs the checks due now (those waiting out minIntervalMs too) and waits for them. */
  async idle(): Promise<void> {
    await this.#running;
    if (this.#timer === undefined || this.#due.size === 0) return;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#lastCheck.clear();
    this.#running = this.#run().finally(() => this.#running = null);
    await this.#running;
  }

  /** Stops checking (waits for a check in progress). */
  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#running;
  }
}
