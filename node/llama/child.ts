/**
 * A model's child process: loads one GGUF through llama.cpp and serves
 * generations with continuous batching. Every active request is a sequence
 * of one shared context; each step packs one pending token per generating
 * sequence plus prompt chunks of new ones into a single `llama_decode`, then
 * samples every sequence that produced an output.
 *
 * llama.cpp aborts the process on some misuse; the scheduler never decodes
 * twice at once, never exceeds `n_batch`, and only samples outputs of the
 * decode just made. Whatever still crashes takes down this process only:
 * the engine in the node fails its requests and starts a new one.
 *
 * Protocol: JSON lines, see protocol.ts.
 */
import { openLlama } from "./ffi.ts";
import { InputError, LoadedLlama } from "./model.ts";
import type {
  ChildEvent,
  ChildRequest,
  FinishReason,
  SamplingParams,
} from "./protocol.ts";

interface Seq {
  id: string;
  slot: number;
  prompt: Int32Array;
  fed: number;
  pos: number;
  sampler: Deno.PointerObject;
  maxTokens: number;
  generated: number;
  pending: number | null;
  out: number;
  decoder: TextDecoder;
  held: string;
  stops: string[];
  holdback: number;
  cancelled: boolean;
  /** Most sequences that shared one decode with this one. */
  peak: number;
  /** Whether any of its text was emitted yet. */
  sentText: boolean;
}

const out = Deno.stdout.writable.getWriter();
const enc = new TextEncoder();
let outbox: ChildEvent[] = [];

function emit(e: ChildEvent) {
  outbox.push(e);
}

/** Writes the queued events, merging each sequence's consecutive text. */
function flush(): Promise<void> {
  urgent = false;
  lastFlush = performance.now();
  if (!outbox.length) return Promise.resolve();
  const merged: ChildEvent[] = [];
  for (const e of outbox) {
    const prev = merged.at(-1);
    if (e.ev === "text" && prev?.ev === "text" && prev.id === e.id) {
      merged[merged.length - 1] = { ...e, text: prev.text + e.text };
    } else merged.push(e);
  }
  const text = merged.map((e) => JSON.stringify(e)).join("\n") + "\n";
  outbox = [];
  return out.write(enc.encode(text)).catch(() => Deno.exit(0));
}

/**
 * Between decode steps text goes out at most every STREAM_FLUSH_MS (a
 * sequence's first text, and every other event, at once): each write wakes
 * the engine's process, which on a small machine takes a core from
 * llama.cpp's threads mid-step; a few tokens per write cost nothing a
 * reader can see.
 */
const STREAM_FLUSH_MS = 30;
let lastFlush = 0;
let urgent = false;
function flushBetweenSteps(): void {
  if (
    urgent || outbox.some((e) => e.ev !== "text") ||
    performance.now() - lastFlush >= STREAM_FLUSH_MS
  ) void flush();
}

/**
 * A macrotask: lets the event loop read stdin (cancellations, new requests)
 * between synchronous decode steps. MessageChannel, not setTimeout(0), which
 * nested timers clamp to 4 ms.
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
const seqs = new Map<string, Seq>();
const freeSlots: number[] = [];
const embedQueue: { id: string; inputs: string[] }[] = [];
let wake: (() => void) | null = null;

/** Ends a sequence; "done" is also sent for cancelled ones so the engine frees the slot. */
function finish(s: Seq, reason: FinishReason) {
  const rest = s.held + s.decoder.decode();
  if (rest && !s.cancelled) emitText(s, rest);
  release(s);
  emit({
    ev: "done",
    id: s.id,
    finish: reason,
    promptTokens: s.prompt.length,
    completionTokens: s.generated,
    cancelled: s.cancelled,
    peakBatch: s.peak,
  });
}

function release(s: Seq) {
  seqs.delete(s.id);
  model.clearSeq(s.slot);
  model.llama.symbols.llama_sampler_free(s.sampler);
  freeSlots.push(s.slot);
}

