import assert from "node:assert/strict";
import { ensureNativeBuilt } from "./build.ts";
import { EXPECTED_ABI_VERSION, Liborchard, OrchStatus } from "./liborchard.ts";

const paths = await ensureNativeBuilt({ tests: true });

Deno.test("Liborchard.open() loads the built library with the expected ABI version", () => {
  using lib = Liborchard.open(paths.lib);
  assert.equal(lib.abiVersion(), EXPECTED_ABI_VERSION);
  assert.match(lib.version, /^\d+\.\d+\.\d+$/);
});

Deno.test("Liborchard.open() refuses a library with another ABI version and says how to fix it", () => {
  assert.throws(
    () => Liborchard.open(paths.abiMismatch),
    (err: Error) => {
      assert.match(err.message, /ABI version is 999, this Orchard expects 1/);
      assert.match(err.message, /deno task build:native/);
      return true;
    },
  );
});

Deno.test("Liborchard.open() rethrows a load failure as 'Cannot load liborchard' with the cause", () => {
  assert.throws(
    () => Liborchard.open("/nonexistent/liborchard.so"),
    (err: Error) => {
      assert.equal(err.message, "Cannot load liborchard");
      assert.ok(err.cause instanceof Error);
      return true;
    },
  );
});

Deno.test("Liborchard.close() is idempotent and later calls fail clearly", () => {
  const lib = Liborchard.open(paths.lib);
  lib.close();
  lib.close();
  lib[Symbol.dispose]();
  assert.throws(() => lib.abiVersion(), /Cannot use liborchard: it is closed/);
});

Deno.test("Liborchard.statusString() names every status code", () => {
  using lib = Liborchard.open(paths.lib);
  assert.equal(lib.statusString(OrchStatus.OK), "ok");
  assert.equal(lib.statusString(OrchStatus.AUTH), "authentication failed");
  assert.equal(lib.statusString(12345), "unknown status");
});

Deno.test("Liborchard.jsonEscape() escapes through a caller-owned buffer, growing it when told the size", () => {
  using lib = Liborchard.open(paths.lib);
  assert.equal(lib.jsonEscape('a"b\\c\n\u0001'), 'a\\"b\\\\c\\n\\u0001');
  const long = 'é"'.repeat(100);
  assert.equal(JSON.parse(`"${lib.jsonEscape(long)}"`), long);
});
