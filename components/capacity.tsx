/** The capacity page's tables and method note (routes/capacity.tsx). */
import { fmtInt } from "./dashboard.tsx";
import { fmtMoney } from "./budgets.tsx";
import { Table } from "./ui.tsx";
import type { CapacityReport } from "../store/capacity.ts";
import { MIN_GROWTH, MIN_WEEKS } from "../store/capacity_forecast.ts";
import { formatMoney } from "../store/money.ts";

/** A share as a percent ("12.3%"); "—" when unknown. */
export function fmtShare(v: number | null | undefined, digits = 1): string {
  return v === null || v === undefined || !Number.isFinite(v)
    ? "—"
    : `${(v * 100).toFixed(digits)}%`;
}

/** Tokens per second with two decimals. */
export function fmtTps(v: number | null | undefined): string {
  return v === null || v === undefined ? "—" : v.toFixed(2);
}

/** A mean wait in ms. */
export function fmtWait(ms: number | null): string {
  if (ms === null) return "—";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

/** An hour as "11-20 13:00" (UTC, as the page's heading says). */
function fmtHour(iso: string): string {
  return `${iso.slice(5, 10)} ${iso.slice(11, 16)}`;
}

/** Every node with its figures; `selected` is highlighted. */
export function NodesTable(props: { r: CapacityReport; selected: string }) {
  return (
    <div class="roomy capacity-table">
      <Table
        head={[
          "Node",
          "Slots",
          "Busy share",
          "Busiest hour",
          "Tokens/s",
          "Measured peak",
          "Delivered vs peak",
          "Mean wait",
          "Requests",
        ]}
        rows={props.r.nodes.length}
        empty="No node was enrolled in the last 4 weeks."
      >
        {props.r.nodes.map((n) => (
          <tr
            key={n.id}
            data-node={n.id}
            class={n.id === props.selected ? "hot" : undefined}
          >
            <td>
              <a href={`/capacity?node=${encodeURIComponent(n.id)}#charts`}>
                {n.name}
              </a>
            </td>
            <td>{n.slots ?? "—"}</td>
            <td data-testid="busy">{fmtShare(n.busyShare)}</td>
            <td>
              {n.peakBusy
                ? `${fmtShare(n.peakBusy.share)} at ${fmtHour(n.peakBusy.at)}`
                : "—"}
            </td>
            <td>{fmtTps(n.tokensPerSecond)}</td>
            <td data-testid="peak">
              {n.peakTokensPerSecond
                ? `${fmtTps(n.peakTokensPerSecond.value)} at ${
                  fmtHour(n.peakTokensPerSecond.at)
                }`
                : "—"}
            </td>
            <td>{fmtShare(n.deliveredVsPeak)}</td>
            <td>{fmtWait(n.queueMs)}</td>
            <td>{fmtInt(n.requests)}</td>
          </tr>
        ))}
      </Table>
    </div>
  );
}

/** Each model's cost per 1M tokens delivered. */
export function CostTable(props: { r: CapacityReport }) {
  const c = props.r.cost;
  const per1M = (v: number | null) =>
    v === null ? "—" : `${formatMoney(v, 4)} ${c.currency}`;
  return (
    <div class="roomy capacity-table">
      <Table
        head={[
          "Model",
          "Requests",
          "Tokens",
          "Node-hours",
          "Share",
          "Cost",
          "Per 1M tokens",
          "Per 1M, busy time only",
        ]}
        rows={c.models.length}
        empty="No tokens were delivered in the last 4 weeks."
      >
        {c.models.map((m) => (
          <tr key={m.model} data-model={m.model}>
            <td class="mono">{m.model}</td>
            <td>{fmtInt(m.requests)}</td>
            <td>{fmtInt(m.promptTokens + m.completionTokens)}</td>
            <td>{m.slotHours.toFixed(2)}</td>
            <td>{fmtShare(m.share)}</td>
            <td class="mono">{fmtMoney(m.costMicro, c.currency)}</td>
            <td class="mono" data-testid="per1m">{per1M(m.per1MMicro)}</td>
            <td class="mono">{per1M(m.busyPer1MMicro)}</td>
          </tr>
        ))}
      </Table>
    </div>
  );
}

/** How the figures are made, as the page states it. */
export function Method(props: { r: CapacityReport }) {
  return (
    <details id="method">
      <summary>How these figures are made</summary>
      <ul>
        <li>
          <b>Window</b>: the {props.r.window.days}{" "}
          days up to now (UTC days, today included); hours, days of week and
          weeks are UTC.
        </li>
        <li>
          <b>Busy share</b>: the slot-time requests held (each request's time on
          the node, its latency less its wait for a slot, divided by the node's
          slots) over the time the node was enrolled, at most 100%; requests
          count in the hour they began. The cluster's: all nodes' slot-time over
          all their enrolled time.
        </li>
        <li>
          <b>Measured peak</b>: the highest tokens/s (completion tokens per
          second) a node, or the cluster, delivered in any whole hour of the
          window: what it has shown it can do. A node never busy for long has a
          higher real peak; read it with the busy share of that hour.
        </li>
        <li>
          <b>Wait and refusals</b>: the mean time requests waited at the gateway
          for a free node slot; refused: answered 503 <code>server_busy</code>
          {" "}
          because every slot was busy and the queue was full, or the wait timed
          out.
        </li>
        <li>
          <b>Forecast</b>: each week's weekday peak (the busiest whole hour,
          Monday to Friday) is a point; a least-squares line through the weeks
          gives the growth per week, and the date is where it reaches{" "}
          {fmtShare(props.r.threshold, 0)}. Fewer than {MIN_WEEKS}{" "}
          weeks with capacity, or growth under {fmtShare(MIN_GROWTH)}{" "}
          a week, give no date.
        </li>
        <li>
          <b>Cost per 1M tokens</b>: the cluster's cost over the window from the
          cost model in Settings (hardware amortised per enrolled hour as
          statements do, busy power for busy node-hours, idle power for the
          rest), shared out by each model's node-hours, divided by its prompt
          and completion tokens. "Busy time only" leaves out idle capacity, as
          statements charge tenants.
        </li>
      </ul>
    </details>
  );
}
