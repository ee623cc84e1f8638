import assert from "node:assert/strict";
import { k } from "./kv_keys.ts";
import { deleteResponse, loadResponse, saveResponse } from "./responses.ts";
import { createStore } from "./store.ts";

Deno.test("stored responses: a conversation larger than many KV values round-trips, per tenant, and is deleted whole", async () => {
  const kv = await Deno.openKv(":memory:");
  try {
    const store = await createStore(kv);
    // ~1.2 MB of text: 20 parts, written over 3 commits
    const big = "é, and some words ".repeat(64_000);
    const value = {
      response: { id: "resp_a", object: "response", output: [] },
      input: [{
        type: "message",
        role: "user",
        content: [{ type: "input_text", text: big }],
      }],
    };
    await saveResponse(store, "t1", "resp_a", value, 60_000);
    assert.deepEqual(await loadResponse(store, "t1", "resp_a"), value);
    assert.equal(await loadResponse(store, "t2", "resp_a"), null);
    assert.equal(await deleteResponse(store, "t2", "resp_a"), false);
    assert.equal(await deleteResponse(store, "t1", "resp_a"), true);
    assert.equal(await loadResponse(store, "t1", "resp_a"), null);
    assert.equal(await deleteResponse(store, "t1", "resp_a"), false);
    let left = 0;
    for await (const _ of kv.list({ prefix: ["response_part", "t1"] })) left++;
    assert.equal(left, 0, "every part is deleted");
  } finally {
    kv.close();
  }
});

Deno.test("stored responses: an expired response is not found, even before KV removes it", async () => {
  const kv = await Deno.openKv(":memory:");
  try {
    const store = await createStore(kv);
    const value = { response: { id: "resp_b" }, input: [] };
    await saveResponse(store, "t1", "resp_b", value, 5);
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(await loadResponse(store, "t1", "resp_b"), null);
    assert.equal(await deleteResponse(store, "t1", "resp_b"), false);
    // a head whose parts are gone reads as not found
    await saveResponse(store, "t1", "resp_c", value, 60_000);
    await kv.delete(k.responsePart("t1", "resp_c", 0));
    assert.equal(await loadResponse(store, "t1", "resp_c"), null);
  } finally {
    kv.close();
  }
});
