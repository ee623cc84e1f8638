/**
 * A model's child process: loads one GGUF through llama.cpp and serves
 * generations with continuous batching. Every active request is a sequence
 * of one shared context; each step packs one pending token per generating
 * sequence plus prompt chunks of new ones into a single `llama_decode`, then
 * samples every sequence that produced an output.
 *
 * Streaming: each step's text leaves the process at the end of that step
 * (a synchronous write to the stdout pipe, so no event-loop turn can hold
 * it back); nothing is coalesced beyond one decode step. Requests come in
 * through a worker that reads stdin (stdin_lines.ts), so a new request or a
 * cancellation waits at most one step. Prompt chunks are sized so that a
 * step with running sequences stays near STEP_TARGET_MS: a long prompt
 * arriving does not stall the streams already running.
 *
 * Prompt reuse: slots keep what their last sequence left in the KV cache
 * (slot_cache.ts); a new prompt goes to the slot where it reuses most and
 * loses least, and decodes only the rest. A long prefix about to be
 * overwritten is saved in host memory first, and restored into a slot
 * when a later prompt continues it (prefix_store.ts).
 *
 * llama.cpp aborts the process on some misuse; the scheduler never decodes
 * twice at once, never exceeds `n_batch`, and only samples outputs of the
 * decode just made. Whatever still crashes takes down this process only:
 * the engine in the node fails its requests and starts a new one.
 *
 * Protocol: JSON lines, see protocol.ts.
 */
import { ContextLengthError } from "../../protocol/openai/errors.ts";
import { type Llama, openLlama } from "./ffi.ts";
import { openRpc, planSplit } from "./rpc.ts";
import { InputError, LoadedLlama } from "./model.ts";
import type {
  ChildEvent,
  ChildRequest,
  FinishReason,
  LoadedModel,
  RpcLoad,
  SamplingParams,
  TokenLogprob,
} from "./protocol.ts";
import { PrefixStore, SAVE_MIN } from "./prefix_store.ts";
import { SlotCache } from "./slot_cache.ts";
import { advance, START, type Utf8State } from "./utf8_guard.ts";

interface Seq {
  id: string;
  slot: number;
  prompt: Int32Array;
  /** Prompt tokens reused from the slot's cache. */
  cached: number;
  fed: number;
  pos: number;
  /** Tokens in the KV cache for this sequence, from position 0. */
  history: number[];
  sampler: Deno.PointerObject;
  maxTokens: number;
  generated: number;
  pending: number | null;
  out: number;
  decoder: TextDecoder;
  held: string;
  stops: string[];
  holdback: number;
  logprobs: number | null;
  heldLogprobs: TokenLogprob[];
  /** Render control tokens as text. */
  special: boolean;
  /** Under a grammar: where the output's UTF-8 stands (see utf8_guard.ts). */
  utf8: Utf8State | null;
  cancelled: boolean;
  /** Most sequences that shared one decode with this one. */
  peak: number;
}

/**
 * Largest step a prompt chunk may stretch to while other sequences are
 * generating (prompt alone: whole n_batch chunks). On a Mac GPU prefill is
 * fast and chunks stay large; on a small CPU they shrink to keep streams
 * moving.
 */
const STEP_TARGET_MS = 150;
/** Smallest prompt chunk, however slow prefill is. */
const MIN_CHUNK = 16;

const enc = new TextEncoder();
let outbox: ChildEvent[] = [];

function emit(e: ChildEvent) {
  outbox.push(e);
}

