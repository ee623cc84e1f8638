/**
 * `/chargeback/:month` (platform admins): the cluster's month, each tenant's
 * statement total and the provider's own "Idle capacity (provider)" line,
 * which together are everything the tenants were charged plus the node cost
 * nobody used (store/chargeback.ts).
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { fmtInt, Stats } from "../components/dashboard.tsx";
import { Alert, Card, Table } from "../components/ui.tsx";
import { RULE_LABEL } from "../store/allocation.ts";
import { type Chargeback, clusterChargeback } from "../store/chargeback.ts";
import { ServiceError } from "../store/errors.ts";
import { formatMoney } from "../store/money.ts";
import { requirePlatform } from "../store/principal.ts";
import { monthOf } from "../store/usage_month.ts";
import type { PortalEnv } from "./_env.ts";
import { portalMessage } from "./_messages.ts";
import { page } from "./_page.tsx";

type C = Context<PortalEnv>;

function body(cb: Chargeback) {
  const money = (micro: number) => `${formatMoney(micro)} ${cb.currency}`;
  return (
    <>
      <Stats
        items={[
          ["Nodes", fmtInt(cb.nodes)],
          ["Enrolled node-hours", cb.enrolledHours.toFixed(1)],
          ["Node cost", money(cb.nodeCostMicro)],
          [
            "Idle capacity (provider)",
            <span key="i" class="num" data-testid="idle-total">
              {money(cb.idle.totalMicro)}
            </span>,
          ],
          ["Charged to tenants", money(cb.totalMicro - cb.idle.totalMicro)],
        ]}
      />
      <Card title="Allocation">
        <p class="muted">
          Shared nodes' busy hours are split by{" "}
          <strong data-testid="rule">{RULE_LABEL[cb.rule]}</strong>{" "}
          (<a href="/settings">Settings</a>); their idle hours are the
          provider's own cost, and a dedicated node costs its tenant everything.
          Each tenant's row is its statement's total; each amount is the sum of
          lines rounded to the cent.
        </p>
        <Table
          head={[
            "Tenant",
            "Tokens",
            "Token charges",
            "Node-hours",
            "Node cost",
            "Total",
          ]}
          rows={cb.tenants.length + 1}
        >
          {cb.tenants.map((t) => (
            <tr key={t.tenantId} data-tenant={t.slug}>
              <td class="name-cell">
                <a
                  href={`/tenants/${t.tenantId}/statements/${cb.month}`}
                  title={t.name}
                >
                  {t.name}
                </a>
              </td>
              <td class="num">{fmtInt(t.tokens)}</td>
              <td class="num">{money(t.tokensMicro)}</td>
              <td class="num">{t.nodeHours.toFixed(2)}</td>
              <td class="num">{money(t.nodesMicro)}</td>
              <td class="num">{money(t.totalMicro)}</td>
            </tr>
          ))}
          <tr data-testid="idle-row">
            <td>Idle capacity (provider)</td>
            <td class="num">—</td>
            <td class="num">—</td>
            <td class="num">{cb.idle.hours.toFixed(2)}</td>
            <td class="num">{money(cb.idle.totalMicro)}</td>
            <td class="num">{money(cb.idle.totalMicro)}</td>
          </tr>
          <tr class="total">
            <td colSpan={5}>Total</td>
            <td class="num">{money(cb.totalMicro)}</td>
          </tr>
        </Table>
      </Card>
    </>
  );
}

async function view(c: C, month: string) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  let cb: Chargeback | null = null;
  let error: string | null = null;
  try {
    cb = await clusterChargeback(store, p, month);
  } catch (err) {
    if (!(err instanceof ServiceError) || err.status !== 400) throw err;
    error = portalMessage(err);
  }
  return page(
    c,
    `Chargeback ${cb ? month : ""}`,
    "/chargeback",
    (
      <>
        <h1>Chargeback {cb ? month : ""}</h1>
        {cb && (
          <p class="sub">
            {cb.period.from.slice(0, 10)} –{" "}
            {cb.period.to.slice(0, 16).replace("T", " ")} UTC
            {cb.period.complete ? "" : " (month to date)"}
          </p>
        )}
        <form method="get" action="/chargeback" class="row">
          <div class="field" style="flex:0">
            <label for="month">Month</label>
            <input
              id="month"
              type="month"
              name="month"
              max={monthOf(Date.now())}
              value={cb ? month : monthOf(Date.now())}
              required
            />
          </div>
          <div class="field" style="flex:0;align-self:flex-end">
            <button type="submit" class="small">Show</button>
          </div>
        </form>
        {error && <Alert tone="error">{error}</Alert>}
        {cb && body(cb)}
      </>
    ),
    error ? 400 : 200,
  );
}

/** `/chargeback` (platform admins). */
export const chargebackRoutes = new Hono<PortalEnv>()
  .get("/", (c) => {
    requirePlatform(c.get("principal")!);
    const asked = c.req.query("month") ?? "";
    const month = /^\d{4}-(0[1-9]|1[0-2])$/.test(asked)
      ? asked
      : monthOf(Date.now());
    return c.redirect(`/chargeback/${month}`, 303);
  })
  .get("/:month", (c) => {
    requirePlatform(c.get("principal")!);
    return view(c, c.req.param("month").slice(0, 20));
  });
