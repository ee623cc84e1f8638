/**
 * Windows: each rule counts in a window named by its kind and start
 * (`rpm:2025-01-31T12:34`, `day:2025-01-31`, `month:2025-01`,
 * `spend:2025-01`, `conc`), part of its counters' keys.
 */
import type { RuleKind } from "./types.ts";

export const MINUTE = 60_000;
export const DAY = 86_400_000;

/** The last window computed per kind, with its start (windows change rarely). */
const lastWindows = new Map<
  RuleKind,
  { name: string; start: number; end: number }
>();

/** When the window named `w` (see windowOf) ends; Infinity for concurrency. */
export function windowEnd(w: string): number {
  let end = windowEnds.get(w);
  if (end === undefined) {
    const i = w.indexOf(":");
    const kind = w.slice(0, i);
    const at = w.slice(i + 1);
    if (kind === "rpm" || kind === "tpm") {
      end = Date.parse(`${at}:00Z`) + MINUTE;
    } else if (kind === "day") end = Date.parse(`${at}T00:00:00Z`) + DAY;
    else if (kind === "month" || kind === "spend") {
      const d = new Date(`${at}-01T00:00:00Z`);
      end = Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
    }
    if (end === undefined || Number.isNaN(end)) end = Infinity;
    if (windowEnds.size >= 1000) windowEnds.clear();
    windowEnds.set(w, end);
  }
  return end;
}
const windowEnds = new Map<string, number>();

/** The window name of a rule at `now` (part of the counter key) and when it ends. */
export function windowOf(kind: RuleKind, now: number): [string, number] {
  if (kind === "concurrency") return ["conc", now + 1000];
  const w = lastWindows.get(kind);
  if (w && now >= w.start && now < w.end) return [w.name, w.end];
  const d = new Date(now);
  const iso = d.toISOString();
  let name: string, start: number, end: number;
  if (kind === "rpm" || kind === "tpm") {
    [name, start] = [`${kind}:${iso.slice(0, 16)}`, now - (now % MINUTE)];
    end = start + MINUTE;
  } else if (kind === "day") {
    [name, start] = [`day:${iso.slice(0, 10)}`, now - (now % DAY)];
    end = start + DAY;
  } else {
    name = `${kind}:${iso.slice(0, 7)}`;
    start = Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
    end = Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
  }
  lastWindows.set(kind, { name, start, end });
  return [name, end];
}

/** Whether a rule's windows count tokens (tpm, day, month) rather than requests. */
export const isTokenRule = (kind: RuleKind) =>
  kind === "tpm" || kind === "day" || kind === "month";
