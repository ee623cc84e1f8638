// deno-lint-ignore-file no-console -- prints bench:engine's client-path sections
/**
 * The deployed path for `deno task bench:engine`: a real gateway and node
 * (tests/fixtures/cluster.ts) serving the same generated `small` model, the
 * official openai SDK as the client, and every text event timed at the
 * client (tests/fixtures/stream_timing.ts, `performance.now()` in the bench
 * process). What a user sees: time to first text (TTFT), the gap between
 * consecutive text events (inter-token latency, ITL), tokens/s, and what
 * the prefix cache saves on a repeated long system prompt.
 *
 * Each request opens with a system message of its own (a fresh tag at its
 * first characters), so the prefix cache shares only the template's
 * `<|im_start|>system\n` between them; the tables print the most cached
 * tokens seen as evidence.
 *
 * @module
 */
import OpenAI from "openai";
import { type Cluster, startCluster } from "../tests/fixtures/cluster.ts";
import {
  median,
  percentile,
  type StreamTiming,
  timeChatStream,
} from "../tests/fixtures/stream_timing.ts";

/** Concurrent stream counts measured on the client path. */
export const STREAMS = [1, 2, 4, 8] as const;
/** Characters of the long system prompt; the fixture vocabulary is bytes, so ≈ tokens. */
const LONG_PROMPT_CHARS = 1_480;

/** A gateway + node pair and a client of it. */
export interface ClientPath {
  client: OpenAI;
  cluster: Cluster;
}

/** One round of `n` concurrent streams, summarised over its streams. */
export interface StreamsRound {
  /** Median TTFT of the streams, ms. */
  ttft: number;
  /** Slowest stream's TTFT, ms. */
  ttftMax: number;
  /** Median over streams of each stream's ITL p50, ms. */
  itlP50: number;
  /** Median over streams of each stream's ITL p99, ms. */
  itlP99: number;
  /** Worst stream's ITL p99, ms. */
  itlP99Max: number;
  /** All completion tokens over the wall time from sending to the last text. */
  tokensPerSecond: number;
  /** Most prompt tokens any stream got from the prefix cache. */
  cached: number;
  /** Why streams failed (an error answer, a broken stream); the figures leave them out. */
  failures: string[];
}

/** One long-prompt request: TTFT and its usage. */
export interface LongAsk {
  ttft: number;
  promptTokens: number;
  cachedTokens: number;
  /** Why it failed (the figures are NaN then). */
  error?: string;
}

/** One round of the prefix-reuse section. */
export interface ReuseRound {
  /** A new long system prompt. */
  cold: LongAsk;
  /** The same prompt again: its prefix comes from the node's cache. */
  warm: LongAsk;
  /** A different long prompt of the same length: nothing to reuse. */
  other: LongAsk;
}

/** Starts the cluster on the `small` model and loads the model with one request. */
export async function openClientPath(threads: number): Promise<ClientPath> {
  const cluster = await startCluster({
    models: [{ name: "small", size: "small" }],
    slots: 8,
    threads,
  });
  const client = new OpenAI({
    apiKey: cluster.apiKey,
    baseURL: `${cluster.url}/v1`,
    maxRetries: 0,
    timeout: 120_000,
  });
  await client.chat.completions.create({
    model: "small",
    messages: [{ role: "user", content: "warm up" }],
    max_tokens: 8,
  });
  return { client, cluster };
}

/** A tag no earlier prompt starts with. */
const fresh = () => crypto.randomUUID().slice(0, 8);

/** `n` concurrent streams of `tokens` tokens each, temperature 0, distinct prompts. */
export async function streamsRound(
  path: ClientPath,
  n: number,
  tokens: number,
): Promise<StreamsRound> {
  const start = performance.now();
  const settled = await Promise.allSettled(
    Array.from({ length: n }, (_, i) =>
      timeChatStream(path.client, {
        model: "small",
        messages: [
          { role: "system", content: `${fresh()}: you tell stories.` },
          { role: "user", content: `Tell me story number ${i}.` },
        ],
        max_tokens: tokens,
        temperature: 0,
      })),
  );
  const seconds = (performance.now() - start) / 1000;
  const runs = settled.flatMap((s) =>
    s.status === "fulfilled" ? [s.value] : []
  );
  const failures = settled.flatMap((s) =>
    s.status === "rejected" ? [String(s.reason?.message ?? s.reason)] : []
  );
  /** Median over the streams that finished; NaN when none did. */
  const over = (f: (s: StreamTiming) => number) =>
    runs.length ? median(runs.map(f).sort((a, b) => a - b)) : NaN;
  const worst = (f: (s: StreamTiming) => number) =>
    runs.length ? Math.max(...runs.map(f)) : NaN;
  const p99 = (s: StreamTiming) => percentile(s.gaps, 0.99);
  const total = runs.reduce((a, s) => a + (s.usage?.completion_tokens ?? 0), 0);
  return {
    ttft: over((s) => s.firstText),
    ttftMax: worst((s) => s.firstText),
    itlP50: over((s) => percentile(s.gaps, 0.5)),
    itlP99: over(p99),
    itlP99Max: worst(p99),
    tokensPerSecond: !runs.length
      ? NaN
      : n === 1
      ? total / (runs[0]!.lastText / 1000) // sent → last text, as for the engine
      : total / seconds,
    cached: Math.max(
      0,
      ...runs.map((s) => s.usage?.prompt_tokens_details?.cached_tokens ?? 0),
    ),
    failures,
  };
}

