import assert from "node:assert/strict";
import { api, createWorld } from "./_helpers.ts";

Deno.test("admin API: tenants can be created, read by id or slug, listed, renamed and suspended", async () => {
  const w = await createWorld();
  const { platform } = w.tokens;
  const created = await api(w, "POST", "/tenants", platform, {
    name: "Initech",
    slug: "initech",
  });
  assert.equal(created.status, 201);
  const t = await created.json();
  assert.equal(t.slug, "initech");
  assert.equal((await api(w, "GET", `/tenants/${t.id}`, platform)).status, 200);
  assert.equal(
    (await (await api(w, "GET", "/tenants/initech", platform)).json()).id,
    t.id,
  );
  const list = await (await api(w, "GET", "/tenants?limit=2", platform)).json();
  assert.equal(list.items.length, 2);
  assert.ok(list.cursor);
  const next = await (await api(
    w,
    "GET",
    `/tenants?limit=2&cursor=${encodeURIComponent(list.cursor)}`,
    platform,
  )).json();
  assert.equal(next.items.length, 1);
  const renamed = await (await api(w, "PATCH", `/tenants/${t.id}`, platform, {
    name: "Initrode",
  })).json();
  assert.equal(renamed.name, "Initrode");
  const suspended = await (await api(w, "PATCH", `/tenants/${t.id}`, platform, {
    status: "suspended",
  })).json();
  assert.equal(suspended.status, "suspended");
  const search = await (await api(w, "GET", "/tenants?search=initr", platform))
    .json();
  assert.deepEqual(search.items.map((x: { id: string }) => x.id), [t.id]);
  await w.close();
});

Deno.test("admin API: errors are JSON with status, message and field", async () => {
  const w = await createWorld();
  const { platform, adminA, viewerA } = w.tokens;
  const cases: [Response, number, string | null][] = [
    [await api(w, "GET", "/tenants", null), 401, null],
    [await api(w, "GET", "/tenants", "orchadm_bogus"), 401, null],
    [await api(w, "POST", "/tenants", platform, "{not json"), 400, "body"],
    [await api(w, "POST", "/tenants", platform, "[1,2]"), 400, "body"],
    [await api(w, "POST", "/tenants", platform, { name: "" }), 400, "name"],
    [
      await api(w, "POST", "/tenants", platform, { name: "x".repeat(5000) }),
      400,
      "name",
    ],
    [
      await api(w, "POST", "/tenants", platform, { name: "Dup", slug: "acme" }),
      409,
      "slug",
    ],
    [await api(w, "POST", "/tenants", adminA, { name: "Mine" }), 403, null],
    [await api(w, "GET", "/tenants/nope", platform), 404, null],
    [
      await api(w, "PUT", `/tenants/${w.tenantA.id}/limits`, platform, {
        rpm: "ten",
      }),
      400,
      "rpm",
    ],
    [
      await api(w, "PUT", `/tenants/${w.tenantA.id}/limits`, viewerA, {
        rpm: 10,
      }),
      403,
      null,
    ],
    [
      await api(w, "POST", `/tenants/${w.tenantA.id}/keys`, platform, {
        name: "k",
        scopes: [],
      }),
      400,
      "scopes",
    ],
    [await api(w, "DELETE", "/keys/unknown", platform), 404, null],
    [await api(w, "GET", "/tenants?limit=0", platform), 400, "limit"],
    [
      await api(
        w,
        "POST",
        "/tenants",
        platform,
        JSON.stringify({ name: "big", pad: "x".repeat(70_000) }),
      ),
      413,
      null,
    ],
    [
      await api(w, "POST", "/invites", platform, {
        email: "not-an-email",
        role: "tenant_admin",
        tenantId: w.tenantA.id,
      }),
      400,
      "email",
    ],
  ];
  for (const [res, status, field] of cases) {
    assert.equal(res.status, status, `${res.url}: ${await res.clone().text()}`);
    const body = await res.json();
    assert.equal(typeof body.error.message, "string");
    assert.ok(body.error.message.length > 0);
    assert.equal(body.error.field, field);
  }
  await w.close();
});

Deno.test("admin API: an unknown path is a JSON 404 with a token and 401 without; /healthz answers without auth", async () => {
  const w = await createWorld();
  try {
    const unknown = await api(w, "GET", "/no-such-thing", w.tokens.platform);
    assert.equal(unknown.status, 404);
    assert.match(unknown.headers.get("content-type") ?? "", /json/);
    assert.equal((await unknown.json()).error.code, "not_found");
    const anon = await api(w, "GET", "/no-such-thing", null);
    assert.equal(anon.status, 401);
    await anon.body?.cancel();
    const health = await w.app.request("/healthz");
    assert.equal(health.status, 200);
    assert.deepEqual(await health.json(), { status: "ok" });
  } finally {
    await w.close();
  }
});

