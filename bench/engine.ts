// deno-lint-ignore-file no-console
/**
 * `deno task bench:engine [--tokens N] [--rounds R] [--threads T]`: the llama engine on a
 * generated `small` model (~100 M parameters), in one run:
 *
 * 1. single-stream decode tokens/s of our engine (HTTP shapes, child process,
 *    scheduler) against a bare `llama_decode` loop over the same binding and
 *    against node-llama-cpp of the same version, same file, same threads;
 * 2. aggregate tokens/s at 1, 2, 4 and 8 concurrent streams.
 *
 * Targets: single stream ≥ 0.95 × bare loop and ≥ node-llama-cpp; 4 streams
 * ≥ 2.5 × one stream. Rounds are interleaved and medians reported, because
 * these machines are noisy.
 *
 * @module
 */
import { join } from "node:path";
import { parseArgs } from "node:util";
import { log } from "../lib/log.ts";
import { sseData } from "../node/engines/_sse.ts";
import { createLlamaEngine, type LlamaEngine } from "../node/llama/engine.ts";
import { writeFixtureModel } from "../tools/fixture_model.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    tokens: { type: "string" },
    rounds: { type: "string" },
    threads: { type: "string" },
  },
});
const TOKENS = Number(values.tokens ?? 96);
const ROUNDS = Number(values.rounds ?? 3);
const THREADS = Number(
  values.threads ?? Math.max(1, navigator.hardwareConcurrency || 1),
);

Deno.env.set("ORCHARD_LOG_LEVEL", "error");
log.reload();

const median = (xs: number[]) =>
  [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function baseline(
  which: "bare" | "nlc" | "batch",
  model: string,
  n = 1,
): Promise<number> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("./engine_baselines.ts", import.meta.url).pathname,
      which,
      model,
      String(TOKENS),
      String(THREADS),
      String(n),
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
  return JSON.parse(line).tokensPerSecond;
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

/** `n` concurrent streams: all tokens over the wall time. */
async function concurrent(engine: LlamaEngine, n: number): Promise<number> {
  const start = performance.now();
  const counts = await Promise.all(Array.from({ length: n }, async (_, i) => {
    const res = await engine.completions({
      model: "small",
      prompt: `Stream ${i}: once upon a time`,
      max_tokens: TOKENS,
      temperature: 0,
    }, new AbortController().signal);
    return (await res.json()).usage.completion_tokens as number;
  }));
  const total = counts.reduce((a, b) => a + b, 0);
  return total / ((performance.now() - start) / 1000);
}

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
  const ours: number[] = [];
  const bare: number[] = [];
  const nlc: number[] = [];
  const bare4: number[] = [];
  const conc: Record<number, number[]> = { 1: [], 2: [], 4: [], 8: [] };
  for (let r = 0; r < ROUNDS; r++) {
    bare.push(await baseline("bare", model));
    nlc.push(await baseline("nlc", model));
    bare4.push(await baseline("batch", model, 4));
    ours.push(await single(engine));
    for (const n of [1, 2, 4, 8]) conc[n]!.push(await concurrent(engine, n));
  }
  await engine.close();
  const o = median(ours);
  const b = median(bare);
  const l = median(nlc);
  const f = (x: number) => x.toFixed(1).padStart(8);
  const verdict = (ok: boolean) => (ok ? "met" : "NOT met");
  console.log("\nsingle stream, decode tokens/s");
  console.log(`  bare llama_decode loop   ${f(b)}`);
  console.log(`  node-llama-cpp 3.21.1    ${f(l)}`);
  console.log(`  orchard llama engine     ${f(o)}`);
  console.log(
    `  ratio to bare loop       ${
      (o / b).toFixed(3).padStart(8)
    }  (target ≥ 0.95: ${verdict(o / b >= 0.95)})`,
  );
  console.log(
    `  ratio to node-llama-cpp  ${
      (o / l).toFixed(3).padStart(8)
    }  (target ≥ 1.00: ${verdict(o / l >= 1)})`,
  );
  console.log("\nconcurrent streams, aggregate tokens/s (continuous batching)");
  const one = median(conc[1]!);
  for (const n of [1, 2, 4, 8]) {
    const v = median(conc[n]!);
    const note = n === 4 ? `  (target ≥ 2.5: ${verdict(v / one >= 2.5)})` : "";
    console.log(
      `  ${String(n).padStart(2)} streams  ${f(v)}   ×${
        (v / one).toFixed(2)
      } one stream${note}`,
    );
  }
  const b4 = median(bare4);
  console.log(
    `  reference: the bare loop decoding 4 sequences at once: ${
      b4.toFixed(1)
    } tokens/s, ×${
      (b4 / b).toFixed(2)
    } the bare single stream (this machine's own batching gain);\n  our 4 streams reach ${
      (median(conc[4]!) / b4).toFixed(3)
    } of it`,
  );
} finally {
  await Deno.remove(dir, { recursive: true });
}
