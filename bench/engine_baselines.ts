// deno-lint-ignore-file no-console
/**
 * Baselines for `deno task bench:engine`, each run in its own process by
 * bench/engine.ts and printing one JSON line:
 *
 *   bare MODEL TOKENS THREADS  a `llama_decode` loop over our FFI binding
 *                              (greedy, one token per decode, no serving layer)
 *   batch MODEL TOKENS THREADS N
 *                              the bare loop with N sequences per decode (the
 *                              hardware's own batching gain, for reference)
 *   nlc  MODEL TOKENS THREADS  node-llama-cpp (same version and library) with
 *                              the same context, threads and greedy sampling
 *
 * Both report tokens/s over the whole generation, prompt (4 tokens)
 * included, the same window bench/engine.ts measures for our engine.
 *
 * @module
 */
import { openLlama } from "../node/llama/ffi.ts";
import { LoadedLlama } from "../node/llama/model.ts";
import type { SamplingParams } from "../node/llama/protocol.ts";

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

async function bare(path: string, tokens: number, threads: number) {
  const llama = openLlama();
  const m = await LoadedLlama.load(llama, {
    path,
    ctxPerSeq: 2048,
    slots: 1,
    threads,
    batch: 512,
  });
  const greedy = m.sampler(GREEDY);
  // warm up once (first touch of the mapped weights, graph allocation), as
  // bench/engine.ts does for our engine, then forget it
  greedyRun(m, greedy, 8);
  m.clearSeq(0);
  const start = performance.now();
  greedyRun(m, greedy, tokens);
  const seconds = (performance.now() - start) / 1000;
  m.close();
  return { tokensPerSecond: tokens / seconds, tokens };
}

function greedyRun(
  m: LoadedLlama,
  greedy: Deno.PointerObject,
  tokens: number,
) {
  const prompt = m.tokenize(PROMPT, true);
  m.batch.clear();
  prompt.forEach((t, i) => m.batch.add(t, i, 0, i === prompt.length - 1));
  if (m.decode() !== 0) throw new Error("prompt decode failed");
  let tok = m.sample(greedy, prompt.length - 1);
  let pos = prompt.length;
  for (let i = 1; i < tokens; i++) {
    m.batch.clear();
    m.batch.add(tok, pos++, 0, true);
    if (m.decode() !== 0) throw new Error("decode failed");
    tok = m.sample(greedy, 0);
  }
}

/** N sequences decoded together, greedy, `tokens` each; aggregate tokens/s. */
async function batch(path: string, tokens: number, threads: number, n: number) {
  const llama = openLlama();
  const m = await LoadedLlama.load(llama, {
    path,
    ctxPerSeq: 2048,
    slots: n,
    threads,
    batch: 512,
  });
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
    for (let i = 1; i < steps; i++) {
      m.batch.clear();
      toks.forEach((t, s) => m.batch.add(t, prompt.length + i - 1, s, true));
      if (m.decode() !== 0) throw new Error("decode failed");
      toks = toks.map((_, s) => m.sample(samplers[s]!, s));
    }
  };
  run(8);
  const start = performance.now();
  run(tokens);
  const seconds = (performance.now() - start) / 1000;
  m.close();
  return { tokensPerSecond: (n * tokens) / seconds, tokens: n * tokens };
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
  const [which, path, tokens, threads, n] = Deno.args;
  if (!["bare", "nlc", "batch"].includes(which ?? "") || !path) {
    console.error(
      "usage: engine_baselines.ts bare|nlc|batch MODEL TOKENS THREADS [N]",
    );
    Deno.exit(2);
  }
  const res = which === "batch"
    ? await batch(path, Number(tokens), Number(threads), Number(n ?? 4))
    : await (which === "bare" ? bare : nlc)(
      path,
      Number(tokens),
      Number(threads),
    );
  console.log(JSON.stringify(res));
  Deno.exit(0);
}