/** Writes the queued events, merging each sequence's consecutive text, synchronously. */
function flush() {
  if (!outbox.length) return;
  const merged: ChildEvent[] = [];
  for (const e of outbox) {
    const prev = merged.at(-1);
    if (e.ev === "text" && prev?.ev === "text" && prev.id === e.id) {
      merged[merged.length - 1] = {
        ...e,
        text: prev.text + e.text,
        ...(prev.logprobs || e.logprobs
          ? { logprobs: [...prev.logprobs ?? [], ...e.logprobs ?? []] }
          : {}),
      };
    } else merged.push(e);
  }
  outbox = [];
  const bytes = enc.encode(
    merged.map((e) => JSON.stringify(e)).join("\n") + "\n",
  );
  try {
    let off = 0;
    while (off < bytes.length) {
      off += Deno.stdout.writeSync(bytes.subarray(off));
    }
  } catch {
    Deno.exit(0); // the engine is gone
  }
}

/**
 * A macrotask: lets the event loop deliver the stdin worker's messages
 * between synchronous decode steps. MessageChannel, not setTimeout(0),
 * which costs a timer turn (~3 ms a step measured on 2 cores).
 */
let tick: { port: MessagePort; resume: (() => void) | null } | null = null;
function yieldToEventLoop(): Promise<void> {
  if (!tick) {
    const ch = new MessageChannel();
    const t = { port: ch.port2, resume: null as (() => void) | null };
    ch.port1.onmessage = () => {
      const r = t.resume;
      t.resume = null;
      r?.();
    };
    tick = t;
  }
  const t = tick;
  return new Promise((r) => {
    t.resume = r;
    t.port.postMessage(0);
  });
}

let model: LoadedLlama;
let slots: SlotCache;
let slotCount = 0;
/** Prefixes evicted from slots, kept in host memory (prefix_store.ts). */
let prefixes = new PrefixStore(0);
const EMPTY = new Int32Array(0);
const seqs = new Map<string, Seq>();
const embedQueue: { id: string; inputs: string[] }[] = [];
let wake: (() => void) | null = null;
/** Recent prompt-token cost of a step (EWMA, ms per prompt token). */
let msPerPromptToken = 0;

/** Ends a sequence; "done" is also sent for cancelled ones so the engine frees the slot. */
function finish(s: Seq, reason: FinishReason) {
  const rest = s.held + s.decoder.decode();
  if ((rest || s.heldLogprobs.length) && !s.cancelled) emitText(s, rest);
  release(s, true);
  emit({
    ev: "done",
    id: s.id,
    finish: reason,
    promptTokens: s.prompt.length,
    cachedTokens: s.cached,
    completionTokens: s.generated,
    cancelled: s.cancelled,
    peakBatch: s.peak,
  });
}

/** Frees a sequence's slot; its cache stays for the next prompt unless `keep` is false. */
function release(s: Seq, keep: boolean) {
  seqs.delete(s.id);
  model.llama.symbols.llama_sampler_free(s.sampler);
  if (keep) {
    // the cache holds what was decoded: positions 0 … pos-1
    slots.release(s.slot, Int32Array.from(s.history.slice(0, s.pos)));
  } else {
    model.clearSeq(s.slot);
    slots.release(s.slot, new Int32Array(0));
  }
}

/** Sends text; `tokens` is the sequence's cumulative completion token count. */
function emitText(s: Seq, text: string) {
  const logprobs = s.heldLogprobs.length ? s.heldLogprobs : undefined;
  s.heldLogprobs = [];
  emit({ ev: "text", id: s.id, text, tokens: s.generated, logprobs });
}

/** Appends decoded text, holding back what could be the start of a stop string. */
function push(s: Seq, text: string): boolean {
  s.held += text;
  for (const stop of s.stops) {
    const at = s.held.indexOf(stop);
    if (at >= 0) {
      s.held = s.held.slice(0, at);
      return true;
    }
  }
  let cut = s.held.length - s.holdback;
  if (cut > 0) {
    const c = s.held.charCodeAt(cut - 1);
    if (c >= 0xd800 && c <= 0xdbff) cut--; // never split a surrogate pair
    emitText(s, s.held.slice(0, cut));
    s.held = s.held.slice(cut);
  }
  return false;
}

