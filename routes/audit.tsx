/**
 * The audit log, filterable by actor, action, tenant and time (UTC), each
 * entry's before/after shown as the fields that changed.
 */
import { Hono } from "hono";
import {
  Alert,
  Card,
  FilterRangeAndButtons,
  Pager,
  Table,
  Time,
} from "../components/ui.tsx";
import { type AuditEntry, listAudit } from "../store/audit.ts";
import { ServiceError } from "../store/errors.ts";
import type { Page } from "../store/pagination.ts";
import { isPlatform } from "../store/principal.ts";
import { parseLogTime } from "../store/request_log.ts";
import type { PortalEnv } from "./_env.ts";
import { portalMessage } from "./_messages.ts";
import { page } from "./_page.tsx";

const FILTERS = ["tenant", "actor", "action", "from", "to"] as const;

/** Action families offered in the filter (any exact action can be typed too). */
const FAMILIES = [
  "tenant.",
  "key.",
  "limits.",
  "user.",
  "invite.",
  "admin_token.",
  "budget.",
  "webhook.",
  "node.",
  "settings.",
];

function show(v: unknown): string {
  if (v === undefined) return "—";
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}

/**
 * The fields of before/after that differ, one level deep (nested objects
 * compared as JSON): what a reader wants from a change, not two blobs.
 */
export function auditDiff(
  before: unknown,
  after: unknown,
): { field: string; before: string; after: string }[] {
  const obj = (v: unknown) =>
    v && typeof v === "object" && !Array.isArray(v)
      ? v as Record<string, unknown>
      : null;
  const b = obj(before);
  const a = obj(after);
  if (!b || !a) {
    if (before === null && after === null) return [];
    return JSON.stringify(before) === JSON.stringify(after) ? [] : [{
      field: "(value)",
      before: show(before ?? undefined),
      after: show(after ?? undefined),
    }];
  }
  const out: { field: string; before: string; after: string }[] = [];
  for (const f of new Set([...Object.keys(b), ...Object.keys(a)])) {
    if (JSON.stringify(b[f]) === JSON.stringify(a[f])) continue;
    out.push({ field: f, before: show(b[f]), after: show(a[f]) });
  }
  return out;
}

function Diff(props: { e: AuditEntry }) {
  const rows = auditDiff(props.e.before, props.e.after);
  if (rows.length === 0) return <span class="muted">—</span>;
  return (
    <details data-diff>
      <summary>
        {rows.length} field{rows.length === 1 ? "" : "s"}:{" "}
        {rows.slice(0, 3).map((r) => r.field).join(", ")}
        {rows.length > 3 ? ", …" : ""}
      </summary>
      <table class="diff">
        <thead>
          <tr>
            <th>Field</th>
            <th>Before</th>
            <th>After</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((r) => (
            <tr key={r.field} data-field={r.field}>
              <td class="mono">{r.field}</td>
              <td class="mono before">{r.before}</td>
              <td class="mono after">{r.after}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </details>
  );
}

/** `/audit`. */
export const auditRoutes = new Hono<PortalEnv>().get("/", async (c) => {
  const p = c.get("principal")!;
  const q: Record<string, string> = {};
  for (const f of FILTERS) q[f] = (c.req.query(f) ?? "").trim().slice(0, 64);
  let data: Page<AuditEntry> = { items: [], cursor: null };
  let error: string | null = null;
  try {
    data = await listAudit(c.get("deps").store.kv, p, {
      tenantId: q.tenant || undefined,
      actorId: q.actor || undefined,
      action: q.action || undefined,
      from: parseLogTime(q.from, "from"),
      to: parseLogTime(q.to, "to", true),
      cursor: c.req.query("cursor") ?? null,
      limit: 50,
    });
  } catch (err) {
    if (!(err instanceof ServiceError) || err.status !== 400) throw err;
    error = portalMessage(err);
  }
  const qs = new URLSearchParams();
  for (const f of FILTERS) if (q[f]) qs.set(f, q[f]!);
  const link = (name: string, value: string) => {
    const u = new URLSearchParams(qs);
    u.set(name, value);
    return `/audit?${u}`;
  };
  const next = data.cursor
    ? `/audit?${new URLSearchParams([...qs, ["cursor", data.cursor]])}`
    : null;
  return page(
    c,
    "Audit log",
    "/audit",
    (
      <>
        <h1>Audit log</h1>
        <p class="sub">
          Every admin change: who, what, when (UTC) and from where, with what
          changed.
        </p>
        <Card>
          <form
            method="get"
            action="/audit"
            class="row"
            id="audit-filter"
            style="align-items:flex-end"
          >
            {isPlatform(p) && (
              <div class="field">
                <label for="a-tenant">Tenant id</label>
                <input
                  id="a-tenant"
                  type="text"
                  name="tenant"
                  value={q.tenant}
                />
              </div>
            )}
            <div class="field">
              <label for="a-actor">Actor id</label>
              <input id="a-actor" type="text" name="actor" value={q.actor} />
            </div>
            <div class="field">
              <label for="a-action">Action</label>
              <input
                id="a-action"
                type="text"
                name="action"
                list="a-actions"
                placeholder="key. or key.rotate"
                value={q.action}
              />
              <datalist id="a-actions">
                {FAMILIES.map((f) => <option key={f} value={f} />)}
              </datalist>
            </div>
            <FilterRangeAndButtons
              idPrefix="a"
              from={q.from}
              to={q.to}
              clearHref="/audit"
            />
          </form>
          {error && <Alert tone="error">{error}</Alert>}
          <Table
            head={[
              "Time",
              "Actor",
              "Action",
              "Target",
              "Tenant",
              "Changes",
              "Source IP",
            ]}
            rows={data.items.length}
            empty={qs.size > 0
              ? "No entries match these filters."
              : "No entries."}
          >
            {data.items.map((e) => (
              <tr key={e.id} data-audit={e.action}>
                <td class="time">
                  <Time iso={e.at} />
                </td>
                <td>
                  <a href={link("actor", e.actor.id)}>{e.actor.label}</a>
                </td>
                <td class="mono nowrap">
                  <a href={link("action", e.action)}>{e.action}</a>
                </td>
                <td>
                  {e.target.type} {e.target.label ?? ""}{" "}
                  <span class="muted mono trunc" title={e.target.id}>
                    {e.target.id}
                  </span>
                </td>
                <td class="mono">
                  {e.tenantId && isPlatform(p)
                    ? (
                      <a
                        class="trunc"
                        title={e.tenantId}
                        href={link("tenant", e.tenantId)}
                      >
                        {e.tenantId}
                      </a>
                    )
                    : e.tenantId ?? "—"}
                </td>
                <td>
                  <Diff e={e} />
                </td>
                <td class="mono nowrap">{e.ip ?? "—"}</td>
              </tr>
            ))}
          </Table>
          <Pager next={next} />
        </Card>
      </>
    ),
    error ? 400 : 200,
  );
});
