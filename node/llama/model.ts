/**
 * A loaded model and its decode context, over the FFI binding: tokenizer,
 * chat template, samplers, a reusable batch and embeddings. Used only inside
 * a model's child process (node/llama/child.ts), which owns the context and
 * never decodes twice at once.
 */
import type { ChatMessage, SamplingParams, TokenLogprob } from "./protocol.ts";
import { CP, cstr, type Llama, MP } from "./ffi.ts";
import { Utf8Guard } from "./utf8_guard.ts";

/** An input error the engine reports as a 400, never a crash. */
export class InputError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

/** One decode batch whose arrays live in JS memory (kept alive by this object). */
export class Batch {
  readonly capacity: number;
  n = 0;
  readonly token: Int32Array<ArrayBuffer>;
  readonly pos: Int32Array<ArrayBuffer>;
  readonly nSeqId: Int32Array<ArrayBuffer>;
  readonly seqStore: Int32Array<ArrayBuffer>;
  readonly seqPtrs: BigUint64Array<ArrayBuffer>;
  readonly logits: Int8Array<ArrayBuffer>;
  readonly struct = new Uint8Array(56);

  constructor(capacity: number) {
    this.capacity = capacity;
    this.token = new Int32Array(capacity);
    this.pos = new Int32Array(capacity);
    this.nSeqId = new Int32Array(capacity).fill(1);
    this.seqStore = new Int32Array(capacity);
    this.seqPtrs = new BigUint64Array(capacity);
    this.logits = new Int8Array(capacity);
    const base = BigInt(
      Deno.UnsafePointer.value(Deno.UnsafePointer.of(this.seqStore)),
    );
    for (let i = 0; i < capacity; i++) this.seqPtrs[i] = base + BigInt(i * 4);
    const v = new DataView(this.struct.buffer);
    const ptr = (off: number, a: BufferSource) =>
      v.setBigUint64(
        off,
        BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(a))),
        true,
      );
    ptr(8, this.token);
    ptr(24, this.pos);
    ptr(32, this.nSeqId);
    ptr(40, this.seqPtrs);
    ptr(48, this.logits);
  }

  clear() {
    this.n = 0;
  }

  /** Appends a token; returns its index in the batch. */
  add(token: number, pos: number, seq: number, output: boolean): number {
    const i = this.n++;
    this.token[i] = token;
    this.pos[i] = pos;
    this.seqStore[i] = seq;
    this.logits[i] = output ? 1 : 0;
    return i;
  }

  /** The struct to pass by value, with n_tokens set. */
  value(): Uint8Array<ArrayBuffer> {
    new DataView(this.struct.buffer).setInt32(0, this.n, true);
    return this.struct;
  }
}

/** Options of `LoadedLlama.load`. */
export interface LoadOptions {
  path: string;
  ctxPerSeq: number;
  slots: number;
  threads: number;
  batch: number;
  /**
   * The devices to offload layers to (`llama_model_params.devices`), e.g.
   * RPC servers' (rpc.ts); all layers are offloaded. Default: every device
   * llama.cpp found (Metal on a Mac).
   */
  devices?: Deno.PointerObject[];
  /** Layers to offload to `devices` (default: all); the rest stay on the CPU. */
  gpuLayers?: number;
  /** Share of the offloaded layers per device (`llama_model_params.tensor_split`). */
  tensorSplit?: number[];
}

/** A model with its generation context. */
export class LoadedLlama {
  readonly ctxPerSeq: number;
  readonly ctxTrain: number;
  readonly vocabSize: number;
  readonly embd: number;
  readonly template: string | null;
  readonly batch: Batch;
  #embedCtx: Deno.PointerValue = null;
  #embedBatch: Batch | null = null;
  #piece = new Uint8Array(256);

