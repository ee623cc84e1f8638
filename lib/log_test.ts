// deno-lint-ignore-file no-console -- the tests capture what the logger writes
import assert from "node:assert/strict";
import { log, silentLogger } from "./log.ts";

/** Runs `fn` with `ORCHARD_LOG_LEVEL` = `level`, returning the lines written to stderr. */
function captured(level: string | undefined, fn: () => void): string[] {
  const lines: string[] = [];
  const saved = console.error;
  const env = Deno.env.get("ORCHARD_LOG_LEVEL");
  if (level === undefined) Deno.env.delete("ORCHARD_LOG_LEVEL");
  else Deno.env.set("ORCHARD_LOG_LEVEL", level);
  console.error = (line: string) => lines.push(line);
  try {
    log.reload();
    fn();
  } finally {
    console.error = saved;
    if (env === undefined) Deno.env.delete("ORCHARD_LOG_LEVEL");
    else Deno.env.set("ORCHARD_LOG_LEVEL", env);
    log.reload();
  }
  return lines;
}

const all = () => {
  log.debug("d");
  log.info("i");
  log.warn("w");
  log.error("e");
};

Deno.test("log writes one JSON object per line: t, level, msg, then the fields", () => {
  const [line, ...rest] = captured("info", () => log.info("hello", { n: 1 }));
  assert.equal(rest.length, 0);
  const o = JSON.parse(line!);
  assert.deepEqual(Object.keys(o), ["t", "level", "msg", "n"]);
  assert.equal(o.level, "info");
  assert.equal(o.msg, "hello");
  assert.equal(o.n, 1);
  assert.ok(!Number.isNaN(Date.parse(o.t)));
});

Deno.test("ORCHARD_LOG_LEVEL drops what is below it (default info)", () => {
  const levels = (l: string | undefined) =>
    captured(l, all).map((s) => JSON.parse(s).level);
  assert.deepEqual(levels("debug"), ["debug", "info", "warn", "error"]);
  assert.deepEqual(levels(undefined), ["info", "warn", "error"]);
  assert.deepEqual(levels("WARN"), ["warn", "error"]);
  assert.deepEqual(levels("error"), ["error"]);
  assert.deepEqual(levels("silent"), []);
  assert.deepEqual(levels("bogus"), ["info", "warn", "error"]);
});

Deno.test("fields named like secrets or prompt text are redacted", () => {
  const [line] = captured("info", () =>
    log.warn("x", {
      requestId: "r1",
      token: "orch_secret",
      Authorization: "Bearer x",
      messages: [{ role: "user", content: "private" }],
      prompt: "private",
    }));
  const o = JSON.parse(line!);
  assert.equal(o.requestId, "r1");
  for (const k of ["token", "Authorization", "messages", "prompt"]) {
    assert.equal(o[k], "[redacted]", k);
  }
  assert.ok(!line!.includes("private") && !line!.includes("orch_secret"));
});

Deno.test("silentLogger writes nothing", () => {
  const lines = captured("debug", () => {
    silentLogger.debug("d");
    silentLogger.info("i");
    silentLogger.warn("w");
    silentLogger.error("e", { a: 1 });
  });
  assert.deepEqual(lines, []);
});
