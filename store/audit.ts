/** The append-only audit log: every admin mutation, who, what, when, from where. */
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { listPage, type Page, type PageOptions } from "./pagination.ts";
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
}

/**
 * Lists audit entries, newest first. Tenant principals see only their
 * tenant's entries, whatever filter they pass.
 */
export function listAudit(
  kv: Deno.Kv,
  p: Principal,
  filter: AuditFilter = {},
): Promise<Page<AuditEntry>> {
  const tenantId = isPlatform(p) ? filter.tenantId : p.tenantId!;
  const opts = { ...filter, reverse: true };
  if (tenantId) {
    return listPage<AuditEntry, AuditEntry>(
      kv,
      { prefix: k.auditByTenantPrefix(tenantId) },
      opts,
      (e) => (filter.actorId && e.actor.id !== filter.actorId ? null : e),
    );
  }
  if (filter.actorId) {
    return listPage<AuditEntry, AuditEntry>(
      kv,
      { prefix: k.auditByActorPrefix(filter.actorId) },
      opts,
      (e) => e,
    );
  }
  return listPage<AuditEntry, AuditEntry>(
    kv,
    { prefix: k.auditPrefix() },
    opts,
    (e) => e,
  );
}
