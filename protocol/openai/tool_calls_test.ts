import assert from "node:assert/strict";
import {
  normaliseToolCalls,
  ToolCallDeltas,
  toolFinishReason,
} from "./tool_calls.ts";

Deno.test("normaliseToolCalls() gives exact calls: id, type, string arguments, no extra keys", () => {
  const [a, b] = normaliseToolCalls([
    {
      id: "x1",
      index: 0,
      type: "function",
      function: { id: "x1", name: "f", arguments: "{}" },
    },
    { id: null, function: { name: "g", arguments: { a: 1 } } },
  ])!;
  assert.deepEqual(a, {
    id: "x1",
    type: "function",
    function: { name: "f", arguments: "{}" },
  });
  assert.match(b!.id as string, /^call_[0-9a-f]{24}$/);
  assert.deepEqual(b!.function, { name: "g", arguments: '{"a":1}' });
  assert.equal(normaliseToolCalls([]), null);
  assert.equal(normaliseToolCalls([{ function: "f" }]), null);
});

Deno.test("toolFinishReason() turns 'stop' or nothing into 'tool_calls' and keeps 'length'", () => {
  assert.equal(toolFinishReason("stop"), "tool_calls");
  assert.equal(toolFinishReason(undefined), "tool_calls");
  assert.equal(toolFinishReason("length"), "length");
});

Deno.test("ToolCallDeltas sends index, id, type and name once per call", () => {
  const d = new ToolCallDeltas();
  const f = (args: string) => ({
    index: 0,
    id: "c1",
    type: "function",
    function: { name: "f", arguments: args },
  });
  assert.deepEqual(d.push([f('{"a"')]), [{
    index: 0,
    id: "c1",
    type: "function",
    function: { name: "f", arguments: '{"a"' },
  }]);
  assert.deepEqual(d.push([f(":1}")]), [{
    index: 0,
    function: { arguments: ":1}" },
  }]);
  assert.equal(d.count, 1);
});

Deno.test("ToolCallDeltas infers indexes of index-less calls from ids, names and complete arguments", () => {
  const d = new ToolCallDeltas();
  const out = d.push([
    { function: { name: "f", arguments: "{}" } },
    { function: { name: "f", arguments: '{"b":2}' } },
    { id: "k", function: { name: "g", arguments: "{" } },
  ])!;
  assert.deepEqual(out.map((c) => c.index), [0, 1, 2]);
  assert.equal(new Set(out.map((c) => c.id)).size, 3);
  // A piece without index, id or name continues the last call.
  assert.deepEqual(d.push([{ function: { arguments: "}" } }]), [{
    index: 2,
    function: { arguments: "}" },
  }]);
  // A late name (none in the first delta) is sent once.
  const late = new ToolCallDeltas();
  late.push([{ index: 0, function: { arguments: "" } }]);
  assert.deepEqual(late.push([{ index: 0, function: { name: "h" } }]), [{
    index: 0,
    function: { name: "h", arguments: "" },
  }]);
  assert.equal(d.push(["x"]), null);
});
