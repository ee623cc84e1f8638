// deno-lint-ignore-file no-console
/**
 * Baselines for `deno task bench:engine`, each run in its own process by
 * bench/engine.ts and printing one JSON line:
 *
 *   bare MODEL TOKENS THREADS  a `llama_decode` loop over our FFI binding
 *                              (greedy, one token per decode, no serving layer)
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

const PROMPT = "Once upon a time";

async function bare(path: string, tokens: number, threads: number) {
  const llama = openLlama();
  const m = await LoadedLlama.load(llama, {
    path,
    ctxPerSeq: 2048,
    slots: 1,
    threads,
    batch: 512,
  });
  const greedy = m.sampler({
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
  });
  const start = performance.now();
  const prompt = m.tokenize(PROMPT, true);
  m.batch.clear();
  prompt.forEach((t, i) => m.batch.add(t, i, 0, i === prompt.length - 1));
  if (await m.decode() !== 0) throw new Error("prompt decode failed");
  let tok = m.sample(greedy, prompt.length - 1);
  let pos = prompt.length;
  for (let i = 1; i < tokens; i++) {
    m.batch.clear();
    m.batch.add(tok, pos++, 0, true);
    if (await m.decode() !== 0) throw new Error("decode failed");
    tok = m.sample(greedy, 0);
  }
  const seconds = (performance.now() - start) / 1000;
  m.close();
  return { tokensPerSecond: tokens / seconds, tokens };
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
  const [which, path, tokens, threads] = Deno.args;
  const run = which === "bare" ? bare : which === "nlc" ? nlc : null;
  if (!run || !path) {
    console.error("usage: engine_baselines.ts bare|nlc MODEL TOKENS THREADS");
    Deno.exit(2);
  }
  const res = await run(path, Number(tokens), Number(threads));
  console.log(JSON.stringify(res));
  Deno.exit(0);
}
