/** The append-only audit log: every admin mutation, who, what, when, from where. */
import { ValidationError } from "./errors.ts";
import { idBoundAt, newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import {
  checkCursor,
  type Page,
  type PageOptions,
  pageSize,
} from "./pagination.ts";
import { isPlatform, type Principal } from "./principal.ts";
import { retentionMs } from "./retention.ts";

/** One audit entry. Never holds secrets or prompt text. */
export interface AuditEntry {
  id: string;
  at: string;
  actor: { kind: Principal["kind"]; id: string; label: string };
  action: string;
  target: { type: string; id: string; label?: string };
  tenantId: string | null;
  before: unknown;
  after: unknown;
  ip: string | null;
}

/** What a mutation says about itself. */
export interface AuditInput {
  action: string;
  target: AuditEntry["target"];
  tenantId: string | null;
  before?: unknown;
  after?: unknown;
}

/** Adds the audit entry (and its indexes) to an atomic operation. */
export function addAudit(
  op: Deno.AtomicOperation,
  p: Principal,
  input: AuditInput,
): Deno.AtomicOperation {
  const id = newId();
  const entry: AuditEntry = {
    id,
    at: new Date().toISOString(),
    actor: { kind: p.kind, id: p.id, label: p.label },
    action: input.action,
    target: input.target,
    tenantId: input.tenantId,
    before: input.before ?? null,
    after: input.after ?? null,
    ip: p.ip,
  };
  // Indexes hold the whole entry so a filtered page is one list, no joins;
  // each expires after the tenant's audit retention (store/retention.ts).
  const ttl = { expireIn: retentionMs(input.tenantId, "audit") };
  op.set(k.audit(id), entry, ttl).set(k.auditByActor(p.id, id), entry, ttl);
  if (input.tenantId) op.set(k.auditByTenant(input.tenantId, id), entry, ttl);
  return op;
}

/** Filters for the audit list. */
export interface AuditFilter extends PageOptions {
  tenantId?: string;
  actorId?: string;
  /** An action (`key.rotate`) or, ending in a dot, its family (`key.`). */
  action?: string;
  /** Time range (epoch ms, inclusive). */
  from?: number;
  to?: number;
}

/** Most entries one page reads looking for matches (then it says where to go on). */
const MAX_SCAN = 2000;

/**
 * Lists audit entries, newest first. Tenant principals see only their
 * tenant's entries, whatever filter they pass. The narrowest index is
 * listed (tenant, then actor), over the time range; the other filters are
 * checked on each entry, reading at most MAX_SCAN entries a page (a page
 * may then be short, with a cursor to go on).
 */
export async function listAudit(
  kv: Deno.Kv,
  p: Principal,
  filter: AuditFilter = {},
): Promise<Page<AuditEntry>> {
  const tenantId = isPlatform(p) ? filter.tenantId : p.tenantId!;
  const action = filter.action?.trim() || undefined;
  if (action !== undefined && !/^[a-z_.]{1,64}$/.test(action)) {
    throw new ValidationError(
      "action must be an action such as key.rotate, or a family such as key.",
      "action",
    );
  }
  const prefix = tenantId
    ? k.auditByTenantPrefix(tenantId)
    : filter.actorId
    ? k.auditByActorPrefix(filter.actorId)
    : k.auditPrefix();
  const from = filter.from ?? 0;
  const to = filter.to ?? Number.MAX_SAFE_INTEGER; // a fixed bound: cursors stay valid
  if (to < from) throw new ValidationError("`to` is before `from`", "to");
  const matches = (e: AuditEntry) =>
    (!filter.actorId || e.actor.id === filter.actorId) &&
    (!action ||
      (action.endsWith(".")
        ? e.action.startsWith(action)
        : e.action === action));
  const limit = pageSize(filter.limit);
  const cursor = checkCursor(filter.cursor);
  const iter = kv.list<AuditEntry>({
    start: [...prefix, idBoundAt(from, false)],
    end: [...prefix, idBoundAt(to, true)],
  }, { cursor, reverse: true, batchSize: Math.min(500, limit * 4) });
  const items: AuditEntry[] = [];
  let scanned = 0;
  try {
    for await (const e of iter) {
      if (matches(e.value)) items.push(e.value);
      if (items.length === limit || ++scanned >= MAX_SCAN) {
        return { items, cursor: iter.cursor || null };
      }
    }
  } catch (err) {
    if (cursor) throw new ValidationError("cursor is invalid", "cursor");
    throw err;
  }
  return { items, cursor: null };
}
