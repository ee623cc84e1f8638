/**
 * Load generation shared by `bench:gateway` and `bench:path`: a fixed fast
 * upstream (JSON and SSE answers, a model list), the bare pass-through
 * proxy that is the floor, child processes, CPU per request read from
 * /proc (summed over every process of a target), and the measurements
 * (max throughput, latency at a fixed rate, stream TTFB) taken in rounds
 * in which the targets take turns.
 */
export const CHAT = JSON.stringify({
  id: "chatcmpl-1",
  object: "chat.completion",
  created: 1,
  model: "bench",
  choices: [{
    index: 0,
    message: { role: "assistant", content: "Hello world!" },
    finish_reason: "stop",
  }],
  usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 },
});
const frame = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
export const SSE = [
  frame({
    id: "c1",
    object: "chat.completion.chunk",
    created: 1,
    model: "bench",
    choices: [{
      index: 0,
      delta: { role: "assistant", content: "" },
      finish_reason: null,
    }],
  }),
  ...["Hello", " world", "!"].map((w) =>
    frame({
      id: "c1",
      object: "chat.completion.chunk",
      created: 1,
      model: "bench",
      choices: [{ index: 0, delta: { content: w }, finish_reason: null }],
    })
  ),
  frame({
    id: "c1",
    object: "chat.completion.chunk",
    created: 1,
    model: "bench",
    choices: [{ index: 0, delta: {}, finish_reason: "stop" }],
  }),
  frame({
    id: "c1",
    object: "chat.completion.chunk",
    created: 1,
    model: "bench",
    choices: [],
    usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 },
  }),
  "data: [DONE]\n\n",
].join("");

/** Serves `handler` on a free port; the process exits when its parent goes away. */
export function listen(handler: Deno.ServeHandler): number {
  // A child exits when the bench process goes away (its stdin closes).
  (async () => {
    for await (const _ of Deno.stdin.readable) { /* drain */ }
    Deno.exit(0);
  })();
  return Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, handler)
    .addr.port;
}

export interface Child {
  proc: Deno.ChildProcess;
  pid: number;
  info: { port: number; keys?: string[] };
}

/**
 * V8 flags of the load generator (this process: deno.json's task passes
 * them) and of the upstream, both shared by every target: a heap that
 * starts at 128 MB. With Deno's default a small process like these runs a
 * major GC about every 0.4 s at 500 req/s (42 in 18 s, against 3), and
 * each added its 1–3 ms pause to whichever request was in flight.
 */
export const LOAD_V8_FLAGS = "--initial-heap-size=128";

/**
 * V8 flags of the floor and the gateway: those `deno task start` runs
 * Orchard with (read from deno.json, so the two cannot drift apart).
 */
export const SERVER_V8_FLAGS = await (async () => {
  const config = JSON.parse(
    await Deno.readTextFile(new URL("../deno.json", import.meta.url)),
  ) as { tasks: Record<string, string> };
  return /--v8-flags=(\S+)/.exec(config.tasks.start ?? "")?.[1] ?? null;
})();

/** Runs `script` with `args` as a child; resolves with the JSON its first stdout line holds. */
export async function spawn(script: string, ...args: string[]): Promise<Child> {
  const v8 = [
    ...(args[0] === "upstream" ? [LOAD_V8_FLAGS] : []),
    ...(args[0] !== "upstream" && SERVER_V8_FLAGS ? [SERVER_V8_FLAGS] : []),
    ...(Deno.env.get("BENCH_PROF") === args[0] ? ["--prof"] : []),
  ];
  const proc = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--unstable-kv",
      ...(v8.length ? [`--v8-flags=${v8.join(",")}`] : []),
      script,
      ...args,
    ],
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
    env: { ORCHARD_LOG_LEVEL: "error" },
  }).spawn();
  const reader = proc.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  while (!buf.includes("\n")) {
    const r = await reader.read();
    if (r.done) throw new Error(`bench child ${args[0]} exited early`);
    buf += r.value;
  }
  reader.releaseLock();
  proc.stdout.cancel().catch(() => {});
  return { proc, pid: proc.pid, info: JSON.parse(buf.split("\n")[0]!) };
}

/** CPU time (user + system) a process has used, ms. */
export function cpuMs(pid: number): number {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const ticks = Number(f[11]) + Number(f[12]); // utime + stime
  return ticks * 10; // USER_HZ = 100
}

export const BODY = JSON.stringify({
  model: "bench",
  messages: [{ role: "user", content: "Hello there" }],
  max_tokens: 16,
});
export const SBODY = JSON.stringify({
  model: "bench",
  messages: [{ role: "user", content: "Hello there" }],
  max_tokens: 16,
  stream: true,
});

/** A system under test: where to send requests, and the processes whose CPU it costs. */
export interface Target {
  name: string;
  url: string;
  pids: number[];
  keys: string[];
}

/** CPU time of each of a target's processes, ms. */
function targetCpuMs(t: Target): number[] {
  return t.pids.map(cpuMs);
}

/**
 * CPU per request since `cpu0`, µs: over all of the target's processes
 * (`cpuPerReqUs`) and per process (`cpuPerReqUs_<i>`, in `pids` order).
 */