  private constructor(
    readonly llama: Llama,
    readonly model: Deno.PointerObject,
    readonly ctx: Deno.PointerObject,
    readonly vocab: Deno.PointerObject,
    readonly memory: Deno.PointerObject,
    readonly opts: LoadOptions,
  ) {
    const s = llama.symbols;
    // with a unified KV cache llama_n_ctx_seq is the whole cache; each
    // sequence is held to its share so that all slots always fit
    this.ctxPerSeq = Math.min(s.llama_n_ctx_seq(ctx), opts.ctxPerSeq);
    this.ctxTrain = s.llama_model_n_ctx_train(model);
    this.vocabSize = s.llama_vocab_n_tokens(vocab);
    this.embd = s.llama_model_n_embd(model);
    const t = s.llama_model_chat_template(model, null);
    this.template = t ? Deno.UnsafePointerView.getCString(t) : null;
    this.batch = new Batch(opts.batch);
  }

  /** Loads the model file and creates a context of `slots` sequences. */
  static async load(llama: Llama, opts: LoadOptions): Promise<LoadedLlama> {
    const s = llama.symbols;
    const mp = s.llama_model_default_params();
    new DataView(mp.buffer).setInt32(
      MP.n_gpu_layers,
      opts.gpuLayers ?? -1,
      true,
    ); // all layers on Metal where present
    // NULL-terminated list; llama.cpp copies it during the load
    const devices = opts.devices?.length
      ? new BigUint64Array([
        ...opts.devices.map((d) => BigInt(Deno.UnsafePointer.value(d))),
        0n,
      ])
      : null;
    if (devices) {
      new DataView(mp.buffer).setBigUint64(
        MP.devices,
        BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(devices))),
        true,
      );
    }
    const split = opts.tensorSplit?.length
      ? new Float32Array(opts.tensorSplit)
      : null;
    if (split) {
      new DataView(mp.buffer).setBigUint64(
        MP.tensor_split,
        BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(split))),
        true,
      );
    }
    const model = await s.llama_model_load_from_file(cstr(opts.path), mp);
    devices?.fill(0n); // keeps the array alive until here
    split?.fill(0);
    if (!model) {
      throw new Error(
        `Cannot load model ${opts.path}: llama.cpp refused the file`,
      );
    }
    const ctx = s.llama_init_from_model(
      model,
      contextParams(llama, opts, false),
    );
    if (!ctx) {
      s.llama_model_free(model);
      throw new Error(`Cannot create a context for ${opts.path}`);
    }
    const vocab = s.llama_model_get_vocab(model)!;
    const memory = s.llama_get_memory(ctx)!;
    return new LoadedLlama(llama, model, ctx, vocab, memory, opts);
  }

  /** Applies the model's chat template (built-in formats only). */
  applyTemplate(messages: ChatMessage[]): string {
    const tmpl = this.template ?? "chatml";
    const keep = messages.flatMap((m) => [cstr(m.role), cstr(m.content)]);
    const arr = new BigUint64Array(messages.length * 2);
    keep.forEach((b, i) => {
      arr[i] = BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(b)));
    });
    const chars = messages.reduce(
      (n, m) => n + m.content.length + m.role.length,
      0,
    );
    let buf = new Uint8Array(chars * 2 + 256);
    const tmplC = cstr(tmpl);
    const apply = () =>
      this.llama.symbols.llama_chat_apply_template(
        tmplC,
        new Uint8Array(arr.buffer),
        BigInt(messages.length),
        true,
        buf,
        buf.length,
      );
    let n = apply();
    if (n > buf.length) {
      buf = new Uint8Array(n);
      n = apply();
    }
    if (n < 0) {
      throw new InputError(
        "unsupported_chat_template",
        "This model's chat template is not one of llama.cpp's built-in formats; use /v1/completions with a formatted prompt",
      );
    }
    return new TextDecoder().decode(buf.subarray(0, n));
  }

  /** Tokenizes text (control tokens such as <|im_start|> are parsed). */
  tokenize(text: string, addSpecial: boolean): Int32Array {
    const bytes = new TextEncoder().encode(text);
    let out = new Int32Array(bytes.length + 8);
    const s = this.llama.symbols;
    let n = s.llama_tokenize(
      this.vocab,
      bytes,
      bytes.length,
      out,
      out.length,
      addSpecial,
      true,
    );
    if (n < 0) {
      if (n === -2147483648) {
        throw new InputError("context_length_exceeded", "Input is too long");
      }
      out = new Int32Array(-n);
      n = s.llama_tokenize(
        this.vocab,
        bytes,
        bytes.length,
        out,
        out.length,
        addSpecial,
        true,
      );
    }
    return out.subarray(0, Math.max(0, n));
  }

  /** The bytes of one token (control tokens render as nothing unless `special`). */
  piece(token: number, special = false): Uint8Array {
    const s = this.llama.symbols;
    let n = s.llama_token_to_piece(
      this.vocab,
      token,
      this.#piece,
      this.#piece.length,
      0,
      special,
    );
    if (n < 0) {
      this.#piece = new Uint8Array(-n);
      n = s.llama_token_to_piece(
        this.vocab,
        token,
        this.#piece,
        this.#piece.length,
        0,
        special,
      );
    }
    return this.#piece.slice(0, Math.max(0, n));
  }

  isEog(token: number): boolean {
    return this.llama.symbols.llama_vocab_is_eog(this.vocab, token);
  }

  /**
   * Builds a sampler chain for one request. A grammar comes first, so the
   * other samplers only ever see tokens it allows; throws InputError when
   * llama.cpp cannot parse it.
   */
  sampler(p: SamplingParams): Deno.PointerObject {
    const s = this.llama.symbols;
    const chain = s.llama_sampler_chain_init(new Uint8Array([1]))!;
    const add = (smpl: Deno.PointerValue) =>
      smpl && s.llama_sampler_chain_add(chain, smpl);
    if (p.grammar) {
      const g = this.#grammar(p.grammar.gbnf, p.grammar.triggers);
      if (!g) {
        s.llama_sampler_free(chain);
        throw new InputError(
          "invalid_grammar",
          "The output constraint could not be compiled into a grammar",
          "response_format",
        );
      }
      add(g);
    }
    if (
      p.repeatPenalty !== 1 || p.frequencyPenalty !== 0 ||
      p.presencePenalty !== 0
    ) {
      add(s.llama_sampler_init_penalties(
        this.vocabSize,
        64,
        p.repeatPenalty,
        p.frequencyPenalty,
        p.presencePenalty,
      ));
    }
    if (p.temperature <= 0) {
      add(s.llama_sampler_init_greedy());
      return chain;
    }
    if (p.topK > 0) add(s.llama_sampler_init_top_k(p.topK));
    if (p.topP < 1) add(s.llama_sampler_init_top_p(p.topP, 1n));
    if (p.minP > 0) add(s.llama_sampler_init_min_p(p.minP, 1n));
    add(s.llama_sampler_init_temp(p.temperature));
    const seed = p.seed ?? Math.floor(Math.random() * 0xffffffff);
    add(s.llama_sampler_init_dist(seed >>> 0));
    return chain;
  }

  #utf8: Utf8Guard | null = null;

  /** The vocabulary's UTF-8 guard (built on first use: every token's bytes). */
  utf8Guard(): Utf8Guard {
    if (!this.#utf8) {
      const pieces: Uint8Array[] = [];
      for (let t = 0; t < this.vocabSize; t++) pieces.push(this.piece(t, true));
      this.#utf8 = new Utf8Guard(pieces);
    }
    return this.#utf8;
  }

  /** The logits of output `index` of the last decode, writable in place. */
  logitsView(index: number): Float32Array {
    const p = this.llama.symbols.llama_get_logits_ith(this.ctx, index);
    if (!p) throw new Error(`No logits for output ${index}`);
    return new Float32Array(
      Deno.UnsafePointerView.getArrayBuffer(p, this.vocabSize * 4),
    );
  }

  #grammar(gbnf: string, triggers?: string[]): Deno.PointerValue {
    const s = this.llama.symbols;
    if (!triggers?.length) {
      return s.llama_sampler_init_grammar(this.vocab, cstr(gbnf), cstr("root"));
    }
    const keep = triggers.map(cstr);
    const ptrs = new BigUint64Array(
      keep.map((b) =>
        BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(b)))
      ),
    );
    return s.llama_sampler_init_grammar_lazy_patterns(
      this.vocab,
      cstr(gbnf),
      cstr("root"),
      new Uint8Array(ptrs.buffer),
      BigInt(keep.length),
      new Uint8Array(4),
      0n,
    );
  }

  /**
   * The log-probability of `token` at output `index` of the last decode,
   * with the `top` most likely tokens, from the raw logits (before
   * temperature and other samplers, as OpenAI reports them).
   */
  logprobs(index: number, token: number, top: number): TokenLogprob {
    const logits = this.logitsView(index);
    let max = -Infinity;
    for (let i = 0; i < logits.length; i++) {
      if (logits[i]! > max) max = logits[i]!;
    }
    let sum = 0;
    for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i]! - max);
    const lse = max + Math.log(sum);
    const best: number[] = [];
    if (top > 0) {
      for (let i = 0; i < logits.length; i++) {
        if (best.length < top) {
          best.push(i);
          if (best.length === top) best.sort((a, b) => logits[b]! - logits[a]!);
        } else if (logits[i]! > logits[best[top - 1]!]!) {
          let j = top - 1;
          while (j > 0 && logits[i]! > logits[best[j - 1]!]!) {
            best[j] = best[j - 1]!;
            j--;
          }
          best[j] = i;
        }
      }
      if (best.length < top) best.sort((a, b) => logits[b]! - logits[a]!);
    }
    const entry = (t: number) => {
      const bytes = this.piece(t);
      return {
        token: new TextDecoder().decode(bytes),
        bytes: Array.from(bytes),
        logprob: logits[t]! - lse,
      };
    };
    return { ...entry(token), top: best.map(entry) };
  }

  /** Decodes the shared batch (synchronously); the caller never overlaps two calls. */
  decode(): number {
    return this.llama.symbols.llama_decode(this.ctx, this.batch.value());
  }

  sample(sampler: Deno.PointerObject, index: number): number {
    return this.llama.symbols.llama_sampler_sample(sampler, this.ctx, index);
  }

  /** Forgets everything a sequence left in the KV cache. */
  clearSeq(seq: number) {
    this.llama.symbols.llama_memory_seq_rm(this.memory, seq, -1, -1);
  }

  /** Makes positions [0, n) of sequence `src` part of `dst` too (shared cells). */
  shareSeq(src: number, dst: number, n: number) {
    this.llama.symbols.llama_memory_seq_cp(this.memory, src, dst, 0, n);
  }

  /** Drops a sequence's cached positions from `from` on (keeps its prefix). */
  truncateSeq(seq: number, from: number): boolean {
    return this.llama.symbols.llama_memory_seq_rm(this.memory, seq, from, -1);
  }

  /** A copy of a sequence's KV cells in host memory, or null when it cannot be made. */
  saveSeq(seq: number): Uint8Array | null {
    const s = this.llama.symbols;
    const size = Number(s.llama_state_seq_get_size(this.ctx, seq));
    if (!(size > 0)) return null;
    const buf = new Uint8Array(size);
    const n = Number(
      s.llama_state_seq_get_data(this.ctx, buf, BigInt(size), seq),
    );
    return n > 0 ? buf.subarray(0, n) : null;
  }

  /** Replaces a sequence's cells with a saved copy; false (and the sequence empty) when it did not fit. */
  restoreSeq(seq: number, state: Uint8Array): boolean {
    const n = this.llama.symbols.llama_state_seq_set_data(
      this.ctx,
      state as Uint8Array<ArrayBuffer>,
      BigInt(state.length),
      seq,
    );
    if (Number(n) > 0) return true;
    this.clearSeq(seq);
    return false;
  }

  /** Mean-pooled, L2-normalised embeddings of each input. */
  embed(
    inputs: string[],
  ): { vectors: number[][]; tokens: number } {
    const s = this.llama.symbols;
    if (!this.#embedCtx) {
      this.#embedCtx = s.llama_init_from_model(
        this.model,
        contextParams(this.llama, this.opts, true),
      );
      if (!this.#embedCtx) {
        throw new Error("Cannot create an embedding context");
      }
      this.#embedBatch = new Batch(embedContext(this.opts));
    }
    const ctx = this.#embedCtx;
    const batch = this.#embedBatch!;
    const mem = s.llama_get_memory(ctx)!;
    const vectors: number[][] = [];
    let tokens = 0;
    for (const [i, text] of inputs.entries()) {
      const toks = this.tokenize(text, true);
      if (toks.length === 0) {
        throw new InputError("invalid_value", `input[${i}] is empty`, "input");
      }
      if (toks.length > batch.capacity) {
        throw new InputError(
          "context_length_exceeded",
          `input[${i}] has ${toks.length} tokens; this model embeds at most ${batch.capacity}`,
          "input",
        );
      }
      tokens += toks.length;
      s.llama_memory_clear(mem, true);
      batch.clear();
      toks.forEach((t, p) => batch.add(t, p, 0, true));
      const rc = s.llama_decode(ctx, batch.value());
      if (rc !== 0) {
        throw new Error(`llama_decode failed with ${rc} while embedding`);
      }
      const p = s.llama_get_embeddings_seq(ctx, 0);
      if (!p) throw new Error("The model returned no embedding");
      const v = new Float32Array(
        Deno.UnsafePointerView.getArrayBuffer(p, this.embd * 4).slice(0),
      );
      let norm = 0;
      for (const x of v) norm += x * x;
      norm = Math.sqrt(norm) || 1;
      vectors.push(Array.from(v, (x) => x / norm));
    }
    return { vectors, tokens };
  }

  close() {
    const s = this.llama.symbols;
    if (this.#embedCtx) s.llama_free(this.#embedCtx);
    s.llama_free(this.ctx);
    s.llama_model_free(this.model);
  }
}

