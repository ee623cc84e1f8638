/**
 * `/tenants/:id/statements/:month`: a tenant's monthly statement (token
 * charges plus its share of node energy and hardware) and its CSV.
 */
import {
  getTenantRetention,
  RETENTION_KINDS,
  RETENTION_LABELS,
} from "../store/retention.ts";
import { Hono } from "hono";
import type { Context } from "hono";
import { fmtInt, Stats } from "../components/dashboard.tsx";
import { Alert, Card, Table } from "../components/ui.tsx";
import { ServiceError } from "../store/errors.ts";
import { formatMoney } from "../store/money.ts";
import { getTenant } from "../store/tenants.ts";
import {
  buildStatement,
  type Statement,
  statementCsv,
} from "../store/statements.ts";
import { monthOf } from "../store/usage_month.ts";
import type { PortalEnv } from "./_env.ts";
import { portalMessage } from "./_messages.ts";
import { page } from "./_page.tsx";

type C = Context<PortalEnv>;

function shiftMonth(month: string, by: number): string {
  const [y, m] = month.split("-").map(Number) as [number, number];
  return monthOf(Date.UTC(y, m - 1 + by, 1));
}

function body(s: Statement) {
  const money = (micro: number) => `${formatMoney(micro)} ${s.currency}`;
  return (
    <>
      <Stats
        items={[
          ["Requests", fmtInt(s.requests)],
          ["Prompt tokens", fmtInt(s.promptTokens)],
          ["Completion tokens", fmtInt(s.completionTokens)],
          ["Busy time", `${(s.busyMs / 3_600_000).toFixed(2)} h`],
          [
            "Total",
            <span key="t" class="num" data-testid="statement-total">
              {money(s.totalMicro)}
            </span>,
          ],
        ]}
      />
      {s.notes.map((n) => <Alert key={n} tone="warn">{n}</Alert>)}
      <Card title="Lines">
        <Table
          head={["Item", "Quantity", "Unit price", "Amount"]}
          rows={s.lines.length}
          empty="Nothing to charge this month."
        >
          {s.lines.map((l, i) => (
            <tr key={i} data-kind={l.kind}>
              <td class="wrap-text">{l.description}</td>
              <td class="num">
                {l.unit === "tokens"
                  ? fmtInt(l.quantity)
                  : l.quantity.toFixed(3)} {l.unit}
              </td>
              <td class="num">
                {l.unitPriceMicro === null
                  ? "share"
                  : `${formatMoney(l.unitPriceMicro, 4)} / ${
                    l.unit === "tokens" ? "1M tokens" : l.unit
                  }`}
              </td>
              <td class="num">{money(l.amountMicro)}</td>
            </tr>
          ))}
          <tr class="total">
            <td colSpan={3}>Total</td>
            <td class="num">{money(s.totalMicro)}</td>
          </tr>
        </Table>
        <p class="muted" style="margin-top:12px">
          Node costs use each node's busy time (the sum of the latencies of the
          requests it served). Each line is rounded to the cent; the total is
          the sum of the lines.
        </p>
      </Card>
    </>
  );
}

/** The month picker: months from the tenant's first to this one. */
function MonthPicker(
  props: { tenantId: string; month: string; first: string; last: string },
) {
  return (
    <form
      method="get"
      action={`/tenants/${props.tenantId}/statements`}
      class="row"
      style="align-items:flex-end"
    >
      <div class="field" style="flex:0">
        <label for="month">Month</label>
        <input
          id="month"
          type="month"
          name="month"
          min={props.first}
          max={props.last}
          value={props.month >= props.first && props.month <= props.last
            ? props.month
            : props.last}
          required
        />
      </div>
      <div class="field" style="flex:0">
        <button type="submit" class="small">Show</button>
      </div>
    </form>
  );
}

