// deno-lint-ignore-file no-console
/**
 * The span part of `bench:engine`: single-stream greedy decode tokens/s of
 * the same model loaded locally, split with a loopback `ggml-rpc-server`
 * worker (the head keeps half the layers, as a span's head does with equal
 * free memory: node/llama/child.ts), and with every layer on the worker;
 * and the per-token cost of crossing to a worker (all-on-worker ms/token −
 * local ms/token: the same compute, plus the round trip each token makes). Loopback TCP on one machine: both processes share its cores,
 * so this is the protocol's cost, not a link's. On Macs the RDMA figure
 * comes from the same bench with the worker's server on the other Mac's
 * Thunderbolt address (`--span-worker host:port`, started there with
 * `ggml-rpc-server -H <tb address>` and no `GGML_RPC_NO_RDMA`).
 *
 * Needs llama.cpp built with RPC; prints why it is skipped otherwise.
 *
 * @module
 */
import { openLlama } from "../node/llama/ffi.ts";
import { LoadedLlama } from "../node/llama/model.ts";
import { openRpc, planSplit, rpcServerPath } from "../node/llama/rpc.ts";
import { readGguf, validateModel } from "../node/llama/gguf.ts";

/** Greedy-decodes `n` tokens; tokens/s of the decode steps. */
function decodeRate(m: LoadedLlama, n: number): number {
  m.clearSeq(0);
  const prompt = m.tokenize("<|im_start|>user\nhello<|im_end|>\n", true);
  m.batch.clear();
  prompt.forEach((t, i) => m.batch.add(t, i, 0, i === prompt.length - 1));
  if (m.decode() !== 0) throw new Error("llama_decode failed");
  let pos = prompt.length;
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    m.batch.clear();
    m.batch.add(1 + (i % 200), pos++, 0, true); // fixed tokens: same work per step
    if (m.decode() !== 0) throw new Error("llama_decode failed");
  }
  return n / ((performance.now() - t0) / 1000);
}

/** Runs the span bench on a GGUF; prints its block. */
export async function spanBench(
  path: string,
  threads: number,
  tokens: number,
  worker?: string,
): Promise<void> {
  const llama = openLlama();
  if (llama.build !== "built") {
    console.log(
      "\nspan: skipped (llama.cpp without RPC: deno task build:native)",
    );
    llama.close();
    return;
  }
  const layers = validateModel(await readGguf(path)).blockCount;
  let server: Deno.ChildProcess | null = null;
  let endpoint = worker;
  if (!endpoint) {
    const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (l.addr as Deno.NetAddr).port;
    l.close();
    server = new Deno.Command(rpcServerPath(llama.libDir)!, {
      args: ["-H", "127.0.0.1", "-p", String(port), "-t", String(threads)],
      env: { GGML_RPC_NO_RDMA: "1" },
      stdout: "null",
      stderr: "null",
    }).spawn();
    endpoint = `127.0.0.1:${port}`;
    for (let i = 0; i < 100; i++) {
      try {
        (await Deno.connect({ hostname: "127.0.0.1", port })).close();
        break;
      } catch {
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }
  const rpc = openRpc(llama);
  const opts = { path, ctxPerSeq: tokens + 64, slots: 1, threads, batch: 64 };
  try {
    const dev = (await rpc.devices(endpoint))[0]!;
    const run = async (extra: Record<string, unknown>) => {
      const m = await LoadedLlama.load(llama, { ...opts, ...extra });
      try {
        decodeRate(m, 8); // warm-up
        return decodeRate(m, tokens);
      } finally {
        m.close();
      }
    };
    const { headLayers } = planSplit(layers, [1, 1], null);
    const local = await run({});
    const split = await run({
      devices: [dev.ptr],
      gpuLayers: layers - headLayers,
      tensorSplit: [1],
    });
    const remote = await run({ devices: [dev.ptr] });
    // all layers on the worker does the same compute as local, in another
    // process, plus one round trip per token: the cost of crossing
    const cross = 1000 / remote - 1000 / local;
    console.log(
      `\nspan (${
        worker ? `worker ${worker}` : "loopback TCP worker"
      }, ${tokens} tokens, ${threads} threads each)`,
    );
    console.log(`  local                 ${local.toFixed(1)} tok/s`);
    console.log(
      `  split head ${headLayers}/${layers} layers  ${
        split.toFixed(1)
      } tok/s (${(split / local).toFixed(2)} × local)`,
    );
    console.log(
      `  all layers on worker  ${remote.toFixed(1)} tok/s (${
        (remote / local).toFixed(2)
      } × local)`,
    );
    console.log(
      `  crossing to a worker  ${
        cross.toFixed(2)
      } ms per token (all on worker − local: same compute, one round trip)`,
    );
  } finally {
    rpc.close();
    llama.close();
    if (server) {
      server.kill("SIGTERM");
      await server.status;
    }
  }
}
