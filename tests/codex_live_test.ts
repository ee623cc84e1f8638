/**
 * The real Codex CLI (`codex exec`, wire_api = "responses") against a
 * gateway over a scripted node: its first turn's model calls a namespaced
 * tool (`multi_agent_v1__close_agent`) after some reasoning, Codex runs the
 * tool, sends back the call, its output and the sealed reasoning, and the
 * second turn answers. Runs when ORCHARD_CODEX_BIN names a Codex binary
 * (pinned: Codex CLI 0.169.0, `npm i @openai/codex@0.169.0`); reported as
 * ignored otherwise.
 */
import assert from "node:assert/strict";
import { createWorld } from "../gateway/_testing.ts";

const BIN = Deno.env.get("ORCHARD_CODEX_BIN");

type Json = Record<string, unknown>;

Deno.test({
  name:
    "Codex CLI runs a namespaced tool and sends its sealed reasoning back through Orchard's Responses API",
  ignore: !BIN,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const w = await createWorld({
    maxBodyBytes: 4 * 1024 * 1024,
    script: {
      reasoning: "I will close the agent first.",
      toolCall: {
        name: "multi_agent_v1__close_agent",
        args: '{"target":"nobody"}',
      },
    },
  });
  const dir = await Deno.makeTempDir({ prefix: "orchard-codex-" });
  // the second model call answers in words (set once the first has come)
  const turn = setInterval(() => {
    if (w.up.requests.length >= 1 && w.up.script.toolCall) {
      w.up.script = { reasoning: "Now answer.", words: ["Hello", " there"] };
    }
  }, 2);
  try {
    await Deno.writeTextFile(
      `${dir}/config.toml`,
      [
        'model = "tiny"',
        'model_provider = "orchard"',
        "model_context_window = 2048",
        'model_reasoning_summary = "auto"',
        "[model_providers.orchard]",
        'name = "Orchard"',
        `base_url = "${w.url}/v1"`,
        'env_key = "ORCHARD_API_KEY"',
        'wire_api = "responses"',
        "request_max_retries = 0",
        "stream_max_retries = 0",
      ].join("\n"),
    );
    const out = await new Deno.Command(BIN!, {
      args: ["exec", "--skip-git-repo-check", "--json", "say hello"],
      env: { CODEX_HOME: dir, ORCHARD_API_KEY: w.key },
      cwd: dir,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    const lines = new TextDecoder().decode(out.stdout).split("\n")
      .filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Json);
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr.slice(-2000));
    const items = lines.filter((l) => l.type === "item.completed")
      .map((l) => l.item as Json);
    assert.deepEqual(
      items.filter((i) => i.type === "reasoning").map((i) => i.text),
      ["I will close the agent first.", "Now answer."],
    );
    assert.equal(
      items.find((i) => i.type === "agent_message")?.text,
      "Hello there",
    );
    // Codex dispatched the restored call to its close_agent tool
    assert.match(stderr, /invalid agent id nobody/);
    assert.equal(w.up.requests.length, 2);
    const [first, second] = w.up.requests.map((r) => r.body);
    const thread = lines.find((l) => l.type === "thread.started")!.thread_id;
    assert.equal(first!.prompt_cache_key, thread);
    const names = (first!.tools as { function: { name: string } }[])
      .map((t) => t.function.name);
    assert.ok(names.includes("multi_agent_v1__close_agent"), names.join());
    assert.ok(!JSON.stringify(first!.tools).includes("web_search"));
    const messages = second!.messages as Json[];
    const call = messages.find((m) => m.tool_calls);
    assert.deepEqual(call, {
      role: "assistant",
      content: null,
      tool_calls: [{
        id: "call_1",
        type: "function",
        function: {
          name: "multi_agent_v1__close_agent",
          arguments: '{"target":"nobody"}',
        },
      }],
      reasoning_content: "I will close the agent first.",
    });
  } finally {
    clearInterval(turn);
    await w.close();
    await Deno.remove(dir, { recursive: true });
  }
});
