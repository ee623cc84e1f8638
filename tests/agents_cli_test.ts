/**
 * The real coding agents, pinned in tools/agents/package.json and installed
 * by the test set-up (tools/test_setup.ts), run headless against a real
 * gateway and node process. The node fronts a scripted engine
 * (fixtures/scripted_upstream.ts, `--engine openai`) that plays a planned
 * tool sequence, so each agent runs its own tools on real files:
 *
 * - Claude Code (`claude -p`, Anthropic Messages) reads two files with its
 *   Read tool over three turns and answers with what the second holds.
 * - Codex CLI (`codex exec`, Responses) does the same with `exec_command`.
 *
 * What passes is what a user of the agent sees: exit 0 and the file's
 * secret in the final answer, which the engine could only know from the
 * tool results the agent sent back through the gateway.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { startCluster } from "./fixtures/cluster.ts";
import {
  startScriptedUpstream,
  type Step,
} from "./fixtures/scripted_upstream.ts";

const AGENTS = new URL("../tools/agents/node_modules/.bin/", import.meta.url)
  .pathname;
const SECRET = "PERSIMMON-7341";

/** A work directory with two files: the first names the second. */
async function workDir(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "orchard-agent-" });
  await Deno.writeTextFile(
    join(dir, "notes.txt"),
    "The answer is in details.txt.\n",
  );
  await Deno.writeTextFile(
    join(dir, "details.txt"),
    `The secret word is ${SECRET}.\n`,
  );
  return dir;
}

/** The final answer: the secret found in the tool results, or a miss. */
const answer = (results: string[]) => {
  const m = /secret word is ([A-Z0-9-]+)/.exec(results.join("\n"));
  return m ? `The secret word is ${m[1]}.` : "I could not find it.";
};

async function run(
  bin: string,
  args: string[],
  opts: { cwd: string; env: Record<string, string> },
): Promise<{ code: number; stdout: string; stderr: string }> {
  const path = `${AGENTS}${bin}`;
  try {
    await Deno.stat(path);
  } catch {
    throw new Error(
      `${path} is missing: the pinned agents are installed by \`deno run -A tools/test_setup.ts\` (npm ci in tools/agents)`,
    );
  }
  const out = await new Deno.Command(path, {
    args,
    cwd: opts.cwd,
    env: opts.env,
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(180_000),
  }).output();
  const dec = new TextDecoder();
  return {
    code: out.code,
    stdout: dec.decode(out.stdout),
    stderr: dec.decode(out.stderr),
  };
}

/** The environment an agent gets: a home of its own, nothing from ours. */
function baseEnv(home: string): Record<string, string> {
  return {
    HOME: home,
    PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
    LANG: "C.UTF-8",
    TERM: "dumb",
  };
}

/** Runs `claude -p PROMPT` headless in `dir` against the cluster's gateway. */
function claude(
  c: { url: string; apiKey: string },
  dir: string,
  home: string,
  prompt: string,
) {
  return run("claude", [
    "-p",
    prompt,
    "--output-format",
    "json",
    "--model",
    "agent",
  ], {
    cwd: dir,
    env: {
      ...baseEnv(home),
      ANTHROPIC_BASE_URL: c.url,
      ANTHROPIC_API_KEY: c.apiKey,
      ANTHROPIC_DEFAULT_HAIKU_MODEL: "agent",
      DISABLE_TELEMETRY: "1",
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
    },
  });
}

/**
 * Runs `codex exec PROMPT` in `dir` against the cluster's gateway, with a
 * config.toml for an Orchard provider in `home` (its CODEX_HOME).
 */
async function codex(
  c: { url: string; apiKey: string },
  dir: string,
  home: string,
  prompt: string,
  opts: { contextWindow?: number; json?: boolean } = {},
) {
  await Deno.writeTextFile(
    join(home, "config.toml"),
    [
      'model = "agent"',
      'model_provider = "orchard"',
      ...(opts.contextWindow
        ? [`model_context_window = ${opts.contextWindow}`]
        : []),
      "[model_providers.orchard]",
      'name = "Orchard"',
      `base_url = "${c.url}/v1"`,
      'env_key = "ORCHARD_API_KEY"',
      'wire_api = "responses"',
      "",
    ].join("\n"),
  );
  return run("codex", [
    "exec",
    "--skip-git-repo-check",
    "--sandbox",
    "danger-full-access",
    ...(opts.json ? ["--json"] : []),
    prompt,
  ], {
    cwd: dir,
    env: {
      ...baseEnv(home),
      CODEX_HOME: home,
      ORCHARD_API_KEY: c.apiKey,
    },
  });
}

/**
 * A three-turn task on the scripted engine: a work directory with the two
 * files, an engine playing `plan`, a gateway and node in front of it, and
 * the agent `run` there; returns its output and what the engine was sent.
 */
