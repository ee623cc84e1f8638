import assert from "node:assert/strict";
import { ChunkNormaliser, normaliseCompletion } from "./normalise.ts";

const call = (name: string, args: string) => ({
  id: "call_1",
  type: "function",
  function: { name, arguments: args },
});

Deno.test("a tool call counts its framing as delivered (64 bytes a call), once per call", () => {
  const answer = {
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: null,
        tool_calls: [call("f", "{}")],
      },
      finish_reason: "tool_calls",
    }],
    usage: { prompt_tokens: 5, completion_tokens: 30, total_tokens: 35 },
  };
  const { reported, counted } = normaliseCompletion(answer, "chat", "m");
  assert.equal(counted, 1 + 2 + 64);
  assert.equal(reported!.completion, 30, "billed as reported: under the count");

  const n = new ChunkNormaliser("chat", "m");
  const chunk = (delta: Record<string, unknown>) =>
    JSON.stringify({
      id: "c",
      object: "chat.completion.chunk",
      created: 1,
      model: "m",
      choices: [{ index: 0, delta, finish_reason: null }],
    });
  n.push(chunk({ tool_calls: [{ index: 0, ...call("get_weather", "") }] }));
  n.push(
    chunk({ tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] }),
  );
  n.push(
    chunk({ tool_calls: [{ index: 0, function: { arguments: '"Oslo"}' } }] }),
  );
  assert.equal(n.counted, 11 + 64 + 8 + 7);
});
