import assert from "node:assert/strict";
import { runNativeCommand } from "./cli.ts";

Deno.test("runNativeCommand() returns 2 for an unknown command or a linktest without a token", async () => {
  const prior = Deno.env.get("ORCHARD_LINKTEST_TOKEN");
  Deno.env.delete("ORCHARD_LINKTEST_TOKEN");
  try {
    assert.equal(await runNativeCommand(["bogus"]), 2);
    assert.equal(await runNativeCommand(["linktest", "--listen", "0"]), 2);
    assert.equal(
      await runNativeCommand([
        "linktest",
        "--connect",
        "nohostport",
        "--token",
        "t",
      ]),
      2,
    );
  } finally {
    if (prior !== undefined) Deno.env.set("ORCHARD_LINKTEST_TOKEN", prior);
  }
});