/** Sends text; `tokens` is the sequence's cumulative completion token count. */
function emitText(s: Seq, text: string) {
  if (!s.sentText) {
    s.sentText = true;
    urgent = true; // time to first token
  }
  emit({ ev: "text", id: s.id, text, tokens: s.generated });
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

function start(req: Extract<ChildRequest, { op: "generate" }>) {
  const fail = (
    status: number,
    code: string | null,
    message: string,
    param: string | null = null,
  ) => emit({ ev: "error", id: req.id, status, code, message, param });
  try {
    const text = req.messages
      ? model.applyTemplate(req.messages)
      : req.prompt ?? "";
    const prompt = model.tokenize(text, req.messages ? false : true);
    if (prompt.length === 0) {
      return fail(400, "invalid_value", "The prompt is empty", "prompt");
    }
    const room = model.ctxPerSeq - prompt.length;
    if (
      room < 1 || (req.params.maxTokens !== null && req.params.maxTokens > room)
    ) {
      return fail(
        400,
        "context_length_exceeded",
        `This model's maximum context length is ${model.ctxPerSeq} tokens. However, you requested ${
          prompt.length + (req.params.maxTokens ?? 1)
        } tokens (${prompt.length} in the messages, ${
          req.params.maxTokens ?? 1
        } in the completion).`,
        "messages",
      );
    }
    const slot = freeSlots.pop();
    if (slot === undefined) {
      return fail(503, "server_busy", "All slots are busy");
    }
    const p: SamplingParams = req.params;
    seqs.set(req.id, {
      id: req.id,
      slot,
      prompt,
      fed: 0,
      pos: 0,
      sampler: model.sampler(p),
      maxTokens: Math.min(p.maxTokens ?? room, room),
      generated: 0,
      pending: null,
      out: -1,
      decoder: new TextDecoder("utf-8"),
      held: "",
      stops: p.stop.filter((s) => s.length > 0),
      holdback: Math.max(0, ...p.stop.map((s) => s.length - 1)),
      cancelled: false,
      peak: 0,
      sentText: false,
    });
    emit({ ev: "started", id: req.id, promptTokens: prompt.length });
  } catch (err) {
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

/** One continuous-batching step. */
function step() {
  const b = model.batch;
  b.clear();
  const active = [...seqs.values()];
  const inStep = new Set<Seq>();
  for (const s of active) {
    s.out = -1;
    if (s.pending !== null) {
      s.out = b.add(s.pending, s.pos++, s.slot, true);
      s.pending = null;
      inStep.add(s);
    }
  }
  for (const s of active) {
    const left = s.prompt.length - s.fed;
    const take = Math.min(left, b.capacity - b.n);
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
  const rc = model.decode();
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
      release(s);
    }
    return;
  }
  for (const s of active) {
    if (s.out < 0) continue;
    if (s.cancelled || !seqs.has(s.id)) continue;
    const tok = model.sample(s.sampler, s.out);
    if (model.isEog(tok)) {
      finish(s, "stop");
      continue;
    }
    s.generated++;
    const stopped = push(
      s,
      s.decoder.decode(model.piece(tok), { stream: true }),
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
    flushBetweenSteps(); // the writer queues; not awaited, the next step overlaps it
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
    case "embed":
      embedQueue.push({ id: req.id, inputs: req.inputs });
      break;
  }
  flush();
  wake?.();
}

async function* lines(stream: ReadableStream<Uint8Array>) {
  const dec = new TextDecoder();
  let buf = "";
  for await (const chunk of stream) {
    buf += dec.decode(chunk, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      yield buf.slice(0, nl);
      buf = buf.slice(nl + 1);
    }
  }
}

async function main() {
  const input = lines(Deno.stdin.readable);
  const first = await input.next();
  const load = first.done ? null : JSON.parse(first.value) as ChildRequest;
  if (load?.op !== "load") throw new Error("expected a load request first");
  const llama = openLlama();
  model = await LoadedLlama.load(llama, load);
  for (let i = load.slots - 1; i >= 0; i--) freeSlots.push(i);
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
    },
  });
  flush();
  pump();
  for await (const line of input) {
    if (line.trim()) handle(JSON.parse(line) as ChildRequest);
  }
  Deno.exit(0); // the engine closed our stdin
}

/** `child.ts --check`: load the libraries, check the ABI, print one JSON line. */
function check() {
  let res;
  try {
    const llama = openLlama();
    res = { ok: true, version: llama.version, libDir: llama.libDir };
    llama.close();
  } catch (err) {
    res = { ok: false, message: (err as Error).message };
  }
  Deno.stdout.writeSync(enc.encode(JSON.stringify(res) + "\n"));
}

if (import.meta.main && Deno.args[0] === "--check") check();
else if (import.meta.main) {
  main().catch(async (err) => {
    emit({ ev: "fatal", message: (err as Error).message });
    flush();
    await out.ready;
    await out.close().catch(() => {});
    Deno.exit(3);
  });
}