/** The prompt's tokens, exactly as a generation decodes them. */
function promptOf(
  req: Extract<ChildRequest, { op: "generate" } | { op: "count" }>,
): Int32Array {
  const text = req.messages
    ? model.applyTemplate(req.messages)
    : req.prompt ?? "";
  const chat = req.messages !== undefined || req.templated === true;
  return model.tokenize(text, !chat);
}

/** Answers a `count` request: what `generate` would bill as prompt tokens. */
function count(req: Extract<ChildRequest, { op: "count" }>) {
  try {
    emit({
      ev: "count",
      id: req.id,
      promptTokens: promptOf(req).length,
      contextLength: model.ctxPerSeq,
    });
  } catch (err) {
    const input = err instanceof InputError;
    emit({
      ev: "error",
      id: req.id,
      status: input ? 400 : 500,
      code: input ? err.code : "engine_error",
      message: `Cannot count the prompt's tokens: ${(err as Error).message}`,
      param: input ? err.param : null,
    });
  }
}

function start(req: Extract<ChildRequest, { op: "generate" }>) {
  const fail = (
    status: number,
    code: string | null,
    message: string,
    param: string | null = null,
  ) => emit({ ev: "error", id: req.id, status, code, message, param });
  let sampler: Deno.PointerObject | null = null;
  try {
    const prompt = promptOf(req);
    if (prompt.length === 0) {
      return fail(400, "invalid_value", "The prompt is empty", "prompt");
    }
    const room = model.ctxPerSeq - prompt.length;
    if (
      room < 1 || (req.params.maxTokens !== null && req.params.maxTokens > room)
    ) {
      const e = new ContextLengthError(
        prompt.length,
        model.ctxPerSeq,
        room < 1 ? null : req.params.maxTokens,
      );
      emit({
        ev: "error",
        id: req.id,
        status: 400,
        code: e.code,
        message: e.message,
        param: "messages",
        promptTokens: e.promptTokens,
        contextLength: e.contextLength,
        completionTokens: e.completionTokens,
      });
      return;
    }
    const p: SamplingParams = req.params;
    sampler = model.sampler(p);
    const live = [...seqs.values()].map((q) => ({
      slot: q.slot,
      tokens: q.history.slice(0, q.pos),
    }));
    const cap = Math.max(0, prompt.length - 1);
    const saved = prefixes.best(prompt, cap);
    const before = Array.from(
      { length: slotCount },
      (_, i) => slots.cached(i),
    );
    const grant = slots.acquire(prompt, live, {
      restorable: saved?.reuse ?? 0,
      savable: (held, lost) => lost >= SAVE_MIN && prefixes.wants(held),
    });
    if (!grant) {
      model.llama.symbols.llama_sampler_free(sampler);
      return fail(503, "server_busy", "All slots are busy");
    }
    // what the slot held beyond what stays is lost: keep it in host memory
    const held = before[grant.slot] ?? EMPTY;
    const kept = grant.from === null && !grant.restore ? grant.reuse : 0;
    if (held.length - kept >= SAVE_MIN && prefixes.wants(held)) {
      const state = model.saveSeq(grant.slot);
      if (state) prefixes.put(held, state);
    }
    if (grant.restore) {
      // set_data clears the slot, then loads the saved cells into it
      if (
        !saved || !model.restoreSeq(grant.slot, saved.entry.state) ||
        !model.truncateSeq(grant.slot, grant.reuse)
      ) {
        model.clearSeq(grant.slot);
        grant.reuse = 0;
      }
    } else if (grant.from !== null) {
      // share another slot's prefix cells, dropping what this slot held
      model.clearSeq(grant.slot);
      model.shareSeq(grant.from, grant.slot, grant.reuse);
    } else if (!model.truncateSeq(grant.slot, grant.reuse)) {
      // keep the cached prefix, drop the rest of what the slot held
      model.clearSeq(grant.slot);
      grant.reuse = 0;
    }
    seqs.set(req.id, {
      id: req.id,
      slot: grant.slot,
      prompt,
      cached: grant.reuse,
      fed: grant.reuse,
      pos: grant.reuse,
      history: Array.from(prompt),
      sampler,
      maxTokens: Math.min(p.maxTokens ?? room, room),
      generated: 0,
      pending: null,
      out: -1,
      decoder: new TextDecoder("utf-8"),
      held: "",
      stops: p.stop.filter((s) => s.length > 0),
      holdback: Math.max(0, ...p.stop.map((s) => s.length - 1)),
      logprobs: p.logprobs,
      heldLogprobs: [],
      special: req.renderSpecial === true,
      utf8: p.grammar ? START : null,
      cancelled: false,
      peak: 0,
    });
    emit({
      ev: "started",
      id: req.id,
      promptTokens: prompt.length,
      cachedTokens: grant.reuse,
    });
  } catch (err) {
    if (sampler && !seqs.has(req.id)) {
      model.llama.symbols.llama_sampler_free(sampler);
    }
    if (err instanceof InputError) {
      return fail(400, err.code, err.message, err.param);
    }
    fail(
      500,
      "engine_error",
      `Cannot start generation: ${(err as Error).message}`,
    );
  }
}

