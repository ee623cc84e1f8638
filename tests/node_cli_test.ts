import assert from "node:assert/strict";
import { parseNodeArgs } from "../node/main.ts";
import { persistableFlags, readNodeFlags } from "../node/flags.ts";

Deno.test("parseNodeArgs() reads flags, falls back to environment variables, and validates", () => {
  const env: Record<string, string> = {
    ORCHARD_GATEWAY_URL: "http://env-gw:8000",
    ORCHARD_NODE_ENGINE: "openai",
    ORCHARD_UPSTREAM_URL: "http://127.0.0.1:52415",
    ORCHARD_NODE_PORT: "9000",
    ORCHARD_NODE_STATE_DIR: "/tmp/state",
  };
  const get = (n: string) => env[n];
  const o = parseNodeArgs([
    "--gateway",
    "http://gw:8000",
    "--join",
    "a.b",
    "--slots",
    "2",
  ], get);
  assert.equal(o.gatewayUrl, "http://gw:8000");
  assert.equal(o.joinToken, "a.b");
  assert.equal(o.engine, "openai");
  assert.equal(o.upstreamUrl, "http://127.0.0.1:52415");
  assert.equal(o.port, 9000);
  assert.equal(o.slots, 2);
  assert.equal(o.stateDir, "/tmp/state");
  assert.equal(o.heartbeatMs, 2000);
  assert.equal(o.host, "0.0.0.0");

  const d = parseNodeArgs(["--gateway", "http://gw"], () => undefined);
  assert.equal(d.engine, "llama");
  assert.equal(d.joinToken, null);
  assert.match(d.stateDir!, /\.orchard\/node$/);
  assert.equal(d.preload, false);
  assert.equal(d.contextSize, null);

  const l = parseNodeArgs(
    ["--gateway", "x", "--context", "8192", "--threads", "6"],
    (n) => (n === "ORCHARD_MODELS_PRELOAD" ? "true" : undefined),
  );
  assert.equal(l.contextSize, 8192);
  assert.equal(l.threads, 6);
  assert.equal(l.preload, true);
  assert.throws(
    () =>
      parseNodeArgs(["--gateway", "x", "--preload", "yes"], () => undefined),
    /true or false/,
  );

  assert.throws(
    () => parseNodeArgs([], () => undefined),
    /--gateway URL is required/,
  );
  assert.throws(
    () =>
      parseNodeArgs(["--gateway", "x", "--engine", "vllm"], () => undefined),
    /llama or openai/,
  );
  assert.throws(
    () => parseNodeArgs(["--gateway", "x", "--port", "70000"], () => undefined),
    /0\.\.65535/,
  );
  assert.throws(() =>
    parseNodeArgs(["--gateway", "x", "--bogus", "1"], () => undefined)
  );
});

Deno.test("the port is automatic unless given, and the flags a node saves hold no join token and only absolute paths", () => {
  assert.equal(
    parseNodeArgs(["--gateway", "x"], () => undefined).port,
    undefined,
  );
  assert.equal(
    parseNodeArgs(["--gateway", "x", "--port", "0"], () => undefined).port,
    0,
  );
  const { flags } = readNodeFlags(
    ["--gateway", "http://gw", "--join", "t.k", "--models", "models"],
    (n) => n === "ORCHARD_TOKENIZER_DIRS" ? "a:/b" : undefined,
  );
  assert.deepEqual(persistableFlags(flags, "/home/me/orchard"), {
    gateway: "http://gw",
    models: "/home/me/orchard/models",
    tokenizers: "/home/me/orchard/a:/b",
  });
});
