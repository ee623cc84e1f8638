/**
 * `/usage`: tokens and requests over time (per tenant, key or model, by
 * hour or day over a chosen range), latency and TTFT percentiles, errors
 * and limit rejections, top tenants, and quota status. Reads rollups only.
 * Tenant admins and viewers see their own tenant; another tenant is 404.
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { fmtInt, fmtMs, QuotaTable, Stats } from "../components/dashboard.tsx";
import { Island } from "../components/Island.tsx";
import { Alert, Card, Table } from "../components/ui.tsx";
import UsageChart, { type UsageChartProps } from "../islands/UsageChart.tsx";
import { listApiKeys } from "../store/api_keys.ts";
import { ServiceError } from "../store/errors.ts";
import { isPlatform } from "../store/principal.ts";
import { quotaStatus } from "../store/quota/mod.ts";
import { findTenant, listTenants, type Tenant } from "../store/tenants.ts";
import { percentile } from "../store/usage.ts";
import {
  monthOf,
  tenantModelMonth,
  type TopTenant,
  topTenants,
} from "../store/usage_month.ts";
import { fmtMoney, SpendTables } from "../components/budgets.tsx";
import { getPricing } from "../store/pricing.ts";
import { monthSpend } from "../store/spend.ts";
import type { Store } from "../store/store.ts";
import {
  parseUsageQuery,
  type UsageReport,
  usageReport,
} from "../store/usage_report.ts";
import type { PortalEnv } from "./_env.ts";
import { page } from "./_page.tsx";

type C = Context<PortalEnv>;

/** Range presets of the picker: [label, span in ms, default granularity]. */
const RANGES: Record<string, [string, number, "hour" | "day"]> = {
  "24h": ["Last 24 hours", 86_400_000, "hour"],
  "7d": ["Last 7 days", 7 * 86_400_000, "hour"],
  "30d": ["Last 30 days", 30 * 86_400_000, "day"],
  "90d": ["Last 90 days", 90 * 86_400_000, "day"],
};

function label(bucket: string, g: "hour" | "day"): string {
  return g === "hour"
    ? `${bucket.slice(5, 10)} ${bucket.slice(11, 16)}`
    : bucket.slice(0, 10);
}

function charts(r: UsageReport): UsageChartProps[] {
  const g = r.query.granularity;
  const labels = r.series.map((p) => label(p.bucket, g));
  const pick = (f: (p: UsageReport["series"][number]) => number) =>
    r.series.map(f);
  return [{
    id: "chart-tokens",
    title: `Tokens and requests per ${g}`,
    labels,
    leftTitle: "tokens",
    rightTitle: "requests",
    datasets: [
      {
        label: "Prompt tokens",
        data: pick((p) => p.promptTokens),
        type: "bar",
        color: "#8bc3a3",
        stack: "t",
      },
      {
        label: "Completion tokens",
        data: pick((p) => p.completionTokens),
        type: "bar",
        color: "#2f6f4f",
        stack: "t",
      },
      {
        label: "Requests",
        data: pick((p) => p.requests),
        type: "line",
        color: "#3b6fb6",
        right: true,
      },
    ],
  }, {
    id: "chart-latency",
    title: `Latency and time to first token per ${g} (ms, bucket bounds)`,
    labels,
    leftTitle: "ms",
    datasets: [
      {
        label: "Latency p50",
        data: pick((p) => finite(percentile(p.latencyHistogram, 0.5))),
        type: "line",
        color: "#2f6f4f",
      },
      {
        label: "Latency p95",
        data: pick((p) => finite(percentile(p.latencyHistogram, 0.95))),
        type: "line",
        color: "#9a6700",
      },
      {
        label: "TTFT p50",
        data: pick((p) => finite(percentile(p.ttftHistogram, 0.5))),
        type: "line",
        color: "#3b6fb6",
      },
    ],
  }, {
    id: "chart-errors",
    title: `Errors and limit rejections per ${g}`,
    labels,
    leftTitle: "requests",
    datasets: [
      {
        label: "Limit rejections (429)",
        data: pick((p) => p.limited),
        type: "bar",
        color: "#e0a526",
        stack: "e",
      },
      {
        label: "Other errors",
        data: pick((p) => p.errors - p.limited),
        type: "bar",
        color: "#b3261e",
        stack: "e",
      },
    ],
  }];
}

function finite(v: number | null): number {
  return v === null ? 0 : v === Infinity ? 60_000 : v;
}

