/**
 * Who is acting, and the access rules every service function applies.
 * Objects of a tenant the principal cannot see answer 404, never 403, so
 * their existence does not leak.
 */
import { ForbiddenError, NotFoundError } from "./errors.ts";

/** Roles, from most to least powerful. */
export type Role = "platform_admin" | "tenant_admin" | "tenant_viewer";

/** The authenticated actor of a request or CLI call. */
export interface Principal {
  kind: "user" | "token" | "system";
  /** User id, admin-token id, or "system". */
  id: string;
  /** A human label for the audit log (email, token name). */
  label: string;
  role: Role;
  /** The tenant a tenant admin/viewer belongs to; null for platform admins. */
  tenantId: string | null;
  /** Source IP, recorded in the audit log. */
  ip: string | null;
}

/** The principal for start-up work done by the server itself. */
export const SYSTEM: Principal = {
  kind: "system",
  id: "system",
  label: "system",
  role: "platform_admin",
  tenantId: null,
  ip: null,
};

/** Whether the principal is a platform admin. */
export function isPlatform(p: Principal): boolean {
  return p.role === "platform_admin";
}

/** Whether the principal may see objects of `tenantId`. */
export function canSeeTenant(p: Principal, tenantId: string): boolean {
  return isPlatform(p) || p.tenantId === tenantId;
}

/** Throws 404 unless the principal may see `tenantId`. */
export function requireTenantRead(
  p: Principal,
  tenantId: string,
  what = "Tenant",
): void {
  if (!canSeeTenant(p, tenantId)) throw new NotFoundError(what);
}

/** Throws 404 unless visible, 403 unless the principal may change it. */
export function requireTenantWrite(
  p: Principal,
  tenantId: string,
  what = "Tenant",
): void {
  requireTenantRead(p, tenantId, what);
  if (p.role === "tenant_viewer") {
    throw new ForbiddenError("Viewers cannot change anything");
  }
}

/** Throws 403 unless the principal is a platform admin. */
export function requirePlatform(p: Principal): void {
  if (!isPlatform(p)) {
    throw new ForbiddenError("Only platform admins can do this");
  }
}
