/**
 * `/capacity` (platform admins): how busy the cluster and each node were
 * over the last 4 weeks (a heatmap by day of week and hour, lines by hour
 * of day and by day),
 * queue time and refusals, tokens/s against each node's measured peak,
 * the forecast of when the weekday peak reaches 90%, and the cost per 1M
 * tokens delivered per model; `/capacity/export.csv` and `.json`. Reads
 * the capacity rollups only (store/capacity.ts).
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { fmtInt, Stats } from "../components/dashboard.tsx";
import { fmtMoney } from "../components/budgets.tsx";
import {
  CostTable,
  fmtShare,
  fmtTps,
  fmtWait,
  Method,
  NodesTable,
} from "../components/capacity.tsx";
import { Island } from "../components/Island.tsx";
import { Alert, Card, fmtTime, Table } from "../components/ui.tsx";
import CapacityHeatmap, {
  type CapacityHeatmapProps,
} from "../islands/CapacityHeatmap.tsx";
import UsageChart, { type UsageChartProps } from "../islands/UsageChart.tsx";
import {
  type CapacityReport,
  capacityReport,
  type SubjectCapacity,
} from "../store/capacity.ts";
import { capacityCsv } from "../store/capacity_csv.ts";
import { NotFoundError } from "../store/errors.ts";
import type { PortalEnv } from "./_env.ts";
import { page } from "./_page.tsx";
import { InstancesCard } from "../components/instances.tsx";
import { listInstances } from "../store/spanning_instances.ts";

type C = Context<PortalEnv>;

const DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const HOURS = Array.from({ length: 24 }, (_, h) => String(h).padStart(2, "0"));

function round(v: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(v * f) / f;
}

function heatmap(s: SubjectCapacity): CapacityHeatmapProps {
  const peak = s.peakTokensPerSecond?.value ?? 0;
  const grid = (g: (number | null)[][], digits: number) =>
    g.map((row) => row.map((v) => v === null ? null : round(v, digits)));
  const maxQueue = Math.max(
    1,
    ...s.heatmap.queueMs.flat().map((v) => v ?? 0),
  );
  return {
    id: "heat-busy",
    title: "By day of week and hour (UTC)",
    rows: DAYS,
    columns: HOURS,
    metrics: [{
      key: "busy",
      label: "busy share of slots",
      values: grid(s.heatmap.busy, 4),
      max: 1,
      format: "percent",
    }, {
      key: "tps",
      label: `tokens/s delivered (darkest: the measured peak, ${fmtTps(peak)})`,
      values: grid(s.heatmap.tokensPerSecond, 3),
      max: peak,
      format: "number",
      unit: "tokens/s",
    }, {
      key: "queue",
      label: "mean wait for a slot",
      values: grid(s.heatmap.queueMs, 1),
      max: maxQueue,
      format: "number",
      unit: "ms",
    }],
  };
}

function lines(r: CapacityReport, s: SubjectCapacity): UsageChartProps[] {
  const from = Date.parse(r.window.from);
  const days = s.daily.busy.map((_, d) =>
    new Date(from + d * 86_400_000).toISOString().slice(5, 10)
  );
  const pct = (v: number | null) => round((v ?? 0) * 100, 1);
  const peak = round(s.peakTokensPerSecond?.value ?? 0, 2);
  const cluster = s.id === "*";
  return [{
    id: "chart-busy",
    title: "By hour of day (UTC): busy share, and tokens/s against the peak",
    labels: HOURS.map((h) => `${h}:00`),
    leftTitle: "busy %",
    rightTitle: "tokens/s",
    datasets: [
      {
        label: "Busy share, weekdays (%)",
        data: s.byHour.weekdayBusy.map(pct),
        type: "line",
        color: "#2f6f4f",
      },
      {
        label: "Busy share, weekends (%)",
        data: s.byHour.weekendBusy.map(pct),
        type: "line",
        color: "#8bc3a3",
      },
      {
        label: "Tokens/s delivered, weekdays",
        data: s.byHour.weekdayTokensPerSecond.map((v) => round(v ?? 0, 2)),
        type: "line",
        color: "#3b6fb6",
        right: true,
      },
      {
        label: "Measured peak tokens/s",
        data: HOURS.map(() => peak),
        type: "line",
        color: "#9a6700",
        right: true,
      },
    ],
  }, {
    id: "chart-daily",
    title: "By day over the 4 weeks: busy share, mean and busiest hour",
    labels: days,
    leftTitle: "busy %",
    datasets: [
      {
        label: "Busy share, mean (%)",
        data: s.daily.busy.map(pct),
        type: "line",
        color: "#2f6f4f",
      },
      {
        label: "Busy share, busiest hour (%)",
        data: s.daily.peakBusy.map(pct),
        type: "line",
        color: "#9a6700",
      },
    ],
  }, {
    id: "chart-queue",
    title: cluster
      ? "By day: mean wait for a slot, and requests refused for lack of capacity"
      : "By day: mean wait for a slot",
    labels: days,
    leftTitle: "ms",
    ...(cluster ? { rightTitle: "refused" } : {}),
    datasets: [
      {
        label: "Mean wait (ms)",
        data: s.daily.queueMs.map((v) => round(v ?? 0, 1)),
        type: "line",
        color: "#2f6f4f",
      },
      ...(cluster
        ? [{
          label: "Refused (503 no capacity)",
          data: r.cluster.refusedDaily,
          type: "bar" as const,
          color: "#b3261e",
          right: true,
        }]
        : []),
    ],
  }];
}

async function view(c: C) {
  const [r, instances] = await Promise.all([
    capacityReport(c.get("deps").store, c.get("principal")!),
    listInstances(c.get("deps").store, c.get("principal")!),
  ]);
  const nodeId = c.req.query("node")?.slice(0, 200) ?? "";
  const subject = nodeId ? r.nodes.find((n) => n.id === nodeId) : r.cluster;
  if (!subject) {
    throw new NotFoundError("No such node in the last 4 weeks");
  }
  const cl = r.cluster;
  const tone = r.forecast.kind === "reached"
    ? "error"
    : r.forecast.kind === "date"
    ? "warn"
    : "ok";
  return page(
    c,
    "Capacity",
    "/capacity",
    <>
      <h1>Capacity</h1>
      <p class="sub">
        The whole cluster and each node, {fmtTime(r.window.from)} –{" "}
        {fmtTime(r.window.to)} · <a href="#method">how it is measured</a>
      </p>
      <Alert tone={tone}>
        <span data-testid="forecast">{r.forecastText}</span>
      </Alert>
      <Stats
        items={[
          ["Nodes", fmtInt(cl.nodes)],
          [
            "Busy share",
            <span key="b" data-testid="cluster-busy">
              {fmtShare(cl.busyShare)}
            </span>,
          ],
          [
            "Busiest hour",
            cl.peakBusy ? fmtShare(cl.peakBusy.share) : "—",
          ],
          [
            "Tokens/s vs peak",
            <span key="t" data-testid="cluster-tps">
              {fmtTps(cl.tokensPerSecond)} / {fmtTps(
                cl.peakTokensPerSecond?.value,
              )}
            </span>,
          ],
          ["Mean wait", fmtWait(cl.queueMs)],
          [
            "Refused (no capacity)",
            <span key="r" data-testid="refused">{fmtInt(cl.refused)}</span>,
          ],
          ["Requests", fmtInt(cl.requests)],
        ]}
      />
      <Card title="Nodes" id="nodes">
        <NodesTable r={r} selected={subject.id} />
      </Card>
      <InstancesCard
        instances={instances}
        names={new Map(r.nodes.map((n) => [n.id, n.name]))}
      />
      <Card id="charts">
        <form method="get" action="/capacity#charts" class="row">
          <div class="field">
            <label for="cap-node">Show</label>
            <select id="cap-node" name="node">
              <option value="" selected={subject.id === "*"}>
                The whole cluster
              </option>
              {r.nodes.map((n) => (
                <option key={n.id} value={n.id} selected={n.id === subject.id}>
                  {n.name}
                </option>
              ))}
            </select>
          </div>
          <div class="field" style="flex:0">
            <button type="submit" class="primary">Show</button>
          </div>
        </form>
        <h2 data-testid="subject">{subject.name}</h2>
        <Island
          name="CapacityHeatmap"
          component={CapacityHeatmap}
          props={heatmap(subject)}
        />
      </Card>
      {lines(r, subject).map((ch) => (
        <Card key={ch.id}>
          <Island name="UsageChart" component={UsageChart} props={ch} />
        </Card>
      ))}
      <div class="grid2">
        <Card title="Weekday peak by week" id="weeks">
          <Table head={["Week (UTC)", "Weekday peak"]} rows={r.weeks.length}>
            {r.weeks.map((w) => (
              <tr key={w.from}>
                <td>{w.from.slice(0, 10)} – {w.to.slice(0, 10)}</td>
                <td>{fmtShare(w.weekdayPeak)}</td>
              </tr>
            ))}
          </Table>
        </Card>
        <Card title="Export" id="export">
          <p class="muted">
            The hourly figures of the cluster and each node for your own
            planning; the JSON has everything on this page.
          </p>
          <p class="row">
            <a class="btn small" href="/capacity/export.csv">CSV</a>
            <a class="btn small" href="/capacity/export.json">JSON</a>
          </p>
        </Card>
      </div>
      <Card title="Cost per 1M tokens delivered" id="cost">
        <p class="muted">
          The cluster cost {fmtMoney(r.cost.totalMicro, r.cost.currency)}{" "}
          over the window (hardware {fmtMoney(
            r.cost.hardwareMicro,
            r.cost.currency,
          )}, energy{" "}
          {fmtMoney(r.cost.energyMicro, r.cost.currency)}; busy node-hours{" "}
          {fmtMoney(r.cost.busyMicro, r.cost.currency)}), shared by each model's
          node-hours. {r.cost.notes.join(" ")}
        </p>
        <CostTable r={r} />
      </Card>
      <Card>
        <Method r={r} />
      </Card>
    </>,
  );
}

/** `/capacity`, and its exports. */
export const capacityRoutes = new Hono<PortalEnv>()
  .get("/", (c) => view(c))
  .get("/export.csv", async (c) => {
    const r = await capacityReport(c.get("deps").store, c.get("principal")!);
    return c.body(capacityCsv(r), 200, {
      "content-type": "text/csv; charset=utf-8",
      "content-disposition": `attachment; filename="capacity-${
        r.generatedAt.slice(0, 10)
      }.csv"`,
      "cache-control": "no-store",
    });
  })
  .get("/export.json", async (c) => {
    const r = await capacityReport(c.get("deps").store, c.get("principal")!);
    return c.json(r, 200, {
      "content-disposition": `attachment; filename="capacity-${
        r.generatedAt.slice(0, 10)
      }.json"`,
      "cache-control": "no-store",
    });
  });
