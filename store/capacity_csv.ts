/**
 * The capacity report as CSV for the provider's own planning: one row per
 * hour of the window for the cluster and each node (RFC 4180, CRLF, text
 * cells defused as statements do). The JSON export is the report itself.
 */
import type { CapacityReport, SubjectCapacity } from "./capacity.ts";
import { csvField } from "./statements.ts";

/** The CSV's columns. */
export const CAPACITY_CSV_HEAD = [
  "subject",
  "name",
  "hour_utc",
  "busy_share",
  "tokens_per_second",
  "requests",
  "queue_ms_mean",
  "refused",
] as const;

function num(v: number | null | undefined, digits: number): string {
  return v === null || v === undefined ? "" : v.toFixed(digits);
}

/** The report's hourly series as CSV: the cluster's rows first, then each node's. */
export function capacityCsv(r: CapacityReport): string {
  const rows: string[] = [CAPACITY_CSV_HEAD.join(",")];
  const from = Date.parse(r.window.from);
  const hours = Array.from(
    { length: r.window.hours },
    (_, h) =>
      new Date(from + h * 3_600_000).toISOString().slice(0, 13) + ":00Z",
  );
  const add = (s: SubjectCapacity, refused: number[] | null) => {
    const id = csvField(s.id === "*" ? "cluster" : s.id, true);
    const name = csvField(s.name, true);
    for (let h = 0; h < hours.length; h++) {
      rows.push([
        id,
        name,
        hours[h]!,
        num(s.series.busy[h], 4),
        num(s.series.tokensPerSecond[h], 3),
        String(s.series.requests[h] ?? 0),
        num(s.series.queueMs[h], 1),
        refused ? String(refused[h] ?? 0) : "",
      ].join(","));
    }
  };
  add(r.cluster, r.cluster.refusedSeries);
  for (const n of r.nodes) add(n, null);
  return rows.join("\r\n") + "\r\n";
}
