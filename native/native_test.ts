import assert from "node:assert/strict";
import { ensureNativeBuilt, hasVerbsHeader } from "../node/native/build.ts";

Deno.test("liborchard C tests pass: JSON escaping, writer, status strings, argument checks, GID rules, probe shape", async () => {
  const paths = await ensureNativeBuilt({ tests: true });
  const { code, stdout } = await new Deno.Command(paths.cTest, {
    stdout: "piped",
    stderr: "inherit",
  }).output();
  const text = new TextDecoder().decode(stdout);
  const failed = text.split("\n").filter((l) => l.startsWith("FAIL"));
  assert.deepEqual(failed, [], text);
  assert.equal(code, 0);
  const pass = /^PASS (\d+)$/m.exec(text);
  assert.ok(pass, "C test binary printed no PASS line");
  assert.ok(Number(pass[1]) >= 80, `only ${pass[1]} C checks ran`);
});

Deno.test({
  name:
    "the verbs double enforces the device ceilings, the mmap-only rule and Apple's QP rules, runs SEND/RECV and RDMA WRITE, and liborchard names each failure",
  ignore: !(await hasVerbsHeader()),
}, async () => {
  const paths = await ensureNativeBuilt({ tests: true });
  const { code, stdout } = await new Deno.Command(paths.fakeVerbsTest, {
    args: [paths.fakeVerbs],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  const text = new TextDecoder().decode(stdout);
  const failed = text.split("\n").filter((l) => l.startsWith("FAIL"));
  assert.deepEqual(failed, [], text);
  assert.equal(code, 0);
  const pass = /^PASS (\d+)$/m.exec(text);
  assert.ok(pass && Number(pass[1]) >= 39, text);
});
