import assert from "node:assert/strict";
import { placementReport } from "./placement.ts";

Deno.test("placementReport() names what a fronted engine serves instead", () => {
  const r = placementReport([{ id: "qwen-7b", pinned: true }], [
    { id: "llama-3", loaded: true, kind: "chat" },
  ], { canUnload: false });
  assert.equal(r.mismatch, "desired qwen-7b, engine serves llama-3");
  assert.deepEqual(r.missing, ["qwen-7b"]);
  assert.deepEqual(r.extra, ["llama-3"]);
  const ok = placementReport([{ id: "a", pinned: true }], [
    { id: "a", loaded: false, kind: "chat" },
    { id: "b", loaded: false, kind: "chat", servable: false },
  ], { canUnload: true });
  assert.equal(ok.mismatch, null);
  assert.deepEqual(ok.notLoaded, ["a"]);
  const failed = placementReport([{ id: "a", pinned: true }], [
    { id: "a", loaded: false, kind: "chat" },
  ], { canUnload: true, errors: { a: "out of memory" } });
  assert.equal(
    failed.mismatch,
    "desired a, engine serves a (a: out of memory)",
  );
});