Deno.test("admin API: limits and keys round-trip; the key appears only in the 201 response", async () => {
  const w = await createWorld();
  const { platform, adminA } = w.tokens;
  const limits = {
    rpm: 60,
    tpm: 100_000,
    concurrency: 4,
    tokensPerDay: 1_000_000,
    tokensPerMonth: null,
  };
  // a tenant's own admin cannot lift (or set) the limits the provider sells
  const lift = await api(
    w,
    "PUT",
    `/tenants/${w.tenantA.id}/limits`,
    adminA,
    { ...limits, rpm: null },
  );
  assert.equal(lift.status, 403);
  await lift.body?.cancel();
  const put = await api(
    w,
    "PUT",
    `/tenants/${w.tenantA.id}/limits`,
    platform,
    limits,
  );
  assert.equal(put.status, 200);
  assert.deepEqual(
    await (await api(w, "GET", `/tenants/acme/limits`, platform)).json(),
    limits,
  );
  const created = await api(
    w,
    "POST",
    `/tenants/${w.tenantA.id}/keys`,
    adminA,
    {
      name: "prod",
      scopes: ["chat"],
      models: ["llama-3"],
      limits: { rpm: 10 },
    },
  );
  assert.equal(created.status, 201);
  assert.equal(created.headers.get("cache-control"), "no-store");
  const key = await created.json();
  assert.match(key.key, /^orch_/);
  assert.deepEqual(key.limits, {
    rpm: 10,
    tpm: null,
    concurrency: null,
    tokensPerDay: null,
    tokensPerMonth: null,
  });
  const list =
    await (await api(w, "GET", `/tenants/${w.tenantA.id}/keys`, adminA)).text();
  assert.ok(!list.includes(key.key));
  assert.ok(list.includes(key.last4));
  const one = await (await api(w, "GET", `/keys/${key.id}`, adminA)).json();
  assert.equal(one.key, undefined);
  const revoked = await (await api(w, "DELETE", `/keys/${key.id}`, adminA))
    .json();
  assert.ok(revoked.revokedAt);
  const audit =
    await (await api(w, "GET", `/audit?tenant=${w.tenantA.id}`, platform))
      .json();
  assert.deepEqual(
    audit.items.slice(0, 3).map((e: { action: string }) => e.action),
    ["key.revoke", "key.create", "limits.set"],
  );
  assert.ok(!JSON.stringify(audit).includes(key.key));
  await w.close();
});

Deno.test("admin API: invites produce a one-time link; openapi.json documents every admin route", async () => {
  const w = await createWorld();
  const res = await api(w, "POST", "/invites", w.tokens.adminA, {
    email: "new@acme.test",
    role: "tenant_viewer",
    tenantId: w.tenantA.id,
  });
  assert.equal(res.status, 201);
  const inv = await res.json();
  assert.match(inv.link, /\/invite\/[0-9a-z]+\.[0-9A-Za-z]+$/);
  const other = await api(w, "POST", "/invites", w.tokens.adminA, {
    email: "x@b.test",
    role: "tenant_admin",
    tenantId: w.tenantB.id,
  });
  assert.equal(other.status, 404);
  const doc = await (await api(w, "GET", "/openapi.json", null)).json();
  assert.equal(doc.openapi, "3.1.0");
  const documented = new Set<string>();
  for (
    const [path, ops] of Object.entries(
      doc.paths as Record<string, Record<string, unknown>>,
    )
  ) {
    for (const m of Object.keys(ops)) {
      if (m !== "parameters") documented.add(`${m.toUpperCase()} ${path}`);
    }
  }
  for (const r of w.app.routes) {
    if (
      r.method === "ALL" || !r.path.startsWith("/api/admin/v1/") ||
      r.path.endsWith("openapi.json")
    ) continue;
    const path = r.path.slice("/api/admin/v1".length).replace(
      /:(\w+)/g,
      "{$1}",
    );
    assert.ok(
      documented.has(`${r.method} ${path}`),
      `undocumented: ${r.method} ${path}`,
    );
  }
  await w.close();
});

