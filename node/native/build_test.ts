import assert from "node:assert/strict";
import { ensureNativeBuilt, nativeInputDigests, nativePaths } from "./build.ts";

const cc = Deno.env.get("CC") ?? "cc";

Deno.test("nativeInputDigests() changes when an optional system header appears, and only for the targets that include it", async () => {
  const dir = await Deno.makeTempDir({ prefix: "orchard-native-inputs-" });
  try {
    // A source that includes a header only when it exists, as verbs.c does
    // with <infiniband/verbs.h>.
    const src = `${dir}/optional.c`;
    await Deno.writeTextFile(
      src,
      "#if __has_include(<orchard_optional_test.h>)\n#include <orchard_optional_test.h>\n#endif\nint x;\n",
    );
    const other = `${dir}/plain.c`;
    await Deno.writeTextFile(other, "#include <stddef.h>\nint y;\n");
    await Deno.mkdir(`${dir}/include`);
    const env = { CPATH: `${dir}/include` };
    const targets = { optional: ["-shared", src], plain: ["-shared", other] };

    const before = await nativeInputDigests(cc, targets, env);
    assert.deepEqual(await nativeInputDigests(cc, targets, env), before);

    await Deno.writeTextFile(
      `${dir}/include/orchard_optional_test.h`,
      "#define ORCH_X 1\n",
    );
    const installed = await nativeInputDigests(cc, targets, env);
    assert.notEqual(installed.optional, before.optional);
    assert.equal(installed.plain, before.plain);

    // An upgraded header (new content) changes it again.
    await Deno.writeTextFile(
      `${dir}/include/orchard_optional_test.h`,
      "#define ORCH_X 2\n",
    );
    const upgraded = await nativeInputDigests(cc, targets, env);
    assert.notEqual(upgraded.optional, installed.optional);
    assert.equal(upgraded.plain, before.plain);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("ensureNativeBuilt() writes beside each artifact the digest of the inputs it was built from", async () => {
  await ensureNativeBuilt({ tests: true });
  const stamp = (p: string) => Deno.readTextFile(`${p}.inputs`);
  for (const p of [nativePaths.lib, nativePaths.cli, nativePaths.fakeVerbs]) {
    assert.match(await stamp(p), /^[0-9a-f]{64}$/);
  }
  // verbs.c is in the library (and includes <infiniband/verbs.h> when the
  // system has it); the fake verbs provider is built from other sources.
  assert.notEqual(
    await stamp(nativePaths.lib),
    await stamp(nativePaths.fakeVerbs),
  );
});
