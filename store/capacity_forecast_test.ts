import assert from "node:assert/strict";
import {
  forecastCapacity,
  forecastSentence,
  linearFit,
  type WeeklyPeak,
} from "./capacity_forecast.ts";

const WEEK = 7 * 86_400_000;
/** The middle of the first week: Wednesday 2026-11-04, 12:00 UTC. */
const X0 = Date.UTC(2026, 10, 4, 12);
/** Half a week after the last of four weeks. */
const NOW = X0 + 3.5 * WEEK;

function weeks(...peaks: (number | null)[]): WeeklyPeak[] {
  return peaks.map((peak, i) => ({ at: X0 + i * WEEK, peak }));
}

Deno.test("linearFit() is the least-squares line, and null without two distinct x", () => {
  assert.deepEqual(linearFit([[0, 1], [1, 3], [2, 5]]), {
    slope: 2,
    intercept: 1,
  });
  const f = linearFit([[0, 0.4], [1, 0.5], [2, 0.45], [3, 0.55]])!;
  assert.ok(Math.abs(f.slope - 0.04) < 1e-12);
  assert.ok(Math.abs(f.intercept - 0.415) < 1e-12);
  assert.equal(linearFit([[1, 2]]), null);
  assert.equal(linearFit([[1, 2], [1, 3]]), null);
});

Deno.test("forecastCapacity() dates the crossing of 90% on a straight rise", () => {
  const f = forecastCapacity(weeks(0.5, 0.6, 0.7, 0.8), NOW);
  assert.equal(f.kind, "date");
  if (f.kind !== "date") return;
  // +0.1 a week from 0.5 at week 0: 0.9 at week 4, 28 days after X0
  assert.equal(f.date, "2026-12-02");
  assert.ok(Math.abs(f.slopePerWeek - 0.1) < 1e-12);
  assert.ok(Math.abs(f.fittedNow - 0.85) < 1e-12);
  assert.equal(f.weeks, 4);
  assert.equal(
    forecastSentence(f),
    "At the last 4 weeks' growth (+10.0% a week), the weekday peak reaches 90% of capacity around 2026-12-02.",
  );
});

Deno.test("forecastCapacity() fits a noisy rise by least squares", () => {
  // slope 0.04, intercept 0.415: 0.9 at week 12.125 = 84.875 days after X0
  const f = forecastCapacity(weeks(0.4, 0.5, 0.45, 0.55), NOW);
  assert.equal(f.kind, "date");
  if (f.kind === "date") assert.equal(f.date, "2027-01-28");
  // another threshold: 0.575 at week 4 = 28 days after X0
  const g = forecastCapacity(weeks(0.4, 0.5, 0.45, 0.55), NOW, 0.575);
  assert.equal(g.kind === "date" && g.date, "2026-12-02");
});

Deno.test("forecastCapacity() says no growth for a flat or falling peak, and not enough data under 3 weeks", () => {
  const flat = forecastCapacity(weeks(0.5, 0.5, 0.5, 0.5), NOW);
  assert.deepEqual(flat, { kind: "no_growth", weeks: 4, slopePerWeek: 0 });
  assert.match(forecastSentence(flat), /^No growth: .* no date /);
  const falling = forecastCapacity(weeks(0.8, 0.7, 0.6, 0.5), NOW);
  assert.equal(falling.kind, "no_growth");
  assert.ok(falling.kind === "no_growth" && falling.slopePerWeek < 0);
  // a rise under 0.1 points a week is no growth either
  assert.equal(
    forecastCapacity(weeks(0.5, 0.5005, 0.501, 0.5015), NOW).kind,
    "no_growth",
  );
  const short = forecastCapacity(weeks(null, null, 0.5, 0.7), NOW);
  assert.deepEqual(short, { kind: "not_enough_data", weeks: 2, needed: 3 });
  assert.equal(
    forecastSentence(short),
    "Not enough data for a forecast: 2 of the 3 weeks needed have cluster capacity on record.",
  );
  assert.equal(forecastCapacity([], NOW).kind, "not_enough_data");
  // three weeks are enough (a missing week is skipped, not read as 0)
  const gap = forecastCapacity(weeks(0.5, null, 0.7, 0.8), NOW);
  assert.equal(gap.kind, "date");
});

Deno.test("forecastCapacity() says reached when the last week is at the threshold, and due now when the line crossed already", () => {
  const r = forecastCapacity(weeks(0.6, 0.7, 0.8, 0.95), NOW);
  assert.deepEqual(r, { kind: "reached", weeks: 4, peak: 0.95 });
  assert.match(forecastSentence(r), /already reaches 95% .*add capacity now/);
  // the fitted line passed 0.9 but the last week dipped under it
  const d = forecastCapacity(weeks(0.5, 0.95, 1, 0.85), NOW);
  assert.equal(d.kind, "date");
  if (d.kind === "date") {
    assert.equal(d.date, new Date(NOW).toISOString().slice(0, 10));
  }
});

Deno.test("forecastCapacity() refuses a threshold outside (0, 1]", () => {
  assert.throws(
    () => forecastCapacity(weeks(0.5, 0.6, 0.7), NOW, 0),
    /threshold must be in \(0, 1\]: current value is 0/,
  );
  assert.throws(() => forecastCapacity([], NOW, 1.5), RangeError);
});
