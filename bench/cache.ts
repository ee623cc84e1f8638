// deno-lint-ignore-file no-console
/**
 * `deno task bench:cache [--sessions S] [--slots K]`: prompt tokens served
 * from the KV cache across the turns of coding-agent sessions, through a
 * real gateway and llama node on the `agent` fixture model (128k context),
 * in one run:
 *
 * - each session replays the captured 10-turn Claude Code 2.1.328 session
 *   (tests/fixtures/agents/claude_code_session.json: the requests the
 *   pinned CLI sent, turn by turn, with its tools, system blocks, its
 *   `system` entry inside `messages`, `cache_control` moving to the last
 *   block, the Read tool's results), each session with a task line of its
 *   own in its first user message. The first system line,
 *   `x-anthropic-billing-header`, gets a new `cch=` on every request, as
 *   Claude Code's does in interactive use;
 * - S sessions (default 2) take turns on a node with K slots (default 1):
 *   fewer slots than sessions, so each session finds its slot taken by
 *   another's prefix when it comes back;
 * - reported: prompt tokens served from cache (`cache_read_input_tokens`)
 *   as a share of the prompt tokens of turns 2…10 (target ≥ 90 %), with the
 *   host-memory prefix cache (node/llama/prefix_store.ts) and without it
 *   (`ORCHARD_PREFIX_CACHE_MEMORY=0`, same slot policy), and their ratio.
 *
 * The billing line: when the gateway does not drop it from the prompt
 * (probed first: two requests differing only in it), every prompt differs
 * from the ~20th token on and nothing could be reused; the bench then
 * says so and sends requests without it.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { type Cluster, startCluster } from "../tests/fixtures/cluster.ts";

const args = parseArgs({
  args: Deno.args,
  options: {
    sessions: { type: "string", default: "2" },
    slots: { type: "string", default: "1" },
  },
}).values;
const SESSIONS = Number(args.sessions);
const SLOTS = Number(args.slots);

type Block = Record<string, unknown>;
type Message = { role: string; content: string | Block[] };

/** The captured session: tools and system once, each turn's own fields. */
const captured = JSON.parse(
  await Deno.readTextFile(
    new URL(
      "../tests/fixtures/agents/claude_code_session.json",
      import.meta.url,
    ),
  ),
) as {
  system: Block[];
  tools: Block[];
  turns: ({ messages: Message[] } & Record<string, unknown>)[];
};
const TURNS = captured.turns.length;

const BILLING = /^x-anthropic-billing-header:/;

/** Claude Code's billing line, with a `cch=` of its own on every request. */
function billingLine(): Block {
  const cch = crypto.randomUUID().slice(0, 5);
  return {
    type: "text",
    text:
      `x-anthropic-billing-header: cc_version=2.1.328.07e; cc_entrypoint=cli; cch=${cch};`,
  };
}

class Session {
  constructor(readonly n: number) {}

  /** Turn `turn` (1-based) of the capture, as this session sends it. */
  body(turn: number, withBilling: boolean): Record<string, unknown> {
    const t = structuredClone(captured.turns[turn - 1]!);
    const first = t.messages[0]!;
    const task = { type: "text", text: `Session ${this.n}.` };
    first.content = Array.isArray(first.content)
      ? [task, ...first.content]
      : [task, { type: "text", text: first.content }];
    const system = captured.system.filter((b) =>
      !BILLING.test(String(b.text ?? ""))
    );
    return {
      ...t,
      model: "agent",
      max_tokens: 16,
      temperature: 0,
      stream: false,
      system: withBilling ? [billingLine(), ...system] : system,
      tools: captured.tools,
    };
  }
}

interface Usage {
  input_tokens: number;
  cache_read_input_tokens?: number;
}

async function send(c: Cluster, body: Record<string, unknown>) {
  const res = await fetch(`${c.url}/v1/messages`, {
    method: "POST",
    headers: {
      "x-api-key": c.apiKey,
      "anthropic-version": "2023-06-01",
      "content-type": "application/json",
    },
    body: JSON.stringify(body),
  });
  const j = await res.json();
  if (res.status !== 200) {
    throw new Error(
      `/v1/messages answered ${res.status}: ${JSON.stringify(j)}`,
    );
  }
  const u = j.usage as Usage;
  const cached = u.cache_read_input_tokens ?? 0;
  return { prompt: u.input_tokens + cached, cached };
}

/** Whether the gateway drops the billing line: two requests differing only in it. */
async function gatewayDropsBilling(c: Cluster): Promise<boolean> {
  const s = new Session(99);
  await send(c, s.body(1, true));
  const again = await send(c, s.body(1, true));
  return again.cached >= again.prompt * 0.9;
}

async function run(prefixCache: string, withBilling: boolean | null) {
  await using c = await startCluster({
    models: [{ name: "agent", size: "agent" }],
    slots: SLOTS,
    threads: 2,
    nodeEnv: { ORCHARD_PREFIX_CACHE_MEMORY: prefixCache },
    gatewayEnv: { ORCHARD_QUEUE_TIMEOUT_MS: "600000" },
  });
  const billing = withBilling ?? await gatewayDropsBilling(c);
  const sessions = Array.from({ length: SESSIONS }, (_, i) => new Session(i));
  let prompt = 0;
  let cached = 0;
  let firstPrompt = 0;
  const t0 = performance.now();
  for (let turn = 1; turn <= TURNS; turn++) {
    for (const s of sessions) {
      const r = await send(c, s.body(turn, billing));
      if (turn === 1) firstPrompt = Math.max(firstPrompt, r.prompt);
      else {
        prompt += r.prompt;
        cached += r.cached;
      }
    }
  }
  return {
    billing,
    share: cached / Math.max(1, prompt),
    prompt,
    cached,
    firstPrompt,
    seconds: (performance.now() - t0) / 1000,
  };
}

console.log(
  `bench:cache: ${SESSIONS} replays of a captured ${TURNS}-turn Claude Code session, interleaved, on ${SLOTS} slot(s) of the agent fixture model`,
);
const full = await run("2GiB", null);
if (!full.billing) {
  console.log(
    "note: this gateway keeps Claude Code's per-request billing line in the prompt (its stripping is not merged here); requests are sent without it",
  );
}
const off = await run("0", full.billing);
const pct = (x: number) => `${(x * 100).toFixed(1)} %`;
for (
  const [name, r] of [["host prefix cache", full], [
    "no host prefix cache",
    off,
  ]] as const
) {
  console.log(
    `${
      name.padEnd(22)
    } turn 1 prompt ${r.firstPrompt} tokens; turns 2–${TURNS}: ${r.cached} of ${r.prompt} prompt tokens from cache = ${
      pct(r.share)
    } (${r.seconds.toFixed(1)} s)`,
  );
}
console.log("targets");
console.log(
  `  cached share of turns 2–${TURNS} ≥ 90 %: ${pct(full.share)} ${
    full.share >= 0.9 ? "ok" : "MISSED"
  }`,
);
console.log(
  `  with ÷ without host prefix cache: ${
    (full.share / Math.max(1e-9, off.share)).toFixed(2)
  }× the cached share, ${(off.seconds / full.seconds).toFixed(2)}× faster`,
);
