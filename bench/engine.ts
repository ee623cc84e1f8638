// deno-lint-ignore-file no-console
/**
 * `deno task bench:engine [--tokens N] [--rounds R] [--threads T]`: the llama
 * engine on a generated `small` model (~100 M parameters), in one run:
 *
 * 1. single-stream decode tokens/s of our engine (HTTP shapes, child process,
 *    scheduler) against a bare `llama_decode` loop over the same binding and
 *    against node-llama-cpp of the same version, same file, same threads;
 * 2. what a user sees through a real gateway and node (bench/_engine_path.ts):
 *    TTFT and inter-token latency p50/p99 per stream at 1, 2, 4 and 8
 *    concurrent streams, aggregate tokens/s, and the TTFT of a ~1,500-token
 *    system prompt cold, reused from the prefix cache, and a different one;
 * 3. the bare loop's decode-step p50/p99 at batch 1 and 4 as the floor for
 *    those gaps (4 streams share each decode step);
 * 4. a span (bench/_engine_span.ts): decode tokens/s local, split with a
 *    loopback ggml-rpc-server worker, and all layers on it, and the
 *    per-token cost of crossing to a worker (`--span-worker host:port`
 *    names a worker on another Mac instead, for the RDMA figure).
 *
 * Targets (a "targets" block ends the output): engine ≥ 0.95 × bare loop and
 * ≥ node-llama-cpp; client single stream ≥ 0.95 × bare loop; 4 streams ≥
 * 2.5 × one stream; client ITL p99 at 4 streams ≤ 1.5 × the bare step p99 at
 * batch 4; cold ÷ warm TTFT of the long prompt ≥ 5. Rounds are interleaved
 * and medians reported, because these machines are noisy.
 *
 * @module
 */
import { join } from "node:path";
import { parseArgs } from "node:util";
import { log } from "../lib/log.ts";
import { sseData } from "../lib/sse.ts";
import { createLlamaEngine, type LlamaEngine } from "../node/llama/engine.ts";
import { writeFixtureModel } from "../tools/fixture_model.ts";
import { spanBench } from "./_engine_span.ts";
import type { Lockstep } from "./engine_baselines.ts";
import {
  mid,
  openClientPath,
  printReuse,
  printStreams,
  type ReuseRound,
  reuseRound,
  STREAMS,
  type StreamsRound,
  streamsRound,
} from "./_engine_path.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    tokens: { type: "string" },
    rounds: { type: "string" },
    threads: { type: "string" },
    "span-worker": { type: "string" },
  },
});
const TOKENS = Number(values.tokens ?? 200);
const ROUNDS = Number(values.rounds ?? 3);
const THREADS = Number(
  values.threads ?? Math.max(1, navigator.hardwareConcurrency || 1),
);

Deno.env.set("ORCHARD_LOG_LEVEL", "error");
log.reload();

/** Runs one baseline of engine_baselines.ts in its own process; its JSON line. */
async function baseline<T>(which: "steps" | "nlc", model: string): Promise<T> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("./engine_baselines.ts", import.meta.url).pathname,
      which,
      model,
      String(TOKENS),
      String(THREADS),
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const line = new TextDecoder().decode(out.stdout).trim().split("\n").pop() ??
    "";
  if (!out.success) {
    throw new Error(
      `${which} failed: ${new TextDecoder().decode(out.stderr).slice(-800)}`,
    );
  }
  return JSON.parse(line);
}

/** One stream: tokens/s over the whole request (prompt of 4 tokens included). */
async function single(engine: LlamaEngine): Promise<number> {
  const start = performance.now();
  const res = await engine.completions({
    model: "small",
    prompt: "Once upon a time",
    max_tokens: TOKENS,
    temperature: 0,
    stream: true,
  }, new AbortController().signal);
  let tokens = 0;
  for await (const data of sseData(res.body!)) {
    if (data === "[DONE]") break;
    const f = JSON.parse(data);
    if (f.usage) tokens = f.usage.completion_tokens;
  }
  return tokens / ((performance.now() - start) / 1000);
}