/** Prompt tokens one step may take, given how many sequences are also generating. */
function promptBudget(capacity: number, generating: number): number {
  if (generating === 0 || msPerPromptToken <= 0) return capacity;
  return Math.max(
    MIN_CHUNK,
    Math.min(capacity, Math.floor(STEP_TARGET_MS / msPerPromptToken)),
  );
}

let silent: number[] | null = null;

/**
 * Control tokens that are not end-of-generation, which a sequence that does
 * not render them outputs as nothing. llama.cpp's grammar matches such a
 * token by its literal text (`<|im_start|>` fits inside any JSON string), so
 * under a grammar they are never sampled: the output would lack text the
 * grammar counted (a `const` came out empty, a string below `minLength`),
 * and usage would count a token the answer does not carry.
 */
function silentTokens(): number[] {
  if (!silent) {
    silent = [];
    for (let t = 0; t < model.vocabSize; t++) {
      if (!model.isEog(t) && model.piece(t).length === 0) silent.push(t);
    }
  }
  return silent;
}

/** One continuous-batching step. */
function step() {
  const b = model.batch;
  b.clear();
  const active = [...seqs.values()];
  const inStep = new Set<Seq>();
  for (const s of active) {
    s.out = -1;
    if (s.pending !== null) {
      s.history[s.pos] = s.pending;
      s.out = b.add(s.pending, s.pos++, s.slot, true);
      s.pending = null;
      inStep.add(s);
    }
  }
  const generating = b.n;
  const budget = Math.min(
    b.capacity,
    generating + promptBudget(
      b.capacity - generating,
      generating,
    ),
  );
  for (const s of active) {
    const left = s.prompt.length - s.fed;
    const take = Math.min(left, budget - b.n);
    if (left === 0 || take <= 0) continue;
    for (let i = 0; i < take; i++) {
      const last = s.fed + i === s.prompt.length - 1;
      const idx = b.add(s.prompt[s.fed + i]!, s.pos++, s.slot, last);
      if (last) s.out = idx;
    }
    s.fed += take;
    inStep.add(s);
  }
  if (b.n === 0) return;
  for (const s of inStep) s.peak = Math.max(s.peak, inStep.size);
  const promptTokens = b.n - generating;
  const t0 = performance.now();
  let rc = model.decode();
  if (rc === 1) {
    // no room in the KV cache: drop what idle slots keep cached, then retry
    for (const slot of slots.idleCached()) {
      model.clearSeq(slot);
      slots.forget(slot);
    }
    rc = model.decode();
  }
  if (promptTokens > 0) {
    const ms = (performance.now() - t0) / Math.max(1, b.n);
    msPerPromptToken = msPerPromptToken
      ? msPerPromptToken * 0.7 + ms * 0.3
      : ms;
  }
  if (rc !== 0) {
    for (const s of active) {
      emit({
        ev: "error",
        id: s.id,
        status: 500,
        code: "engine_error",
        message: `llama_decode failed with status ${rc}`,
      });
      s.cancelled = true;
      release(s, false);
    }
    return;
  }
  for (const s of active) {
    if (s.out < 0) continue;
    if (s.cancelled || !seqs.has(s.id)) continue;
    if (s.utf8) {
      const logits = model.logitsView(s.out);
      model.utf8Guard().mask(logits, s.utf8);
      if (!s.special) { for (const t of silentTokens()) logits[t] = -Infinity; }
    }
    const tok = model.sample(s.sampler, s.out);
    if (s.utf8) {
      s.utf8 = advance(s.utf8, model.utf8Guard().pieces[tok]!) ?? START;
    }
    if (model.isEog(tok)) {
      finish(s, "stop");
      continue;
    }
    s.generated++;
    if (s.logprobs !== null) {
      s.heldLogprobs.push(model.logprobs(s.out, tok, s.logprobs));
    }
    const stopped = push(
      s,
      s.decoder.decode(model.piece(tok, s.special), { stream: true }),
    );
    if (stopped) finish(s, "stop");
    else if (s.generated >= s.maxTokens) finish(s, "length");
    else s.pending = tok;
  }
}