async function scriptedTask(
  plan: (dir: string) => Step[],
  run: (
    c: { url: string; apiKey: string },
    dir: string,
    home: string,
  ) => Promise<{ code: number; stdout: string; stderr: string }>,
) {
  const dir = await workDir();
  const home = await Deno.makeTempDir({ prefix: "orchard-agent-home-" });
  const up = startScriptedUpstream(plan(dir), { models: ["agent"] });
  try {
    await using cluster = await startCluster({
      openai: { upstreamUrl: up.url, models: ["agent"] },
    });
    const r = await run(cluster, dir, home);
    // The engine saw the real file contents, sent back by the agent's tool.
    const turns = up.requests.filter((b) =>
      JSON.stringify(b.messages).includes(SECRET)
    );
    assert.ok(turns.length >= 1, "no request carried the tool's result");
    return r;
  } finally {
    await up.close();
    await Deno.remove(dir, { recursive: true });
    await Deno.remove(home, { recursive: true });
  }
}

const TASK = "What is the secret word? Start with notes.txt.";

Deno.test({
  name:
    "agents: Claude Code reads two files with its Read tool over three turns through the gateway",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const r = await scriptedTask(
      (dir) => [
        { tool: "Read", arguments: { file_path: join(dir, "notes.txt") } },
        { tool: "Read", arguments: { file_path: join(dir, "details.txt") } },
        { text: answer },
      ],
      (c, dir, home) => claude(c, dir, home, TASK),
    );
    assert.equal(
      r.code,
      0,
      `claude exited ${r.code}: ${r.stdout}\n${r.stderr}`,
    );
    const result = JSON.parse(r.stdout) as Record<string, unknown>;
    assert.equal(result.is_error, false, r.stdout);
    assert.match(String(result.result), new RegExp(SECRET));
    assert.ok(
      (result.num_turns as number) >= 3,
      `num_turns ${result.num_turns}`,
    );
  },
});

Deno.test({
  name:
    "agents: Codex CLI reads two files with exec_command over three turns through the gateway",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const r = await scriptedTask(
      () => [
        { tool: "exec_command", arguments: { cmd: "cat notes.txt" } },
        { tool: "exec_command", arguments: { cmd: "cat details.txt" } },
        { text: answer },
      ],
      (c, dir, home) => codex(c, dir, home, TASK),
    );
    assert.equal(r.code, 0, `codex exited ${r.code}: ${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, new RegExp(SECRET), r.stderr.slice(-2000));
  },
});

/**
 * The llama engine on the agent-sized fixture model (128k context): each
 * agent's real first turn, its whole prompt (Claude Code's ~49k tokens,
 * Codex's ~38k), is prefilled and answered with a stream the agent takes
 * as a finished turn. The fixture's words are gibberish that ends after a
 * few tokens (tools/fixture_model.ts); the node's output cap
 * (`ORCHARD_MAX_OUTPUT_TOKENS`) only bounds the run.
 */
Deno.test({
  name:
    "agents: on the llama engine with an agent-sized context, each agent's first turn is a stream it accepts",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const dir = await workDir();
    const home = await Deno.makeTempDir({ prefix: "orchard-agent-home-" });
    await using cluster = await startCluster({
      models: [{ name: "agent", size: "agent" }],
      slots: 1,
      nodeEnv: { ORCHARD_MAX_OUTPUT_TOKENS: "512" },
    });
    try {
      await t.step("Claude Code", async () => {
        const r = await claude(cluster, dir, home, "say hello");
        assert.equal(
          r.code,
          0,
          `claude exited ${r.code}: ${r.stdout}\n${r.stderr}`,
        );
        const result = JSON.parse(r.stdout) as Record<string, unknown>;
        assert.equal(result.is_error, false, r.stdout);
        const usage = result.usage as {
          input_tokens: number;
          output_tokens: number;
          cache_read_input_tokens?: number;
        };
        // the whole agent prompt reached the model, counted by its tokenizer
        assert.ok(
          usage.input_tokens + (usage.cache_read_input_tokens ?? 0) > 20_000,
          JSON.stringify(usage),
        );
        assert.ok(usage.output_tokens > 0, JSON.stringify(usage));
      });
      await t.step("Codex CLI", async () => {
        const r = await codex(cluster, dir, home, "say hello", {
          contextWindow: 131072,
          json: true,
        });
        assert.equal(
          r.code,
          0,
          `codex exited ${r.code}: ${r.stdout}\n${r.stderr}`,
        );
        const events = r.stdout.trim().split("\n").map((l) => JSON.parse(l));
        const done = events.find((e) => e.type === "turn.completed");
        assert.ok(done, r.stdout.slice(-2000));
        assert.ok(done.usage.input_tokens > 20_000, JSON.stringify(done));
      });
    } finally {
      await Deno.remove(dir, { recursive: true });
      await Deno.remove(home, { recursive: true });
    }
  },
});
