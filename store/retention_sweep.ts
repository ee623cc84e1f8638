/**
 * The retention sweeper: deletes each tenant's records older than its
 * period now (records written before a shorter period was chosen carry
 * the longer `expireIn`), the provider's own audit entries older than the
 * default, and, once their grace period has passed, every record of
 * deleted tenants. The clock is a parameter, so tests move time.
 */
import { requestLogIndexSets } from "./request_log.ts";
import type { AuditEntry } from "./audit.ts";
import { k } from "./kv_keys.ts";
import {
  DAY_MS,
  getRetentionBounds,
  type RetentionDays,
  tenantRetention,
} from "./retention.ts";
import type { Head } from "./responses.ts";
import type { Store } from "./store.ts";
import type { Tenant } from "./tenants.ts";
import type { UsageRecord } from "./usage.ts";
import { auditKeys, deleteKeys, purgeTenant } from "./tenant_purge.ts";

/** What one sweep removed. */
export interface SweepResult {
  usage: number;
  audit: number;
  responses: number;
  /** Tenants whose data was removed after their deletion's grace period. */
  purged: string[];
}

async function sweepTenant(
  store: Store,
  tenantId: string,
  periods: RetentionDays,
  now: number,
): Promise<Omit<SweepResult, "purged">> {
  const kv = store.kv;
  const out = { usage: 0, audit: 0, responses: 0 };
  // usage: a value holds records written together; it goes when its newest is due
  const usageCut = new Date(now - periods.usage * DAY_MS).toISOString();
  const usageKeys: Deno.KvKey[] = [];
  const usage = kv.list<UsageRecord | UsageRecord[]>({
    prefix: k.usageRecordPrefix(tenantId),
  });
  for await (const e of usage) {
    const rs = Array.isArray(e.value) ? e.value : [e.value];
    if (rs.every((r) => r.at < usageCut)) {
      usageKeys.push(e.key);
      // its request-log index entries go with it
      for (const [key] of requestLogIndexSets(tenantId, String(e.key[2]), rs)) {
        usageKeys.push(key);
      }
      out.usage += rs.length;
    }
  }
  await deleteKeys(kv, usageKeys);
  const auditCut = new Date(now - periods.audit * DAY_MS).toISOString();
  const auditKeysDue: Deno.KvKey[] = [];
  const audit = kv.list<AuditEntry>({
    prefix: k.auditByTenantPrefix(tenantId),
  });
  for await (const e of audit) {
    if (e.value.at >= auditCut) break; // ids, so entries, are in time order
    auditKeysDue.push(...auditKeys(e.value));
    out.audit++;
  }
  await deleteKeys(kv, auditKeysDue);
  const respCut = now - periods.responses * DAY_MS;
  const heads = kv.list<Head>({ prefix: k.responsePrefix(tenantId) });
  for await (const e of heads) {
    const created = e.value.createdAt;
    const due = created !== undefined
      ? created < respCut
      : e.value.expiresAt <= now;
    if (!due) continue;
    const id = String(e.key[2]);
    const keys: Deno.KvKey[] = [e.key];
    for (let i = 0; i < e.value.parts; i++) {
      keys.push(k.responsePart(tenantId, id, i));
    }
    await deleteKeys(kv, keys);
    out.responses++;
  }
  return out;
}

/**
 * One sweep over every tenant (and the provider's own audit entries), as
 * of `now`; removes deleted tenants whose grace period has passed.
 */
export async function sweepRetention(
  store: Store,
  now = Date.now(),
): Promise<SweepResult> {
  const result: SweepResult = { usage: 0, audit: 0, responses: 0, purged: [] };
  const bounds = await getRetentionBounds(store);
  const tenants: Tenant[] = [];
  for await (const e of store.kv.list<Tenant>({ prefix: k.tenantPrefix() })) {
    tenants.push(e.value);
  }
  for (const t of tenants) {
    if (t.deletion && Date.parse(t.deletion.purgeAt) <= now) {
      await purgeTenant(store, t.id);
      result.purged.push(t.id);
      continue;
    }
    const r = await sweepTenant(
      store,
      t.id,
      await tenantRetention(store, t.id),
      now,
    );
    result.usage += r.usage;
    result.audit += r.audit;
    result.responses += r.responses;
  }
  // the provider's own entries (no tenant): the default audit period
  const cut = new Date(now - bounds.defaults.audit * DAY_MS).toISOString();
  const keys: Deno.KvKey[] = [];
  for await (
    const e of store.kv.list<AuditEntry>({ prefix: k.auditPrefix() })
  ) {
    if (e.value.at >= cut) break;
    if (e.value.tenantId !== null) continue;
    keys.push(...auditKeys(e.value));
    result.audit++;
  }
  await deleteKeys(store.kv, keys);
  return result;
}

/** Options of `startRetentionSweeper`. */
export interface SweeperOptions {
  /** Between sweeps (default 1 hour; the first runs a minute after start). */
  everyMs?: number;
  firstAfterMs?: number;
  onError?(err: unknown): void;
}

/** Runs `sweepRetention` now and then until stopped. */
export function startRetentionSweeper(
  store: Store,
  opts: SweeperOptions = {},
): { stop(): Promise<void> } {
  const every = opts.everyMs ?? 3_600_000;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let running: Promise<unknown> | null = null;
  let stopped = false;
  const run = () => {
    running = sweepRetention(store).catch((err) => opts.onError?.(err))
      .finally(() => {
        running = null;
        if (!stopped) timer = setTimeout(run, every);
      });
  };
  timer = setTimeout(run, opts.firstAfterMs ?? 60_000);
  return {
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await running;
    },
  };
}