async function pump() {
  while (true) {
    for (const s of seqs.values()) {
      if (s.cancelled) finish(s, "stop");
    }
    while (embedQueue.length) {
      const job = embedQueue.shift()!;
      try {
        const { vectors, tokens } = model.embed(job.inputs);
        emit({ ev: "embedding", id: job.id, vectors, promptTokens: tokens });
      } catch (err) {
        const e = err as InputError;
        emit({
          ev: "error",
          id: job.id,
          status: err instanceof InputError ? 400 : 500,
          code: err instanceof InputError ? e.code : "engine_error",
          message: e.message,
          param: err instanceof InputError ? e.param : null,
        });
      }
      flush();
    }
    if (seqs.size === 0) {
      flush();
      await new Promise<void>((r) => (wake = r));
      wake = null;
      continue;
    }
    step();
    flush();
    await yieldToEventLoop();
  }
}

function handle(req: ChildRequest) {
  switch (req.op) {
    case "generate":
      start(req);
      break;
    case "cancel": {
      const s = seqs.get(req.id);
      if (s) s.cancelled = true;
      break;
    }
    case "count":
      count(req);
      break;
    case "embed":
      embedQueue.push({ id: req.id, inputs: req.inputs });
      break;
  }
  flush();
  wake?.();
}

/** Lines of stdin, read by a worker whose event loop waits on the pipe (see stdin_lines.ts). */
function stdinLines(): AsyncIterableIterator<string> {
  const worker = new Worker(new URL("./stdin_lines.ts", import.meta.url), {
    type: "module",
  });
  const queue: (string | null)[] = [];
  let waiting: ((v: string | null) => void) | null = null;
  worker.onmessage = (e: MessageEvent<string | null>) => {
    if (waiting) {
      const w = waiting;
      waiting = null;
      w(e.data);
    } else queue.push(e.data);
  };
  return (async function* () {
    while (true) {
      const line = queue.length
        ? queue.shift()!
        : await new Promise<string | null>((r) => (waiting = r));
      if (line === null) return;
      yield line;
    }
  })();
}