/**
 * The embedding context: one input decoded whole, so its compute buffers
 * grow with it; an agent-sized generation context (128k) would make them
 * gigabytes.
 */
function embedContext(o: LoadOptions): number {
  return Math.min(o.ctxPerSeq, 8192);
}

function contextParams(
  llama: Llama,
  o: LoadOptions,
  embeddings: boolean,
): Uint8Array<ArrayBuffer> {
  const cp = llama.symbols.llama_context_default_params();
  const v = new DataView(cp.buffer);
  const seqs = embeddings ? 1 : o.slots;
  const ctx = embeddings ? embedContext(o) : o.ctxPerSeq * seqs;
  v.setUint32(CP.n_ctx, ctx, true);
  v.setUint32(CP.n_batch, embeddings ? ctx : o.batch, true);
  v.setUint32(CP.n_ubatch, embeddings ? ctx : Math.min(o.batch, 512), true);
  v.setUint32(CP.n_seq_max, seqs, true);
  v.setInt32(CP.n_threads, o.threads, true);
  v.setInt32(CP.n_threads_batch, o.threads, true);
  v.setUint8(CP.no_perf, 1);
  // one KV stream for all sequences: a mixed batch (prompt chunks of new
  // requests + one token of each running one) stays one ubatch
  // (split_simple); per-sequence streams split it by sequence (split_equal)
  v.setUint8(CP.kv_unified, 1);
  if (embeddings) {
    v.setUint8(CP.embeddings, 1);
    v.setInt32(CP.pooling_type, 1, true); // LLAMA_POOLING_TYPE_MEAN
  }
  return cp as Uint8Array<ArrayBuffer>;
}
