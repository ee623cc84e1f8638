/** Tenants: the client companies an operator serves. */
import { addAudit } from "./audit.ts";
import { commitAuthChange } from "./auth_epoch.ts";
import { ConflictError, NotFoundError } from "./errors.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { listPage, type Page, type PageOptions } from "./pagination.ts";
import {
  isPlatform,
  type Principal,
  requirePlatform,
  requireTenantRead,
  requireTenantWrite,
} from "./principal.ts";
import {
  parse,
  slug as slugSchema,
  tenantCreateSchema,
  tenantPatchSchema,
} from "./schemas.ts";
import type { Store } from "./store.ts";

/** A client company. */
export interface Tenant {
  id: string;
  name: string;
  slug: string;
  status: "active" | "suspended";
  /**
   * With nodes dedicated to it (store/nodes.ts `dedicatedTo`): whether its
   * requests may go to shared nodes when its own have no free slot or are
   * down (default false: only its own). Without dedicated nodes: unused.
   */
  overflowToShared?: boolean;
  /**
   * Set when a platform admin deleted the tenant: it is suspended at once
   * and its data is removed at `purgeAt` (store/retention.ts).
   */
  deletion?: { requestedAt: string; purgeAt: string; by: string };
  createdAt: string;
  updatedAt: string;
}

/** Derives a slug from a name ("Acme Corp." → "acme-corp"). */
export function slugify(name: string): string {
  const s = name.normalize("NFKD").replace(/[\u0300-\u036f]/g, "")
    .toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-+|-+$/g, "")
    .slice(0, 48).replace(/-+$/, "");
  return s || "tenant";
}

/** Creates a tenant; a taken slug is a 409 (exactly one of concurrent creators wins). */
export async function createTenant(
  store: Store,
  p: Principal,
  input: unknown,
): Promise<Tenant> {
  requirePlatform(p);
  const data = parse(tenantCreateSchema, input);
  const slug = data.slug ?? parse(slugSchema, slugify(data.name));
  const now = new Date().toISOString();
  const tenant: Tenant = {
    id: newId(),
    name: data.name,
    slug,
    status: "active",
    createdAt: now,
    updatedAt: now,
  };
  const op = store.kv.atomic()
    .check({ key: k.tenantBySlug(slug), versionstamp: null })
    .set(k.tenant(tenant.id), tenant)
    .set(k.tenantBySlug(slug), tenant.id)
    .set(k.tenantByName(nameKey(tenant.name), tenant.id), tenant.id);
  addAudit(op, p, {
    action: "tenant.create",
    target: { type: "tenant", id: tenant.id, label: tenant.name },
    tenantId: tenant.id,
    after: tenant,
  });
  const res = await op.commit();
  if (!res.ok) {
    throw new ConflictError(`The slug "${slug}" is already taken`, "slug");
  }
  return tenant;
}

function nameKey(name: string): string {
  return name.toLowerCase().slice(0, 100);
}

/** Reads a tenant without access checks (gateway and internal use). */
export async function getTenantRaw(
  store: Store,
  id: string,
): Promise<Tenant | null> {
  if (!id || id.length > 64) return null;
  return (await store.kv.get<Tenant>(k.tenant(id))).value;
}

/** Reads a tenant the principal may see; 404 otherwise. */
export async function getTenant(
  store: Store,
  p: Principal,
  id: string,
): Promise<Tenant> {
  requireTenantRead(p, id);
  const t = await getTenantRaw(store, id);
  if (!t) throw new NotFoundError("Tenant");
  return t;
}

/** Finds a tenant by id or slug, for the CLI and URLs. */
export async function findTenant(
  store: Store,
  p: Principal,
  idOrSlug: string,
): Promise<Tenant> {
  if (idOrSlug.length <= 64) {
    const bySlug = await store.kv.get<string>(k.tenantBySlug(idOrSlug));
    if (bySlug.value) return getTenant(store, p, bySlug.value);
  }
  return getTenant(store, p, idOrSlug);
}

/** Lists tenants the principal may see; `search` matches a name prefix. */
export async function listTenants(
  store: Store,
  p: Principal,
  opts: PageOptions & { search?: string } = {},
): Promise<Page<Tenant>> {
  if (!isPlatform(p)) {
    const own = await getTenantRaw(store, p.tenantId!);
    const q = opts.search?.trim().toLowerCase();
    const match = own && (!q || own.name.toLowerCase().startsWith(q) ||
      own.slug.startsWith(q));
    return { items: match ? [own] : [], cursor: null };
  }
  const search = opts.search?.trim().toLowerCase().slice(0, 100);
  if (search) {
    return listPage<string, Tenant>(
      store.kv,
      {
        start: [...k.tenantByNamePrefix(), search],
        end: [...k.tenantByNamePrefix(), search + "\uffff"],
      },
      opts,
      (id) => getTenantRaw(store, id),
    );
  }
  return listPage<Tenant, Tenant>(
    store.kv,
    { prefix: k.tenantPrefix() },
    opts,
    (t) => t,
  );
}

/** Renames, suspends or resumes a tenant (platform admins only). */
export async function updateTenant(
  store: Store,
  p: Principal,
  id: string,
  input: unknown,
): Promise<Tenant> {
  requireTenantWrite(p, id);
  requirePlatform(p);
  const patch = parse(tenantPatchSchema, input);
  const entry = await store.kv.get<Tenant>(k.tenant(id));
  const before = entry.value;
  if (!before) throw new NotFoundError("Tenant");
  if (before.deletion && patch.status === "active") {
    throw new ConflictError(
      "This tenant is being deleted; cancel the deletion before resuming it",
      "status",
    );
  }
  const after: Tenant = {
    ...before,
    ...(patch.name !== undefined ? { name: patch.name } : {}),
    ...(patch.status !== undefined ? { status: patch.status } : {}),
    ...(patch.overflowToShared !== undefined
      ? { overflowToShared: patch.overflowToShared }
      : {}),
    updatedAt: new Date().toISOString(),
  };
  const op = store.kv.atomic().check(entry).set(
    k.tenant(id),
    after,
  );
  if (after.name !== before.name) {
    op.delete(k.tenantByName(nameKey(before.name), id))
      .set(k.tenantByName(nameKey(after.name), id), id);
  }
  const action = patch.status && patch.status !== before.status
    ? (patch.status === "suspended" ? "tenant.suspend" : "tenant.resume")
    : "tenant.update";
  addAudit(op, p, {
    action,
    target: { type: "tenant", id, label: after.name },
    tenantId: id,
    before,
    after,
  });
  if (!(await commitAuthChange(store.kv, op)).ok) {
    throw new ConflictError("The tenant changed meanwhile; try again");
  }
  return after;
}