async function main() {
  const input = stdinLines();
  const first = await input.next();
  const load = first.done ? null : JSON.parse(first.value) as ChildRequest;
  if (load?.op !== "load") throw new Error("expected a load request first");
  const llama = openLlama();
  let rpcFacts: LoadedModel["rpc"];
  if (load.rpc) {
    const spread = await rpcSpread(llama, load.rpc);
    rpcFacts = spread.facts;
    model = await LoadedLlama.load(llama, { ...load, ...spread.options });
  } else model = await LoadedLlama.load(llama, load);
  slots = new SlotCache(load.slots);
  slotCount = load.slots;
  prefixes = new PrefixStore(
    Math.max(0, Math.floor(load.prefixCacheBytes ?? 0)),
  );
  emit({
    ev: "ready",
    model: {
      ctxPerSeq: model.ctxPerSeq,
      ctxTrain: model.ctxTrain,
      slots: load.slots,
      vocab: model.vocabSize,
      embd: model.embd,
      hasTemplate: model.template !== null,
      threads: load.threads,
      batch: load.batch,
      ...(rpcFacts ? { rpc: rpcFacts } : {}),
    },
  });
  flush();
  pump();
  for await (const line of input) handle(JSON.parse(line) as ChildRequest);
  Deno.exit(0); // the engine closed our stdin
}

/**
 * A span head's load across its workers' RPC servers: their devices after
 * this machine's GPUs, the layers shared by the admin's split or by free
 * memory (rpc.ts planSplit). With a GPU here the head's share goes to it
 * through `tensor_split`; on a CPU-only head the first layers stay on the
 * CPU (`n_gpu_layers` counts the offloaded ones) and the workers share the
 * rest. ggml-rpc aborts this process if a worker is unreachable later on:
 * the engine fails its requests and the head reports the instance degraded.
 */
async function rpcSpread(llama: Llama, r: RpcLoad) {
  const rpc = openRpc(llama);
  const remote = [];
  for (const ep of r.endpoints) {
    const devs = await rpc.devices(ep);
    if (devs.length !== 1) {
      throw new Error(
        `Cannot use RPC server ${ep}: it offers ${devs.length} devices, expected one`,
      );
    }
    remote.push(devs[0]!);
  }
  const gpus = rpc.localGpus();
  const headFree = gpus.length
    ? gpus.reduce((a, g) => a + g.freeBytes, 0)
    : Deno.systemMemoryInfo().available;
  const mem = remote.map((d) => d.memory());
  const { shares, headLayers } = planSplit(
    r.layers,
    [headFree, ...mem.map((m) => m.freeBytes)],
    r.split,
  );
  const workers = shares.slice(1);
  const options = gpus.length
    ? {
      devices: [...gpus.map((g) => g.ptr), ...remote.map((d) => d.ptr)],
      tensorSplit: [
        ...gpus.map(() => shares[0]! / gpus.length),
        ...workers,
      ],
    }
    : {
      devices: remote.map((d) => d.ptr),
      // layers ≥ n_layer - n_gpu_layers are offloaded, the output layer
      // too when every layer is: the head keeps the first headLayers
      gpuLayers: headLayers === 0 ? -1 : r.layers - headLayers,
      tensorSplit: workers,
    };
  return {
    options,
    facts: {
      devices: remote.map((d, i) => ({
        endpoint: d.endpoint,
        name: d.name,
        freeBytes: mem[i]!.freeBytes,
        totalBytes: mem[i]!.totalBytes,
      })),
      split: shares,
      headLayers,
    },
  };
}

/** `child.ts --check`: load the libraries, check the ABI, print one JSON line. */
function check() {
  let res;
  try {
    const llama = openLlama();
    res = {
      ok: true,
      version: llama.version,
      libDir: llama.libDir,
      build: llama.build,
    };
    llama.close();
  } catch (err) {
    res = { ok: false, message: (err as Error).message };
  }
  Deno.stdout.writeSync(enc.encode(JSON.stringify(res) + "\n"));
}

if (import.meta.main && Deno.args[0] === "--check") check();
else if (import.meta.main) {
  main().catch((err) => {
    emit({ ev: "fatal", message: (err as Error).message });
    flush();
    Deno.exit(3);
  });
}
