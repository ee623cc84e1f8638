// deno-lint-ignore-file no-console -- this module is the one place that writes logs.
/**
 * Structured JSON logs, one object per line on stderr. Callers pass ids and
 * figures, never secrets or prompt text. `ORCHARD_LOG_LEVEL` sets the level
 * (debug, info, warn, error; default info; "silent" in tests).
 */

const LEVELS = {
  debug: 10,
  info: 20,
  warn: 30,
  error: 40,
  silent: 99,
} as const;
type Level = Exclude<keyof typeof LEVELS, "silent">;

function threshold(): number {
  const raw = (Deno.env.get("ORCHARD_LOG_LEVEL") ?? "info").toLowerCase();
  return LEVELS[raw as keyof typeof LEVELS] ?? LEVELS.info;
}

// Read on first use, so a test can set the level after its imports ran.
let min: number | null = null;

function write(level: Level, msg: string, fields?: Record<string, unknown>) {
  min ??= threshold();
  if (LEVELS[level] < min) return;
  console.error(
    JSON.stringify({ t: new Date().toISOString(), level, msg, ...fields }),
  );
}

/** The logger. */
export const log = {
  debug: (msg: string, fields?: Record<string, unknown>) =>
    write("debug", msg, fields),
  info: (msg: string, fields?: Record<string, unknown>) =>
    write("info", msg, fields),
  warn: (msg: string, fields?: Record<string, unknown>) =>
    write("warn", msg, fields),
  error: (msg: string, fields?: Record<string, unknown>) =>
    write("error", msg, fields),
  /** Re-reads `ORCHARD_LOG_LEVEL` (tests). */
  reload: () => {
    min = threshold();
  },
};
