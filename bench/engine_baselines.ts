// deno-lint-ignore-file no-console
/**
 * Baselines for `deno task bench:engine`, each run in its own process by
 * bench/engine.ts and printing one JSON line:
 *
 *   steps MODEL TOKENS THREADS  the bare loop at batch 1, then at batch 4:
 *                               `{ b1: Lockstep, b4: Lockstep }`
 *   bare MODEL TOKENS THREADS   a `llama_decode` loop over our FFI binding
 *                               (greedy, one token per decode, no serving
 *                               layer): one Lockstep
 *   batch MODEL TOKENS THREADS N
 *                               the bare loop with N sequences per decode (the
 *                               hardware's own batching gain): one Lockstep
 *   nlc  MODEL TOKENS THREADS   node-llama-cpp (same version and library) with
 *                               the same context, threads and greedy sampling
 *
 * Tokens/s are over the whole generation, prompt (4 tokens) included, the
 * same window bench/engine.ts measures for our engine. A decode step is
 * token to token: batch, `llama_decode`, then sampling every sequence; at
 * batch N it is what each of N concurrent streams waits between tokens.
 *
 * @module
 */
import { openLlama } from "../node/llama/ffi.ts";
import { LoadedLlama } from "../node/llama/model.ts";
import type { SamplingParams } from "../node/llama/protocol.ts";
import { percentile } from "../tests/fixtures/stream_timing.ts";

const PROMPT = "Once upon a time";
const GREEDY: SamplingParams = {
  maxTokens: null,
  temperature: 0,
  topP: 1,
  topK: 0,
  minP: 0,
  repeatPenalty: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  seed: null,
  stop: [],
  grammar: null,
  logprobs: null,
};

/** One bare run: aggregate tokens/s and its decode-step times (ms). */
export interface Lockstep {
  tokensPerSecond: number;
  tokens: number;
  stepP50: number;
  stepP99: number;
}

/**
 * N sequences decoded together, greedy, `tokens` each, in a context of N
 * slots (N = 1 is the bare single-stream loop).
 */
async function lockstep(
  path: string,
  tokens: number,
  threads: number,
  n: number,
): Promise<Lockstep> {
  const m = await LoadedLlama.load(openLlama(), {
    path,
    ctxPerSeq: 2048,
    slots: n,
    threads,
    batch: 512,
  });
  /** Generates `steps` tokens per sequence; returns the sorted step times. */
  const run = (steps: number) => {
    const samplers = Array.from({ length: n }, () => m.sampler(GREEDY));
    for (let s = 0; s < n; s++) m.clearSeq(s);
    const prompt = m.tokenize(PROMPT, true);
    m.batch.clear();
    const outs: number[] = [];
    for (let s = 0; s < n; s++) {
      prompt.forEach((t, i) => {
        const last = i === prompt.length - 1;
        const idx = m.batch.add(t, i, s, last);
        if (last) outs.push(idx);
      });
    }
    if (m.decode() !== 0) throw new Error("prompt decode failed");
    let toks = outs.map((o, s) => m.sample(samplers[s]!, o));
    const times: number[] = [];
    let last = performance.now();
    for (let i = 1; i < steps; i++) {
      m.batch.clear();
      toks.forEach((t, s) => m.batch.add(t, prompt.length + i - 1, s, true));
      if (m.decode() !== 0) throw new Error("decode failed");
      toks = toks.map((_, s) => m.sample(samplers[s]!, s));
      const now = performance.now();
      times.push(now - last);
      last = now;
    }
    return times.sort((a, b) => a - b);
  };
  // warm up once (first touch of the mapped weights, graph allocation), as
  // bench/engine.ts does for our engine, then forget it
  run(8);
  const start = performance.now();
  const steps = run(tokens);
  const seconds = (performance.now() - start) / 1000;
  m.close();
  return {
    tokensPerSecond: (n * tokens) / seconds,
    tokens: n * tokens,
    stepP50: percentile(steps, 0.5),
    stepP99: percentile(steps, 0.99),
  };
}

async function nlc(path: string, tokens: number, threads: number) {
  const { getLlama } = await import("node-llama-cpp");
  const llama = await getLlama({ gpu: false, build: "never" });
  const model = await llama.loadModel({ modelPath: path });
  const ctx = await model.createContext({
    contextSize: 2048,
    threads,
    batchSize: 512,
    sequences: 1,
  });
  const seq = ctx.getSequence();
  let n = 0;
  let start = 0;
  for await (
    const _ of seq.evaluate(model.tokenize(PROMPT), { temperature: 0 })
  ) {
    if (n++ === 0) start = performance.now();
    if (n >= tokens) break;
  }
  const seconds = (performance.now() - start) / 1000;
  await ctx.dispose();
  await model.dispose();
  await llama.dispose();
  return { tokensPerSecond: n / seconds, tokens: n };
}

if (import.meta.main) {
  const [which, path, tokensArg, threadsArg, nArg] = Deno.args;
  if (!["steps", "bare", "batch", "nlc"].includes(which ?? "") || !path) {
    console.error(
      "usage: engine_baselines.ts steps|bare|batch|nlc MODEL TOKENS THREADS [N]",
    );
    Deno.exit(2);
  }
  const tokens = Number(tokensArg);
  const threads = Number(threadsArg);
  const res = which === "steps"
    ? {
      b1: await lockstep(path, tokens, threads, 1),
      b4: await lockstep(path, tokens, threads, 4),
    }
    : which === "bare"
    ? await lockstep(path, tokens, threads, 1)
    : which === "batch"
    ? await lockstep(path, tokens, threads, Number(nArg ?? 4))
    : await nlc(path, tokens, threads);
  console.log(JSON.stringify(res));
  Deno.exit(0);
}
