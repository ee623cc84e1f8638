/**
 * Which tenants may still sign in with a password. A platform admin turns
 * password sign-in off for a tenant whose users come through its identity
 * provider (SSO); platform admins themselves always keep their passwords.
 */
import { addAudit } from "./audit.ts";
import { ConflictError, ForbiddenError, NotFoundError } from "./errors.ts";
import { k } from "./kv_keys.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";

/** 403: the user's tenant signs in through its identity provider only. */
export class PasswordSignInOffError extends ForbiddenError {
  constructor() {
    super(
      "Your organisation signs in with single sign-on: use its button on the sign-in page.",
    );
  }
}

/** Whether the tenant's users may sign in with a password. */
export async function passwordSignInAllowed(
  store: Store,
  tenantId: string | null,
): Promise<boolean> {
  if (!tenantId) return true;
  return (await store.kv.get(k.tenantPasswordOff(tenantId))).value === null;
}

/** Ids of the tenants whose password sign-in is off. */
export async function listPasswordOffTenants(store: Store): Promise<string[]> {
  const out: string[] = [];
  for await (
    const e of store.kv.list({ prefix: k.tenantPasswordOffPrefix() })
  ) out.push(String(e.key[1]));
  return out;
}

/** Turns a tenant's password sign-in on or off (platform admins; audited). */
export async function setPasswordSignIn(
  store: Store,
  p: Principal,
  tenantId: string,
  allowed: boolean,
): Promise<void> {
  requirePlatform(p);
  const tenant = await getTenantRaw(store, tenantId);
  if (!tenant) throw new NotFoundError("Tenant");
  const entry = await store.kv.get(k.tenantPasswordOff(tenantId));
  const before = entry.value === null;
  if (before === allowed) return;
  const op = store.kv.atomic().check(entry);
  if (allowed) op.delete(entry.key);
  else op.set(entry.key, { since: new Date().toISOString(), by: p.id });
  addAudit(op, p, {
    action: allowed
      ? "tenant.password_sign_in.enable"
      : "tenant.password_sign_in.disable",
    target: { type: "tenant", id: tenant.id, label: tenant.name },
    tenantId: tenant.id,
    before: { passwordSignIn: before },
    after: { passwordSignIn: allowed },
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The setting changed meanwhile; try again");
  }
}
