/** Pieces shared by the dashboard pages: stat tiles, quota bars, formatters. */
import type { ComponentChildren } from "preact";
import { QUOTA_WARN_PERCENT, type QuotaUse } from "../store/quota/mod.ts";
import { Table } from "./ui.tsx";

/** A number, maybe with a unit or currency: kept on one line. */
const NUMERIC = /^[-+]?[\d,.]+( ?[A-Za-z%/]{1,4})?$/;

/** A row of headline numbers. */
export function Stats(props: { items: [string, ComponentChildren][] }) {
  return (
    <div class="stats">
      {props.items.map(([label, value]) => (
        <div class="stat" key={label}>
          <div class="stat-label">{label}</div>
          <div class="stat-value">
            {typeof value === "string" && NUMERIC.test(value)
              ? <span class="num">{value}</span>
              : value}
          </div>
        </div>
      ))}
    </div>
  );
}

/** A whole number with thousands separators. */
export function fmtInt(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "—";
  return Math.round(n).toLocaleString("en-US");
}

/** A duration in ms as "850 ms" / "2.5 s"; percentiles past the last bucket as "> 60 s". */
export function fmtMs(ms: number | null | undefined): string {
  if (ms === null || ms === undefined) return "—";
  if (ms === Infinity) return "> 60 s";
  return ms < 1000 ? `≤ ${Math.round(ms)} ms` : `≤ ${ms / 1000} s`;
}

/** Bytes as GiB/MiB. */
export function fmtBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "—";
  if (n >= 2 ** 30) return `${(n / 2 ** 30).toFixed(1)} GiB`;
  return `${(n / 2 ** 20).toFixed(0)} MiB`;
}

const QUOTA_LABELS: Record<QuotaUse["field"], string> = {
  rpm: "Requests this minute",
  tpm: "Tokens this minute",
  concurrency: "Concurrent requests",
  tokensPerDay: "Tokens today",
  tokensPerMonth: "Tokens this month",
};

/** Each limit with its current use, a bar, and a warning at ≥ 80 %. */
export function QuotaTable(props: { rows: QuotaUse[] }) {
  return (
    <Table head={["Limit", "Used", "Of", ""]} rows={props.rows.length}>
      {props.rows.map((q) => {
        const pct = q.percent;
        const hot = pct !== null && pct >= QUOTA_WARN_PERCENT;
        return (
          <tr
            key={q.field}
            data-quota={q.field}
            class={hot ? "hot" : undefined}
          >
            <td>{QUOTA_LABELS[q.field]}</td>
            <td class="num">{fmtInt(q.used)}</td>
            <td class="num">
              {q.limit === null ? "unlimited" : fmtInt(q.limit)}
            </td>
            <td style="min-width:160px">
              {pct === null
                ? <span class="muted">—</span>
                : (
                  <div class="meter-row">
                    <div
                      class={hot ? "meter warn" : "meter"}
                      role="meter"
                      aria-valuemin={0}
                      aria-valuemax={100}
                      aria-valuenow={Math.min(100, pct)}
                      aria-label={QUOTA_LABELS[q.field]}
                    >
                      <span style={`width:${Math.min(100, pct)}%`} />
                    </div>
                    <span class={hot ? "pct hot" : "pct"}>{pct}%</span>
                  </div>
                )}
            </td>
          </tr>
        );
      })}
    </Table>
  );
}