/** A long system prompt sent cold, again (warm), and a different one of the same length. */
export async function reuseRound(path: ClientPath): Promise<ReuseRound> {
  const body = "You are a careful assistant who answers briefly. ";
  const long = (tag: string) =>
    `${tag}: ${body.repeat(Math.ceil(LONG_PROMPT_CHARS / body.length))}`
      .slice(0, LONG_PROMPT_CHARS);
  const ask = async (system: string): Promise<LongAsk> => {
    try {
      const s = await timeChatStream(path.client, {
        model: "small",
        messages: [
          { role: "system", content: system },
          { role: "user", content: "A question?" },
        ],
        max_tokens: 4,
        temperature: 0,
      });
      return {
        ttft: s.firstText,
        promptTokens: s.usage?.prompt_tokens ?? NaN,
        cachedTokens: s.usage?.prompt_tokens_details?.cached_tokens ?? NaN,
      };
    } catch (e) {
      const error = String((e as Error).message ?? e);
      return { ttft: NaN, promptTokens: NaN, cachedTokens: NaN, error };
    }
  };
  const a = long(fresh());
  const cold = await ask(a);
  const warm = await ask(a);
  const other = await ask(long(fresh()));
  return { cold, warm, other };
}

/** Median over rounds of one figure (rounds without it, NaN, left out). */
export function mid<T>(rounds: T[], f: (r: T) => number): number {
  const xs = rounds.map(f).filter((x) => !isNaN(x)).sort((a, b) => a - b);
  return xs.length ? median(xs) : NaN;
}

const ms = (x: number, w = 9) => x.toFixed(1).padStart(w);

/** Prints the concurrency table: per-stream TTFT and ITL, aggregate tokens/s. */
export function printStreams(
  by: Map<number, StreamsRound[]>,
  tokens: number,
) {
  console.log(
    `\nclient path: gateway + node + model process, openai SDK, ${tokens} tokens per stream, temperature 0\n` +
      "  ms per stream at the client (median of streams, then of rounds; max = slowest stream)",
  );
  console.log(
    "  streams  TTFT p50  TTFT max   ITL p50   ITL p99  ITL p99 max   tokens/s  ×one",
  );
  const one = mid(by.get(1)!, (r) => r.tokensPerSecond);
  for (const [n, rounds] of by) {
    const tps = mid(rounds, (r) => r.tokensPerSecond);
    console.log(
      `  ${String(n).padStart(7)}${ms(mid(rounds, (r) => r.ttft), 10)}${
        ms(mid(rounds, (r) => r.ttftMax), 10)
      }${ms(mid(rounds, (r) => r.itlP50), 10)}${
        ms(mid(rounds, (r) => r.itlP99), 10)
      }${ms(mid(rounds, (r) => r.itlP99Max), 13)}${ms(tps, 11)}  ×${
        (tps / one).toFixed(2)
      }`,
    );
  }
  const all = [...by.values()].flat();
  const cached = Math.max(...all.map((r) => r.cached));
  const failures = all.flatMap((r) => r.failures);
  console.log(
    `  (tokens/s: all streams' completion tokens over the wall time; one stream: sent → last text.\n` +
      `   distinct prompts: at most ${cached} prompt tokens of any stream came from the prefix cache)`,
  );
  if (failures.length) {
    console.log(
      `  ${failures.length} stream(s) FAILED and are left out; first: ${
        failures[0]
      }`,
    );
  }
}

/** Prints the prefix-reuse table. */
export function printReuse(rounds: ReuseRound[]) {
  console.log(
    "\nlong system prompt, prefill with and without reuse (TTFT at the client, median of rounds)",
  );
  console.log(
    `${"TTFT ms".padStart(47)}${"prompt_tokens".padStart(15)}${
      "cached_tokens".padStart(15)
    }`,
  );
  const row = (label: string, f: (r: ReuseRound) => LongAsk) =>
    console.log(
      `  ${label.padEnd(34)}${ms(mid(rounds, (r) => f(r).ttft), 11)}${
        String(mid(rounds, (r) => f(r).promptTokens)).padStart(15)
      }${String(mid(rounds, (r) => f(r).cachedTokens)).padStart(15)}`,
    );
  row("new prompt (cold)", (r) => r.cold);
  row("same prompt again (warm, reused)", (r) => r.warm);
  row("different prompt, same length", (r) => r.other);
  const failures = rounds.flatMap((r) =>
    [r.cold, r.warm, r.other].flatMap((a) => a.error ? [a.error] : [])
  );
  if (failures.length) {
    console.log(
      `  ${failures.length} request(s) FAILED and are left out; first: ${
        failures[0]
      }`,
    );
  }
}
