import assert from "node:assert/strict";
import {
  ConflictError,
  ForbiddenError,
  NotFoundError,
  ValidationError,
} from "./errors.ts";
import { type Principal, SYSTEM } from "./principal.ts";
import { createStore } from "./store.ts";
import {
  createTenant,
  getTenant,
  listTenants,
  slugify,
  updateTenant,
} from "./tenants.ts";
import { listAudit } from "./audit.ts";

async function setup() {
  const kv = await Deno.openKv(":memory:");
  return { kv, store: await createStore(kv) };
}

Deno.test("createTenant() lets exactly one of 20 concurrent creators of a slug win", async () => {
  const { kv, store } = await setup();
  const results = await Promise.allSettled(
    Array.from(
      { length: 20 },
      (_, i) =>
        createTenant(store, SYSTEM, { name: `Acme ${i}`, slug: "acme" }),
    ),
  );
  const won = results.filter((r) => r.status === "fulfilled");
  const lost = results.filter((r) => r.status === "rejected");
  assert.equal(won.length, 1);
  assert.equal(lost.length, 19);
  for (const r of lost) {
    assert.ok((r as PromiseRejectedResult).reason instanceof ConflictError);
  }
  const all = await listTenants(store, SYSTEM, { limit: 100 });
  assert.equal(all.items.length, 1);
  kv.close();
});

Deno.test("createTenant() validates names and slugs with per-field messages", async () => {
  const { kv, store } = await setup();
  await assert.rejects(
    createTenant(store, SYSTEM, { name: "" }),
    (e: ValidationError) => e.field === "name",
  );
  await assert.rejects(
    createTenant(store, SYSTEM, { name: "x".repeat(101) }),
    (e: ValidationError) => e.field === "name",
  );
  await assert.rejects(
    createTenant(store, SYSTEM, { name: "ok", slug: "-bad-" }),
    (e: ValidationError) => e.field === "slug",
  );
  await assert.rejects(
    createTenant(store, SYSTEM, { name: "ok", extra: 1 }),
    ValidationError,
  );
  assert.equal(slugify("Ácme Corp. (EU)"), "acme-corp-eu");
  kv.close();
});

Deno.test("listTenants() pages with cursors and searches by name prefix", async () => {
  const { kv, store } = await setup();
  for (let i = 0; i < 7; i++) {
    await createTenant(store, SYSTEM, { name: `Tenant ${i}` });
  }
  await createTenant(store, SYSTEM, { name: "Zeta Labs" });
  const first = await listTenants(store, SYSTEM, { limit: 5 });
  assert.equal(first.items.length, 5);
  assert.ok(first.cursor);
  const second = await listTenants(store, SYSTEM, {
    limit: 5,
    cursor: first.cursor,
  });
  assert.equal(second.items.length, 3);
  assert.equal(second.cursor, null);
  const ids = new Set([...first.items, ...second.items].map((t) => t.id));
  assert.equal(ids.size, 8);
  const found = await listTenants(store, SYSTEM, { search: "zeta" });
  assert.deepEqual(found.items.map((t) => t.name), ["Zeta Labs"]);
  await assert.rejects(
    listTenants(store, SYSTEM, { cursor: "not a cursor!" }),
    ValidationError,
  );
  kv.close();
});

Deno.test("updateTenant() renames atomically, audits, and hides other tenants with 404", async () => {
  const { kv, store } = await setup();
  const a = await createTenant(store, SYSTEM, { name: "Acme" });
  const b = await createTenant(store, SYSTEM, { name: "Globex" });
  const renamed = await updateTenant(store, SYSTEM, a.id, {
    name: "Acme Europe",
  });
  assert.equal(renamed.name, "Acme Europe");
  assert.deepEqual(
    (await listTenants(store, SYSTEM, { search: "acme e" })).items.map((t) =>
      t.id
    ),
    [a.id],
  );
  assert.equal(
    (await listTenants(store, SYSTEM, { search: "acme" })).items.length,
    1,
  );
  const adminA: Principal = {
    kind: "user",
    id: "u1",
    label: "a",
    role: "tenant_admin",
    tenantId: a.id,
    ip: null,
  };
  await assert.rejects(getTenant(store, adminA, b.id), NotFoundError);
  await assert.rejects(
    updateTenant(store, adminA, b.id, { name: "x" }),
    NotFoundError,
  );
  await assert.rejects(
    updateTenant(store, adminA, a.id, { status: "suspended" }),
    ForbiddenError,
  );
  const audit = await listAudit(kv, SYSTEM, { tenantId: a.id });
  assert.deepEqual(audit.items.map((e) => e.action), [
    "tenant.update",
    "tenant.create",
  ]);
  const auditAsA = await listAudit(kv, adminA, { tenantId: b.id });
  assert.ok(auditAsA.items.every((e) => e.tenantId === a.id));
  kv.close();
});
