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

Deno.test("localNodeOptions() honours every node environment variable deno task node reads", async () => {
  const { localNodeOptions, FLAGS } = await import("../node/flags.ts");
  const env: Record<string, string> = {
    ORCHARD_GATEWAY_URL: "http://elsewhere:1", // the local node's gateway is fixed
    ORCHARD_JOIN_TOKEN: "x.y",
    ORCHARD_NODE_SLOTS: "3",
    ORCHARD_CONTEXT_SIZE: "65536",
    ORCHARD_KV_MEMORY: "8GiB",
    ORCHARD_PREFIX_CACHE_MEMORY: "25%",
    ORCHARD_NODE_THREADS: "2",
    ORCHARD_MODELS_PRELOAD: "1",
    ORCHARD_NODE_HEARTBEAT_MS: "500",
    ORCHARD_NODE_ENGINE: "openai",
    ORCHARD_UPSTREAM_URL: "http://127.0.0.1:9",
    ORCHARD_UPSTREAM_API_KEY: "k",
    ORCHARD_TOKENIZER_DIRS: "/a:/b",
    ORCHARD_NODE_NAME: "desk",
    ORCHARD_NODE_ADVERTISE_URL: "http://desk:8100",
  };
  const fixed = {
    gatewayUrl: "http://127.0.0.1:8000",
    joinToken: null,
    modelsDir: "/models",
    stateDir: "/state",
  };
  const o = localNodeOptions(fixed, (n) => env[n]);
  assert.equal(o.gatewayUrl, "http://127.0.0.1:8000");
  assert.equal(o.joinToken, null);
  assert.equal(o.slots, 3);
  assert.equal(o.contextSize, 65536);
  assert.deepEqual(o.kvMemory, { bytes: 8 * 1024 ** 3 });
  assert.deepEqual(o.prefixCacheMemory, { share: 0.25 });
  assert.equal(o.threads, 2);
  assert.equal(o.preload, true);
  assert.equal(o.heartbeatMs, 500);
  assert.equal(o.engine, "openai");
  assert.equal(o.upstreamUrl, "http://127.0.0.1:9");
  assert.equal(o.upstreamApiKey, "k");
  assert.deepEqual(o.tokenizerDirs, ["/a", "/b"]);
  assert.equal(o.name, "desk");
  assert.equal(o.advertiseUrl, "http://desk:8100");
  assert.equal(o.modelsDir, "/models");
  assert.equal(o.stateDir, "/state");
  // every flag's variable is read (none is left to deno task node only)
  const read = new Set<string>();
  localNodeOptions(fixed, (n) => {
    read.add(n);
    return undefined;
  });
  for (const [env] of Object.values(FLAGS)) assert.ok(read.has(env), env);
  // defaults: loopback, any free port, named "local"
  const d = localNodeOptions(fixed, () => undefined);
  assert.equal(d.host, "127.0.0.1");
  assert.equal(d.port, 0);
  assert.equal(d.name, "local");
  assert.equal(d.contextSize, null);
  assert.throws(
    () =>
      localNodeOptions(
        fixed,
        (n) => n === "ORCHARD_KV_MEMORY" ? "lots" : undefined,
      ),
    /--kv-memory must be/,
  );
});