function cpuPerReq(t: Target, cpu0: number[], n: number) {
  const per = targetCpuMs(t).map((c, i) => ((c - cpu0[i]!) * 1000) / n);
  const out: Record<string, number> = {
    cpuPerReqUs: per.reduce((a, b) => a + b, 0),
  };
  per.forEach((v, i) => out[`cpuPerReqUs_${i}`] = v);
  return out as { cpuPerReqUs: number } & Record<string, number>;
}

let keyIx = 0;
export async function once(
  t: Target,
  body = BODY,
): Promise<{ ms: number; ttfb: number; ok: boolean }> {
  const key = t.keys.length ? t.keys[keyIx++ % t.keys.length]! : "none";
  const t0 = performance.now();
  const res = await fetch(`${t.url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${key}`,
      "content-type": "application/json",
    },
    body,
  });
  const reader = res.body!.getReader();
  let ttfb = -1;
  for (;;) {
    const r = await reader.read();
    if (ttfb < 0) ttfb = performance.now() - t0;
    if (r.done) break;
  }
  return { ms: performance.now() - t0, ttfb, ok: res.status === 200 };
}

export async function throughput(t: Target, seconds: number, conc: number) {
  const end = performance.now() + seconds * 1000;
  const cpu0 = targetCpuMs(t);
  let n = 0;
  let failed = 0;
  await Promise.all(Array.from({ length: conc }, async () => {
    while (performance.now() < end) {
      const r = await once(t);
      n++;
      if (!r.ok) failed++;
    }
  }));
  return { rps: n / seconds, failed, ...cpuPerReq(t, cpu0, n) };
}

export function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
}

export async function fixedRate(
  t: Target,
  rps: number,
  seconds: number,
  body = BODY,
) {
  const lat: number[] = [];
  const ttfb: number[] = [];
  const cpu0 = targetCpuMs(t);
  const total = rps * seconds;
  const start = performance.now();
  const pending: Promise<void>[] = [];
  for (let i = 0; i < total; i++) {
    const due = start + (i * 1000) / rps;
    const wait = due - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    pending.push(
      once(t, body).then((r) => {
        lat.push(r.ms);
        ttfb.push(r.ttfb);
      }),
    );
  }
  await Promise.all(pending);
  const cpu = cpuPerReq(t, cpu0, total);
  return {
    p50: pct(lat, 0.5),
    p99: pct(lat, 0.99),
    ttfb50: pct(ttfb, 0.5),
    ttfb99: pct(ttfb, 0.99),
    p90: pct(lat, 0.9),
    ...cpu,
  };
}

export const f2 = (x: number) => x.toFixed(2);

/** Seconds each target runs at 500 req/s before the fixed-rate rounds. */
export const STEADY_S = 15;

/** Rounds of each measurement; targets take turns, and each reports medians. */
export const ROUNDS = 3;
/**
 * Rounds of the fixed-rate latencies: a p99 of one 3-s round is its 15th
 * slowest request, and a slow spell of this machine (seconds of stolen
 * CPU) can own a round; the median of five shrugs off two.
 */
export const LATENCY_ROUNDS = 5;

/**
 * Runs `measure` `n` times per target, the targets taking turns (so a
 * slow spell of the machine hits all of them), and returns, per target,
 * the median of every number measured (each metric on its own).
 */
export async function rounds<T extends Record<string, number>>(
  targets: Target[],
  measure: (t: Target) => Promise<T>,
  n = ROUNDS,
): Promise<Record<string, T>> {
  const all: Record<string, T[]> = {};
  for (let r = 0; r < n; r++) {
    for (const t of targets) (all[t.name] ??= []).push(await measure(t));
  }
  const out: Record<string, T> = {};
  for (const [name, xs] of Object.entries(all)) {
    const m = {} as Record<string, number>;
    for (const f of Object.keys(xs[0]!)) {
      const v = xs.map((x) => x[f]!).sort((a, b) => a - b);
      // Failures add up over the rounds; everything else is a median.
      m[f] = f === "failed"
        ? v.reduce((a, b) => a + b, 0)
        : v[Math.floor(v.length / 2)]!;
    }
    out[name] = m as T;
  }
  return out;
}

/** The upstream role: answers chat completions at once (JSON or SSE) and lists the `bench` model. */
export function serveUpstream(): number {
  return listen(async (req) => {
    if (req.method === "GET" && new URL(req.url).pathname === "/v1/models") {
      return Response.json({
        object: "list",
        data: [{ id: "bench", object: "model" }],
      });
    }
    const body = await req.json();
    return body.stream
      ? new Response(SSE, { headers: { "content-type": "text/event-stream" } })
      : new Response(CHAT, { headers: { "content-type": "application/json" } });
  });
}

/** The floor role: the smallest useful Deno pass-through proxy, to `upstream`. */
export function serveFloor(upstream: string): number {
  return listen(async (req) => {
    const url = new URL(req.url);
    const res = await fetch(upstream + url.pathname, {
      method: req.method,
      headers: {
        "content-type": req.headers.get("content-type") ?? "application/json",
      },
      body: req.body,
      signal: req.signal,
    });
    return new Response(res.body, {
      status: res.status,
      headers: {
        "content-type": res.headers.get("content-type") ?? "application/json",
      },
    });
  });
}
