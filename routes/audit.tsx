/** The audit log, filterable by tenant and actor. */
import { Hono } from "hono";
import { Card, Pager, Table, Time } from "../components/ui.tsx";
import { listAudit } from "../store/audit.ts";
import { isPlatform } from "../store/principal.ts";
import type { PortalEnv } from "./_env.ts";
import { page } from "./_page.tsx";

/** `/audit`. */
export const auditRoutes = new Hono<PortalEnv>().get("/", async (c) => {
  const p = c.get("principal")!;
  const tenantId = (c.req.query("tenant") ?? "").slice(0, 64) || undefined;
  const actorId = (c.req.query("actor") ?? "").slice(0, 64) || undefined;
  const cursor = c.req.query("cursor") ?? null;
  const data = await listAudit(c.get("deps").store.kv, p, {
    tenantId,
    actorId,
    cursor,
    limit: 50,
  });
  const qs = new URLSearchParams();
  if (tenantId) qs.set("tenant", tenantId);
  if (actorId) qs.set("actor", actorId);
  if (data.cursor) qs.set("cursor", data.cursor);
  return page(
    c,
    "Audit log",
    "/audit",
    (
      <>
        <h1>Audit log</h1>
        <p class="sub">Every admin change: who, what, when and from where.</p>
        <Card>
          <form method="get" action="/audit" class="row">
            {isPlatform(p) && (
              <div class="field">
                <label for="tenant">Tenant id</label>
                <input
                  id="tenant"
                  type="text"
                  name="tenant"
                  value={tenantId ?? ""}
                />
              </div>
            )}
            <div class="field">
              <label for="actor">Actor id</label>
              <input
                id="actor"
                type="text"
                name="actor"
                value={actorId ?? ""}
              />
            </div>
            <div class="field" style="flex:0">
              <button type="submit">Filter</button>
            </div>
          </form>
          <Table
            head={["Time", "Actor", "Action", "Target", "Tenant", "Source IP"]}
            rows={data.items.length}
            empty="No entries."
          >
            {data.items.map((e) => (
              <tr key={e.id}>
                <td class="time">
                  <Time iso={e.at} />
                </td>
                <td>
                  <a href={`/audit?actor=${e.actor.id}`}>{e.actor.label}</a>
                </td>
                <td class="mono nowrap">{e.action}</td>
                <td>
                  {e.target.type} {e.target.label ?? ""}{" "}
                  <span class="muted mono trunc" title={e.target.id}>
                    {e.target.id}
                  </span>
                </td>
                <td class="mono">
                  {e.tenantId
                    ? (
                      <a
                        class="trunc"
                        title={e.tenantId}
                        href={`/audit?tenant=${e.tenantId}`}
                      >
                        {e.tenantId}
                      </a>
                    )
                    : "—"}
                </td>
                <td class="mono nowrap">{e.ip ?? "—"}</td>
              </tr>
            ))}
          </Table>
          <Pager next={data.cursor ? `/audit?${qs}` : null} />
        </Card>
      </>
    ),
  );
});
