// deno-lint-ignore-file no-console -- this module is the one place that writes logs.
/**
 * Structured logs, the one logger of the whole project (gateway, portal,
 * node, fleet): one JSON object per line on stderr (`t`, `level`, `msg`,
 * then the fields), so stdout stays for what programs print (listening
 * addresses, readiness lines, reports). `ORCHARD_LOG_LEVEL` sets the level
 * (debug, info, warn, error; default info; "silent" in tests), read on
 * first use so a test can set it after its imports ran.
 *
 * Callers pass ids and figures, never keys, tokens, passwords or prompt
 * text; as a backstop, a field named like one of those (`key`, `token`,
 * `authorization`, `prompt`, `messages`…) is written as "[redacted]".
 */

/** Log levels, least to most severe. */
export type LogLevel = "debug" | "info" | "warn" | "error";

/** A logger; `log` writes, `silentLogger` drops everything. */
export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

const LEVELS = {
  debug: 10,
  info: 20,
  warn: 30,
  error: 40,
  silent: 99,
} as const;

function threshold(): number {
  const raw = (Deno.env.get("ORCHARD_LOG_LEVEL") ?? "info").toLowerCase();
  return LEVELS[raw as keyof typeof LEVELS] ?? LEVELS.info;
}

// Read on first use, so a test can set the level after its imports ran.
let min: number | null = null;

const SECRET_FIELD =
  /^(authorization|cookie|password|secret|token|api_?key|key|prompt|messages|input|content)$/i;

function redacted(fields: Record<string, unknown>): Record<string, unknown> {
  for (const k in fields) {
    if (SECRET_FIELD.test(k)) {
      const out: Record<string, unknown> = {};
      for (const j in fields) {
        out[j] = SECRET_FIELD.test(j) ? "[redacted]" : fields[j];
      }
      return out;
    }
  }
  return fields;
}

function write(level: LogLevel, msg: string, fields?: Record<string, unknown>) {
  min ??= threshold();
  if (LEVELS[level] < min) return;
  console.error(
    JSON.stringify({
      t: new Date().toISOString(),
      level,
      msg,
      ...(fields && redacted(fields)),
    }),
  );
}

/** The process's logger (level from `ORCHARD_LOG_LEVEL`). */
export const log: Logger & { reload(): void } = {
  debug: (msg, fields) => write("debug", msg, fields),
  info: (msg, fields) => write("info", msg, fields),
  warn: (msg, fields) => write("warn", msg, fields),
  error: (msg, fields) => write("error", msg, fields),
  /** Re-reads `ORCHARD_LOG_LEVEL` (tests). */
  reload: () => {
    min = threshold();
  },
};

/** A logger that writes nothing (tests, benchmarks). */
export const silentLogger: Logger = {
  debug() {},
  info() {},
  warn() {},
  error() {},
};
