// deno-lint-ignore-file no-console -- this module is the gateway's one log sink (structured JSON lines on stdout/stderr)
/**
 * Structured JSON logs: one line per event with a request id; callers pass
 * only metadata (never keys, tokens or prompt text).
 */

/** Log levels, least to most severe. */
export type LogLevel = "debug" | "info" | "warn" | "error";

const RANK: Record<LogLevel, number> = { debug: 0, info: 1, warn: 2, error: 3 };

/** A logger writing JSON lines. */
export interface Logger {
  log(level: LogLevel, msg: string, fields?: Record<string, unknown>): void;
}

/** Builds a logger that drops events below `level` (env `ORCHARD_LOG_LEVEL`, default info). */
export function createLogger(
  level: LogLevel = (Deno.env.get("ORCHARD_LOG_LEVEL") as LogLevel) || "info",
): Logger {
  const min = RANK[level] ?? 1;
  return {
    log(lvl, msg, fields = {}) {
      if (RANK[lvl] < min) return;
      const line = JSON.stringify({
        t: new Date().toISOString(),
        level: lvl,
        msg,
        ...fields,
      });
      if (lvl === "error" || lvl === "warn") console.error(line);
      else console.log(line);
    },
  };
}

/** A logger that writes nothing (tests, benchmarks). */
export const silentLogger: Logger = { log() {} };