Deno.test("admin API: an admin token is created, works against the API, is listed without its secret, and stops at once when revoked", async () => {
  const w = await createWorld();
  try {
    const res = await api(w, "POST", "/admin-tokens", w.tokens.platform, {
      name: "deploy pipeline",
      role: "tenant_admin",
      tenantId: w.tenantA.id,
      expiresAt: new Date(Date.now() + 86_400_000).toISOString(),
    });
    assert.equal(res.status, 201);
    assert.equal(res.headers.get("cache-control"), "no-store");
    const created = await res.json();
    assert.match(created.token, /^orchadm_[0-9a-z]{26}_[0-9A-Za-z]{38}$/);
    assert.equal(created.role, "tenant_admin");
    assert.equal(created.tenantId, w.tenantA.id);
    // the new token works, with its role: its tenant only
    const own = await api(w, "GET", `/tenants/${w.tenantA.id}`, created.token);
    assert.equal(own.status, 200);
    await own.body?.cancel();
    const other = await api(
      w,
      "GET",
      `/tenants/${w.tenantB.id}`,
      created.token,
    );
    assert.equal(other.status, 404);
    await other.body?.cancel();
    const listText = await (await api(
      w,
      "GET",
      `/admin-tokens?tenant=acme`,
      w.tokens.platform,
    )).text();
    assert.ok(!listText.includes(created.token));
    assert.ok(!listText.includes('"hash"'));
    const listed = JSON.parse(listText).items.find((
      t: { id: string },
    ) => t.id === created.id);
    assert.equal(listed.name, "deploy pipeline");
    assert.ok(listed.lastUsedAt, "last used is filled");
    assert.equal(listed.expiresAt, created.expiresAt);
    const del = await api(
      w,
      "DELETE",
      `/admin-tokens/${created.id}`,
      w.tokens.platform,
    );
    assert.equal(del.status, 200);
    assert.ok((await del.json()).revokedAt);
    const after = await api(
      w,
      "GET",
      `/tenants/${w.tenantA.id}`,
      created.token,
    );
    assert.equal(after.status, 401);
    assert.equal((await after.json()).error.code, "unauthorized");
    const audit = await (await api(
      w,
      "GET",
      `/audit?tenant=${w.tenantA.id}`,
      w.tokens.platform,
    )).json();
    assert.deepEqual(
      audit.items.slice(0, 2).map((e: { action: string }) => e.action),
      ["admin_token.revoke", "admin_token.create"],
    );
    assert.ok(!JSON.stringify(audit).includes(created.token));
  } finally {
    await w.close();
  }
});

Deno.test("admin API: admin token errors are JSON; tenant tokens manage only their tenant's tokens", async () => {
  const w = await createWorld();
  try {
    const { platform, adminA, viewerA } = w.tokens;
    const bToken = await (await api(w, "POST", "/admin-tokens", platform, {
      name: "globex-ci",
      role: "tenant_admin",
      tenantId: w.tenantB.id,
    })).json();
    const cases: [Response, number, string | null][] = [
      [
        await api(w, "POST", "/admin-tokens", platform, { role: "x" }),
        400,
        "name",
      ],
      [
        await api(w, "POST", "/admin-tokens", platform, {
          name: "x",
          role: "tenant_admin",
        }),
        400,
        "tenantId",
      ],
      [
        await api(w, "POST", "/admin-tokens", adminA, {
          name: "x",
          role: "platform_admin",
        }),
        403,
        null,
      ],
      [
        await api(w, "POST", "/admin-tokens", adminA, {
          name: "x",
          role: "tenant_admin",
          tenantId: w.tenantB.id,
        }),
        404,
        null,
      ],
      [
        await api(w, "POST", "/admin-tokens", viewerA, {
          name: "x",
          role: "tenant_viewer",
          tenantId: w.tenantA.id,
        }),
        403,
        null,
      ],
      [await api(w, "GET", "/admin-tokens", viewerA), 403, null],
      [await api(w, "GET", "/admin-tokens?tenant=globex", adminA), 404, null],
      [await api(w, "DELETE", `/admin-tokens/${bToken.id}`, adminA), 404, null],
      [await api(w, "DELETE", "/admin-tokens/nope", platform), 404, null],
    ];
    for (const [res, status, field] of cases) {
      assert.equal(res.status, status, await res.clone().text());
      const body = await res.json();
      assert.equal(typeof body.error.message, "string");
      assert.equal(body.error.field, field);
    }
    const mine = await (await api(w, "GET", "/admin-tokens", adminA)).json();
    assert.deepEqual(
      mine.items.map((t: { name: string }) => t.name).sort(),
      ["a-admin", "a-viewer"],
    );
    // B's token still works
    const b = await api(w, "GET", `/tenants/${w.tenantB.id}`, bToken.token);
    assert.equal(b.status, 200);
    await b.body?.cancel();
  } finally {
    await w.close();
  }
});