const began = performance.now();
const dir = await Deno.makeTempDir({ prefix: "orchard-bench-engine-" });
try {
  const model = join(dir, "small.gguf");
  const params = await writeFixtureModel(model, { size: "small" });
  console.log(
    `bench:engine: generated small model (${
      (params / 1e6).toFixed(1)
    } M parameters, F16), ${THREADS} threads, ${TOKENS} tokens per stream, ${ROUNDS} interleaved rounds (medians)`,
  );
  const engine = createLlamaEngine({
    modelsDir: dir,
    slots: 8,
    threads: THREADS,
    maxQueue: 0,
  });
  await engine.start();
  await single(engine); // load and warm up
  // the same generated file (same size and seed), behind a gateway and a node
  const path = await openClientPath(THREADS);
  const ours: number[] = [];
  const nlc: number[] = [];
  const steps: { b1: Lockstep; b4: Lockstep }[] = [];
  const conc = new Map<number, StreamsRound[]>(STREAMS.map((n) => [n, []]));
  const reuse: ReuseRound[] = [];
  try {
    for (let r = 0; r < ROUNDS; r++) {
      steps.push(await baseline("steps", model));
      nlc.push(
        (await baseline<{ tokensPerSecond: number }>("nlc", model))
          .tokensPerSecond,
      );
      ours.push(await single(engine));
      for (const n of STREAMS) {
        conc.get(n)!.push(await streamsRound(path, n, TOKENS));
      }
      reuse.push(await reuseRound(path));
    }
  } finally {
    await path.cluster.close();
    await engine.close();
  }
  const o = mid(ours, (x) => x);
  const b = mid(steps, (s) => s.b1.tokensPerSecond);
  const l = mid(nlc, (x) => x);
  const b4 = mid(steps, (s) => s.b4.tokensPerSecond);
  const f = (x: number) => x.toFixed(1).padStart(8);
  const one = mid(conc.get(1)!, (x) => x.tokensPerSecond);
  console.log("\nsingle stream, decode tokens/s");
  console.log(`  bare llama_decode loop          ${f(b)}`);
  console.log(`  node-llama-cpp 3.21.1           ${f(l)}`);
  console.log(`  orchard llama engine            ${f(o)}  (in process)`);
  console.log(`  orchard via gateway + node      ${f(one)}  (at the client)`);
  const step = (k: "b1" | "b4", p: "stepP50" | "stepP99") =>
    mid(steps, (s) => s[k][p]);
  console.log(
    "\nbare loop decode step, ms (token to token: decode + sampling)",
  );
  console.log(
    `  batch${["p50", "p99", "tokens/s"].map((h) => h.padStart(9)).join("")}`,
  );
  for (const [k, n, tps] of [["b1", 1, b], ["b4", 4, b4]] as const) {
    console.log(
      `  ${String(n).padStart(5)} ${f(step(k, "stepP50"))} ${
        f(step(k, "stepP99"))
      } ${f(tps)}`,
    );
  }
  console.log(
    `  (batch 4: ×${
      (b4 / b).toFixed(2)
    } batch 1's tokens/s, this machine's own batching gain)`,
  );
  printStreams(conc, TOKENS);
  printReuse(reuse);

  const four = mid(conc.get(4)!, (x) => x.tokensPerSecond);
  const itl4 = mid(conc.get(4)!, (x) => x.itlP99);
  const cold = mid(reuse, (x) => x.other.ttft);
  const warm = mid(reuse, (x) => x.warm.ttft);
  const targets: [string, number, "≥" | "≤", number][] = [
    ["engine tokens/s ÷ bare loop", o / b, "≥", 0.95],
    ["engine tokens/s ÷ node-llama-cpp", o / l, "≥", 1],
    ["client 1-stream tokens/s ÷ bare loop", one / b, "≥", 0.95],
    ["client 4-stream tokens/s ÷ 1-stream", four / one, "≥", 2.5],
    [
      "client ITL p99 @4 ÷ bare step p99 @batch 4",
      itl4 / step("b4", "stepP99"),
      "≤",
      1.5,
    ],
    ["long prompt TTFT cold ÷ warm (reused)", cold / warm, "≥", 5],
  ];
  console.log("\ntargets");
  for (const [name, v, op, t] of targets) {
    const ok = op === "≥" ? v >= t : v <= t;
    console.log(
      `  ${name.padEnd(44)}${v.toFixed(3).padStart(8)}   ${op} ${
        t.toFixed(2)
      }   ${ok ? "PASS" : "MISS"}`,
    );
  }
  await spanBench(model, THREADS, TOKENS, values["span-worker"]);
  console.log(
    `  (cold: the different prompt of the same length; ran in ${
      ((performance.now() - began) / 1000).toFixed(0)
    } s)`,
  );
} finally {
  await Deno.remove(dir, { recursive: true });
}