async function view(c: C) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const tenant = await getTenant(store, p, c.req.param("id")!);
  const month = c.req.param("month")!.slice(0, 20);
  const retention = await getTenantRetention(store, p, tenant.id);
  const valid = /^\d{4}-(0[1-9]|1[0-2])$/.test(month);
  const first = monthOf(Date.parse(tenant.createdAt));
  const last = monthOf(Date.now());
  // before the tenant existed there is nothing to bill: say so, not a page of zeros
  const before = valid && month < first;
  let s: Statement | null = null;
  let error: string | null = null;
  if (!before) {
    try {
      s = await buildStatement(store, p, tenant.id, month);
    } catch (err) {
      if (!(err instanceof ServiceError) || err.status !== 400) throw err;
      error = portalMessage(err);
    }
  }
  return page(
    c,
    `Statement ${valid ? month : ""}`,
    "/usage",
    (
      <>
        <h1>Statement {valid ? month : ""}</h1>
        <p class="sub">
          <a href={`/tenants/${tenant.id}`}>{tenant.name}</a>
          {s && (
            <>
              {" · "}
              {s.period.from.slice(0, 10)} – {s.period.to.slice(0, 16).replace(
                "T",
                " ",
              )} UTC{s.period.complete ? "" : " (month to date)"}
            </>
          )}
        </p>
        <MonthPicker
          tenantId={tenant.id}
          month={month}
          first={first}
          last={last}
        />
        <p class="row">
          {valid && month > first && (
            <a
              class="btn small"
              href={`/tenants/${tenant.id}/statements/${shiftMonth(month, -1)}`}
            >
              ← {shiftMonth(month, -1)}
            </a>
          )}
          {before || (valid && s && !s.period.complete) ? null : valid && (
            <a
              class="btn small"
              href={`/tenants/${tenant.id}/statements/${shiftMonth(month, 1)}`}
            >
              {shiftMonth(month, 1)} →
            </a>
          )}
          {s && (
            <a
              class="btn small primary"
              href={`/tenants/${tenant.id}/statements/${month}/csv`}
              download
              data-testid="statement-csv"
            >
              Download CSV
            </a>
          )}
          {s && (
            <a
              class="btn small"
              href={`/tenants/${tenant.id}/statements/${month}/json`}
              download
              data-testid="statement-json"
            >
              Download JSON
            </a>
          )}
        </p>
        {error && <Alert tone="error">{error}</Alert>}
        {before && (
          <Alert tone="warn">
            <span data-testid="no-usage">
              No usage in {month}: {tenant.name} was created in {first}.
            </span>{" "}
            <a href={`/tenants/${tenant.id}/statements/${first}`}>
              Statement for {first} →
            </a>
          </Alert>
        )}
        {s && s.requests === 0 && s.lines.length === 0 && (
          <Alert tone="ok">
            <span data-testid="no-usage">No usage in {month}.</span>
          </Alert>
        )}
        {s && body(s)}
        <p class="muted" data-testid="retention-footer">
          Records kept:{" "}
          {RETENTION_KINDS.map((kind) =>
            `${RETENTION_LABELS[kind].toLowerCase()} ${
              retention.periods[kind]
            } days`
          ).join(", ")}{" "}
          (<a href={`/tenants/${tenant.id}#retention`}>retention</a>).
        </p>
      </>
    ),
    error ? 400 : 200,
  );
}

/** `/tenants/:id/statements…` (mounted under `/tenants`). */
export const statementRoutes = new Hono<PortalEnv>()
  .get("/:id/statements", async (c) => {
    const t = await getTenant(
      c.get("deps").store,
      c.get("principal")!,
      c.req.param("id"),
    );
    // the month picker's choice, kept within the tenant's months
    const first = monthOf(Date.parse(t.createdAt));
    const last = monthOf(Date.now());
    const asked = c.req.query("month") ?? "";
    const month = !/^\d{4}-(0[1-9]|1[0-2])$/.test(asked)
      ? last
      : asked < first
      ? first
      : asked > last
      ? last
      : asked;
    return c.redirect(`/tenants/${t.id}/statements/${month}`, 303);
  })
  .get("/:id/statements/:month", (c) => view(c))
  .get("/:id/statements/:month/:format{csv|json}", async (c) => {
    const store = c.get("deps").store;
    const p = c.get("principal")!;
    const tenant = await getTenant(store, p, c.req.param("id"));
    const format = c.req.param("format");
    let s: Statement;
    try {
      s = await buildStatement(
        store,
        p,
        tenant.id,
        c.req.param("month").slice(0, 20),
      );
    } catch (err) {
      // a bad month: the page says why (a download has nowhere to say it)
      if (!(err instanceof ServiceError) || err.status !== 400) throw err;
      return view(c);
    }
    return c.body(
      format === "csv" ? statementCsv(s) : JSON.stringify(s, null, 2),
      200,
      {
        "content-type": format === "csv"
          ? "text/csv; charset=utf-8"
          : "application/json; charset=utf-8",
        "content-disposition":
          `attachment; filename="statement-${tenant.slug}-${s.month}.${format}"`,
        "cache-control": "no-store",
      },
    );
  });