/** Query parameters of the page (range presets become from/to). */
function params(c: C, now: number): Record<string, string | undefined> {
  const q = (n: string) => c.req.query(n)?.slice(0, 200);
  const range = q("range");
  const custom = Boolean(q("from") || q("to"));
  const preset = range && !custom ? RANGES[range] : undefined;
  return {
    tenant: q("tenant"),
    key: q("key"),
    model: q("model"),
    granularity: q("granularity") || preset?.[2],
    from: preset ? new Date(now - preset[1] + 1).toISOString() : q("from"),
    to: preset ? new Date(now).toISOString() : q("to"),
  };
}

async function view(c: C) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const now = Date.now();
  const raw = params(c, now);
  let tenant: Tenant | null = null;
  if (raw.tenant) tenant = await findTenant(store, p, raw.tenant);
  else if (!isPlatform(p)) tenant = await findTenant(store, p, p.tenantId!);
  let report: UsageReport | null = null;
  let error: string | null = null;
  try {
    report = await usageReport(
      store,
      p,
      parseUsageQuery({ ...raw, tenant: tenant?.id }, now),
    );
  } catch (err) {
    if (!(err instanceof ServiceError) || err.status !== 400) throw err;
    error = err.message;
  }
  const month = monthOf(report ? Date.parse(report.query.to) : now);
  const [tenants, keys, quota, models, top] = await Promise.all([
    isPlatform(p)
      ? listTenants(store, p, { limit: 200 }).then((r) => r.items)
      : Promise.resolve(tenant ? [tenant] : []),
    tenant
      ? listApiKeys(store, p, tenant.id, { limit: 100 }).then((r) => r.items)
      : Promise.resolve([]),
    tenant ? quotaStatus(store, p, tenant.id, now) : Promise.resolve(null),
    tenant ? tenantModelMonth(store, tenant.id, month) : Promise.resolve([]),
    isPlatform(p) && !tenant
      ? topTenants(store, p, month, 10).then((ts) => withCost(store, ts, month))
      : Promise.resolve(null),
  ]);
  const keyNames = new Map(keys.map((k) => [k.id, k.name]));
  if (tenant && !tenants.some((t) => t.id === tenant!.id)) tenants.push(tenant);
  const t = report?.totals;
  const range = c.req.query("from") || c.req.query("to")
    ? ""
    : c.req.query("range") ?? "24h";
  const dateValue = (iso: string | undefined) => iso ? iso.slice(0, 10) : "";
  return page(
    c,
    "Usage & cost",
    "/usage",
    (
      <>
        <h1>Usage &amp; cost</h1>
        <p class="sub">
          {tenant ? tenant.name : "The whole cluster"}
          {report && (
            <>
              {" · "}
              {report.query.from.slice(0, 16).replace("T", " ")} –{" "}
              {report.query.to.slice(0, 16).replace("T", " ")} UTC, by{" "}
              {report.query.granularity}
            </>
          )}
        </p>
        <Card>
          <form method="get" action="/usage" class="row" id="usage-filter">
            {isPlatform(p) && (
              <div class="field">
                <label for="u-tenant">Tenant</label>
                <select id="u-tenant" name="tenant">
                  <option value="">All tenants</option>
                  {tenants.map((x) => (
                    <option
                      key={x.id}
                      value={x.id}
                      selected={x.id === tenant?.id}
                    >
                      {x.name}
                    </option>
                  ))}
                </select>
              </div>
            )}
            {tenant && (
              <div class="field">
                <label for="u-key">API key</label>
                <select id="u-key" name="key">
                  <option value="">All keys</option>
                  {keys.map((k) => (
                    <option key={k.id} value={k.id} selected={k.id === raw.key}>
                      {k.name} ({k.prefix}…{k.last4})
                    </option>
                  ))}
                </select>
              </div>
            )}
            <div class="field">
              <label for="u-model">Model</label>
              <input
                id="u-model"
                name="model"
                type="text"
                list="u-models"
                value={raw.model ?? ""}
                placeholder="all models"
              />
              <datalist id="u-models">
                {models.map((m) => <option key={m.model} value={m.model} />)}
              </datalist>
            </div>
            <div class="field">
              <label for="u-range">Range</label>
              <select id="u-range" name="range">
                {Object.entries(RANGES).map(([v, [l]]) => (
                  <option key={v} value={v} selected={v === range}>{l}</option>
                ))}
                <option value="" selected={range === ""}>
                  Custom (from–to)
                </option>
              </select>
            </div>
            <div class="field">
              <label for="u-from">From</label>
              <input
                id="u-from"
                name="from"
                type="date"
                value={range ? "" : dateValue(c.req.query("from"))}
              />
            </div>
            <div class="field">
              <label for="u-to">To</label>
              <input
                id="u-to"
                name="to"
                type="date"
                value={range ? "" : dateValue(c.req.query("to"))}
              />
            </div>
            <div class="field">
              <label for="u-g">Granularity</label>
              <select id="u-g" name="granularity">
                {(["hour", "day"] as const).map((g) => (
                  <option
                    key={g}
                    value={g}
                    selected={g ===
                      (report?.query.granularity ?? raw.granularity)}
                  >
                    {g}
                  </option>
                ))}
              </select>
            </div>
            <div class="field" style="flex:0">
              <button type="submit" class="primary">Show</button>
            </div>
          </form>
        </Card>
        {error && <Alert tone="error">{error}</Alert>}
        {report && t && (
          <>
            <Stats
              items={[
                ["Requests", fmtInt(t.requests)],
                ["Prompt tokens", fmtInt(t.promptTokens)],
                ["Completion tokens", fmtInt(t.completionTokens)],
                ["Errors", fmtInt(t.errors)],
                ["Limit rejections", fmtInt(t.limited)],
                [
                  "Latency p50 / p95",
                  `${fmtMs(t.latencyP50Ms)} / ${fmtMs(t.latencyP95Ms)}`,
                ],
                [
                  "TTFT p50 / p95",
                  `${fmtMs(t.ttftP50Ms)} / ${fmtMs(t.ttftP95Ms)}`,
                ],
                [
                  "Cost",
                  <span key="cost" data-testid="usage-cost">
                    {fmtMoney(report.spend.totalMicro, report.spend.currency)}
                  </span>,
                ],
              ]}
            />
            <Card title="Cost in this range" id="cost">
              <p class="muted">
                Tokens at the prices of the monthly statement, each model's
                prompt and completion tokens rounded to the cent.
                {report.spend.notes.length > 0 &&
                  ` ${report.spend.notes.join(" ")}`}
              </p>
              <SpendTables spend={report.spend} keys={keyNames} />
            </Card>
            {charts(report).map((ch) => (
              <Card key={ch.id}>
                <Island name="UsageChart" component={UsageChart} props={ch} />
              </Card>
            ))}
          </>
        )}
        <div class="grid2">
          {quota && tenant && (
            <Card title="Quota status" id="quota">
              <QuotaTable rows={quota} />
            </Card>
          )}
          {tenant && (
            <Card title={`Models in ${month}`} id="models">
              <Table
                head={["Model", "Requests", "Prompt", "Completion"]}
                rows={models.length}
                empty="No usage this month."
              >
                {models.map((m) => (
                  <tr key={m.model}>
                    <td class="mono">
                      <span class="trunc" title={m.model}>{m.model}</span>
                    </td>
                    <td class="num">{fmtInt(m.requests)}</td>
                    <td class="num">{fmtInt(m.prompt)}</td>
                    <td class="num">{fmtInt(m.completion)}</td>
                  </tr>
                ))}
              </Table>
              <p style="margin-top:12px">
                <a
                  class="btn small"
                  href={`/tenants/${tenant.id}/statements/${month}`}
                >
                  Statement for {month} →
                </a>
              </p>
            </Card>
          )}
          {top && (
            <Card title={`Top tenants in ${month}`} id="top-tenants">
              <Table
                head={["Tenant", "Tokens", "Requests", "Errors", "Cost"]}
                rows={top.length}
                empty="No usage this month."
              >
                {top.map((x) => (
                  <tr key={x.tenantId}>
                    <td>
                      <a href={`/usage?tenant=${x.tenantId}&range=30d`}>
                        {x.name}
                      </a>
                    </td>
                    <td class="num">{fmtInt(x.tokens)}</td>
                    <td class="num">{fmtInt(x.requests)}</td>
                    <td class="num">{fmtInt(x.errors)}</td>
                    <td class="num">{fmtMoney(x.costMicro, x.currency)}</td>
                  </tr>
                ))}
              </Table>
            </Card>
          )}
        </div>
      </>
    ),
    error ? 400 : 200,
  );
}

/** Each top tenant's spend in `month`: its statement's token lines. */
async function withCost(
  store: Store,
  top: TopTenant[],
  month: string,
): Promise<(TopTenant & { costMicro: number; currency: string })[]> {
  const pricing = await getPricing(store);
  return await Promise.all(top.map(async (t) => ({
    ...t,
    costMicro: (await monthSpend(store, t.tenantId, month, pricing, false))
      .tenant.money,
    currency: pricing.currency,
  })));
}

/** `/usage`. */
export const usageRoutes = new Hono<PortalEnv>().get("/", (c) => view(c));
