/** Tenants list (search, pages) and creation. */
import { Hono } from "hono";
import {
  Alert,
  Badge,
  Card,
  Field,
  Pager,
  PostForm,
  Table,
  Time,
} from "../components/ui.tsx";
import { ServiceError } from "../store/errors.ts";
import { isPlatform } from "../store/principal.ts";
import { createTenant, listTenants } from "../store/tenants.ts";
import type { PortalEnv } from "./_env.ts";
import { FlashMessages, redirectWithFlash, takeFlash } from "./_flash.tsx";
import { portalMessage } from "./_messages.ts";
import { page, str } from "./_page.tsx";

/** `/tenants` pages. */
export const tenantRoutes = new Hono<PortalEnv>()
  .get("/", async (c) => {
    const p = c.get("principal")!;
    if (!isPlatform(p)) return c.redirect(`/tenants/${p.tenantId}`, 303);
    return await listView(c, await takeFlash(c));
  })
  .post("/", async (c) => {
    const body = await c.req.parseBody();
    try {
      const t = await createTenant(c.get("deps").store, c.get("principal")!, {
        name: str(body.name),
        ...(str(body.slug) ? { slug: str(body.slug) } : {}),
      });
      return await redirectWithFlash(c, `/tenants/${t.id}`, {
        ok: `Tenant "${t.name}" created.`,
      });
    } catch (err) {
      if (!(err instanceof ServiceError)) throw err;
      return await listView(c, {
        error: portalMessage(err),
        field: err.field,
        name: str(body.name),
        slug: str(body.slug),
      }, err.status === 409 ? 409 : 400);
    }
  });

async function listView(
  // deno-lint-ignore no-explicit-any
  c: any,
  form: {
    error?: string;
    field?: string;
    name?: string;
    slug?: string;
    ok?: string;
    again?: boolean;
  },
  status: 200 | 400 | 409 = 200,
) {
  const q = (c.req.query("q") ?? "").slice(0, 100);
  const cursor = c.req.query("cursor") ?? null;
  const pageData = await listTenants(c.get("deps").store, c.get("principal")!, {
    search: q,
    cursor,
    limit: 25,
  });
  const next = pageData.cursor
    ? `/tenants?q=${encodeURIComponent(q)}&cursor=${
      encodeURIComponent(pageData.cursor)
    }`
    : null;
  return page(
    c,
    "Tenants",
    "/tenants",
    (
      <>
        <h1>Tenants</h1>
        <p class="sub">Client companies served by this cluster.</p>
        <FlashMessages flash={{ ok: form.ok, again: form.again }} />
        <div class="grid2">
          <Card title="All tenants">
            <form method="get" action="/tenants" class="row" role="search">
              <div class="field">
                <label for="q">Search by name</label>
                <input
                  id="q"
                  type="search"
                  name="q"
                  value={q}
                  placeholder="Name starts with…"
                />
              </div>
              <div class="field" style="flex:0">
                <button type="submit">Search</button>
              </div>
            </form>
            <Table
              head={["Name", "Slug", "Status", "Created"]}
              rows={pageData.items.length}
              empty={q ? "No tenant matches." : "No tenants yet."}
            >
              {pageData.items.map((t) => (
                <tr key={t.id}>
                  <td>
                    <a class="trunc" title={t.name} href={`/tenants/${t.id}`}>
                      {t.name}
                    </a>
                  </td>
                  <td class="mono">
                    <span class="trunc" title={t.slug}>{t.slug}</span>
                  </td>
                  <td>
                    <Badge tone={t.status === "active" ? "ok" : "danger"}>
                      {t.status}
                    </Badge>
                  </td>
                  <td class="time">
                    <Time iso={t.createdAt} />
                  </td>
                </tr>
              ))}
            </Table>
            <Pager next={next} />
          </Card>
          <Card title="New tenant">
            {form.error && form.field !== "name" && form.field !== "slug" && (
              <Alert tone="error">{form.error}</Alert>
            )}
            <PostForm action="/tenants" csrf={c.get("csrf")}>
              <Field
                label="Name"
                name="name"
                value={form.name}
                required
                maxLength={100}
                error={form.field === "name" ? form.error : undefined}
              />
              <Field
                label="Slug"
                name="slug"
                value={form.slug}
                hint="optional; derived from the name"
                maxLength={48}
                error={form.field === "slug" ? form.error : undefined}
              />
              <button class="primary" type="submit">Create tenant</button>
            </PostForm>
          </Card>
        </div>
      </>
    ),
    status,
  );
}
