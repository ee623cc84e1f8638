/**
 * The capacity forecast: when the cluster's weekday peak reaches a share
 * of its capacity, at the growth of the weeks measured. Pure functions, so
 * the figure on the page is exactly what the tests check.
 *
 * Method: each week's weekday peak (the highest hourly busy share of the
 * cluster's slots, Monday to Friday) is a point at the middle of its week;
 * an ordinary least-squares line through them gives the growth per week;
 * the date is where that line crosses the threshold. Fewer than
 * MIN_WEEKS weeks with capacity, or a line that does not rise (less than
 * MIN_GROWTH a week), give no date: a flat or falling trend has none, and
 * saying so is the honest answer.
 */

/** One week's weekday peak: `at` its middle (epoch ms), `peak` a share 0..1 (null: no capacity that week). */
export interface WeeklyPeak {
  at: number;
  peak: number | null;
}

/** What the forecast says. */
export type CapacityForecast =
  | { kind: "not_enough_data"; weeks: number; needed: number }
  | { kind: "no_growth"; weeks: number; slopePerWeek: number }
  | {
    kind: "reached";
    weeks: number;
    /** The latest week's peak, at or over the threshold. */
    peak: number;
  }
  | {
    kind: "date";
    weeks: number;
    /** The day the fitted line reaches the threshold (UTC, YYYY-MM-DD). */
    date: string;
    slopePerWeek: number;
    /** The fitted peak now. */
    fittedNow: number;
  };

/** Weeks with data a forecast needs. */
export const MIN_WEEKS = 3;
/** Growth per week below which there is no forecast (0.1 percentage points). */
export const MIN_GROWTH = 0.001;

const WEEK_MS = 7 * 86_400_000;

/** The least-squares line `y = intercept + slope × x` through points (null with fewer than 2 distinct x). */
export function linearFit(
  points: readonly [x: number, y: number][],
): { slope: number; intercept: number } | null {
  const n = points.length;
  if (n < 2) return null;
  let sx = 0, sy = 0;
  for (const [x, y] of points) {
    sx += x;
    sy += y;
  }
  const mx = sx / n, my = sy / n;
  let sxx = 0, sxy = 0;
  for (const [x, y] of points) {
    sxx += (x - mx) * (x - mx);
    sxy += (x - mx) * (y - my);
  }
  if (sxx === 0) return null;
  const slope = sxy / sxx;
  return { slope, intercept: my - slope * mx };
}

/**
 * When the weekday peak reaches `threshold` (default 0.9) of capacity, at
 * the weeks' linear growth, seen from `now` (epoch ms).
 */
export function forecastCapacity(
  weeks: readonly WeeklyPeak[],
  now: number,
  threshold = 0.9,
): CapacityForecast {
  if (!(threshold > 0 && threshold <= 1)) {
    throw new RangeError(
      `Cannot forecast capacity: threshold must be in (0, 1]: current value is ${threshold}`,
    );
  }
  const known = weeks.filter((w): w is { at: number; peak: number } =>
    w.peak !== null && Number.isFinite(w.peak)
  ).sort((a, b) => a.at - b.at);
  if (known.length < MIN_WEEKS) {
    return { kind: "not_enough_data", weeks: known.length, needed: MIN_WEEKS };
  }
  const last = known[known.length - 1]!;
  if (last.peak >= threshold) {
    return { kind: "reached", weeks: known.length, peak: last.peak };
  }
  // x in weeks since the first point keeps the numbers small
  const x0 = known[0]!.at;
  const fit = linearFit(known.map((w) => [(w.at - x0) / WEEK_MS, w.peak]));
  if (!fit || !(fit.slope >= MIN_GROWTH)) {
    return {
      kind: "no_growth",
      weeks: known.length,
      slopePerWeek: fit?.slope ?? 0,
    };
  }
  const fittedNow = fit.intercept + fit.slope * ((now - x0) / WEEK_MS);
  const x = (threshold - fit.intercept) / fit.slope;
  // the line may cross before now when the last week dipped: then it is due now
  const at = Math.max(now, x0 + x * WEEK_MS);
  return {
    kind: "date",
    weeks: known.length,
    date: new Date(at).toISOString().slice(0, 10),
    slopePerWeek: fit.slope,
    fittedNow,
  };
}

function pct(share: number, digits = 0): string {
  return `${(share * 100).toFixed(digits)}%`;
}

/** The forecast in one plain sentence, as the page and the export state it. */
export function forecastSentence(
  f: CapacityForecast,
  threshold = 0.9,
): string {
  switch (f.kind) {
    case "not_enough_data":
      return `Not enough data for a forecast: ${f.weeks} of the ${f.needed} weeks needed have cluster capacity on record.`;
    case "no_growth":
      return `No growth: the weekday peak did not rise over the last ${f.weeks} weeks (${
        f.slopePerWeek >= 0 ? "+" : ""
      }${
        pct(f.slopePerWeek, 1)
      } a week), so there is no date at which it reaches ${
        pct(threshold)
      } of capacity.`;
    case "reached":
      return `The weekday peak already reaches ${
        pct(f.peak)
      } of capacity (at or over ${pct(threshold)}): add capacity now.`;
    case "date":
      return `At the last ${f.weeks} weeks' growth (+${
        pct(f.slopePerWeek, 1)
      } a week), the weekday peak reaches ${
        pct(threshold)
      } of capacity around ${f.date}.`;
  }
}
