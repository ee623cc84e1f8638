/**
 * `deno task fixture:model OUT.gguf [--size tiny|agent|small] [--seed N]
 *   [--template qwen2.5|qwen3|qwen3-thinking]`
 *
 * Writes a llama-architecture GGUF with seeded random weights, a byte-level
 * BPE vocabulary (256 byte tokens + ChatML control tokens) and Qwen2.5's
 * chat template (ChatML with Hermes-style tools), so the Jinja template,
 * tool-call and grammar paths all run on it. llama.cpp loads and runs it
 * through exactly the code real models use; its output is deterministic
 * gibberish (and valid JSON or tool calls wherever a grammar asks).
 */
import { dirname } from "node:path";
import { parseArgs } from "node:util";
import {
  type GgufEntry,
  type GgufTensor,
  writeGguf,
} from "../node/llama/gguf.ts";
import {
  QWEN3_TEMPLATE,
  QWEN3_THINKING_TEMPLATE,
  QWEN_TOOLS_TEMPLATE,
} from "./fixture_templates.ts";

/** The chat templates `--template` names (default `qwen2.5`). */
export const FIXTURE_TEMPLATES: Record<string, string> = {
  "qwen2.5": QWEN_TOOLS_TEMPLATE,
  /** Reasoning: the `enable_thinking` switch, `<think>` output. */
  qwen3: QWEN3_TEMPLATE,
  /** Reasoning: the generation prompt opens `<think>`. */
  "qwen3-thinking": QWEN3_THINKING_TEMPLATE,
};

/** Shapes of the generated models. */
export const FIXTURE_SIZES = {
  /** ~0.2 M parameters: loads in milliseconds, for tests. */
  tiny: { embd: 64, layers: 2, heads: 4, headsKv: 2, ff: 192, ctx: 2048 },
  /**
   * Smaller than tiny (1 layer of 32) with a 128k-token trained context:
   * an agent-sized prompt prefills on a CPU in seconds (40k tokens: 6.8 s
   * on 2 shared cores, measured), for the cache benchmark and the coding
   * agents' tests. Its answers end on their own after a few words, as a
   * real model's turn does (`endLogit`), so an agent takes them as whole.
   */
  agent: {
    embd: 32,
    layers: 1,
    heads: 2,
    headsKv: 1,
    ff: 96,
    ctx: 131072,
    endLogit: 3.5,
  },
  /** ~100 M parameters: for benchmarks. */
  small: { embd: 768, layers: 14, heads: 12, headsKv: 12, ff: 2048, ctx: 2048 },
} as const;

export type FixtureSize = keyof typeof FIXTURE_SIZES;

export const CHATML_TEMPLATE =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** GPT-2's byte → printable-unicode mapping, the byte-level BPE alphabet. */
function byteAlphabet(): string[] {
  const keep: number[] = [];
  for (let b = 33; b <= 126; b++) keep.push(b);
  for (let b = 161; b <= 172; b++) keep.push(b);
  for (let b = 174; b <= 255; b++) keep.push(b);
  const out: string[] = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    out[b] = String.fromCodePoint(keep.includes(b) ? b : 256 + extra++);
  }
  return out;
}

/** xorshift32: a tiny seeded generator, so the same seed gives the same file. */
function rng(seed: number): () => number {
  let s = (seed >>> 0) || 0x9e3779b9;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 0x100000000;
  };
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 → IEEE half bits (round to nearest; our values are small and normal). */
function toHalf(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  const sign = (b >>> 16) & 0x8000;
  const exp = ((b >>> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return sign; // flush tiny values to zero
  if (exp >= 31) return sign | 0x7bff;
  return sign | (exp << 10) | (((b & 0x7fffff) + 0x1000) >>> 13);
}

function tensor(
  name: string,
  dims: number[],
  type: 0 | 1,
  init: () => number,
): GgufTensor {
  const n = dims.reduce((a, b) => a * b, 1);
  if (type === 0) {
    const data = new Float32Array(n);
    for (let i = 0; i < n; i++) data[i] = init();
    return { name, dims, type, data: new Uint8Array(data.buffer) };
  }
  const data = new Uint16Array(n);
  for (let i = 0; i < n; i++) data[i] = toHalf(init());
  return { name, dims, type, data: new Uint8Array(data.buffer) };
}

/** The end-of-turn token (`<|im_end|>`, also EOS and EOT). */
const END_TOKEN = 258;

/** Value of the constant residual dimension (dimension 0) with `endLogit`. */
const END_DIM_VALUE = 2;

/**
 * The output projection: random rows for printable ASCII and newline, zero
 * rows for every other token, so greedy text is readable gibberish (and
 * never a broken UTF-8 sequence) and rarely ends before `max_tokens`.
 *
 * With `endLogit`, dimension 0 of the residual stream is held constant
 * (see `constantDim`), no printable row reads it, and the end-of-turn row
 * reads only it, scaled so its logit is about `endLogit` after the final
 * RMS norm: it then beats the gibberish now and then, so turns end on
 * their own (measured with `endLogit` 3.5: greedy after 5 to 10 tokens,
 * sampled at temperature 1 after 2 to 45).
 */
function outputTensor(
  embd: number,
  vocab: number,
  init: () => number,
  endLogit: number | null,
): GgufTensor {
  const t = tensor("output.weight", [embd, vocab], 1, init);
  const halves = new Uint16Array(t.data.buffer);
  for (let tok = 0; tok < vocab; tok++) {
    if ((tok >= 32 && tok < 127) || tok === 10) {
      if (endLogit !== null) halves[tok * embd] = 0;
      continue;
    }
    halves.fill(0, tok * embd, (tok + 1) * embd);
  }
  if (endLogit !== null) {
    // after RMS norm the constant dimension reads about END_DIM_VALUE / rms,
    // rms ≈ 0.75 with the embeddings' variance (1/3) and the layers' outputs
    halves[END_TOKEN * embd] = toHalf(endLogit * 0.75 / END_DIM_VALUE);
  }
  return t;
}

/**
 * Holds dimension 0 of the residual stream constant: every token embeds
 * END_DIM_VALUE there and no layer writes to it (the output rows of
 * `attn_output` and `ffn_down` for dimension 0 are zero).
 */
function constantDim(t: GgufTensor, rowLength: number, value: number | null) {
  const halves = new Uint16Array(t.data.buffer);
  if (value === null) {
    halves.fill(0, 0, rowLength); // output row 0: writes nothing to dim 0
    return;
  }
  for (let i = 0; i < halves.length; i += rowLength) halves[i] = toHalf(value);
}

/** Writes a fixture model to `path`; returns its parameter count. */
export async function writeFixtureModel(
  path: string,
  opts: {
    size?: FixtureSize;
    seed?: number;
    name?: string;
    /** Chat template to embed (default Qwen2.5's, with tools). */
    template?: string;
  } = {},
): Promise<number> {
  const size = opts.size ?? "tiny";
  const shape = FIXTURE_SIZES[size];
  if (!shape) throw new Error(`Cannot write fixture: unknown size ${size}`);
  const rand = rng(opts.seed ?? 42);
  const uniform = (scale: number) => () => (rand() * 2 - 1) * scale;
  const tokens = [
    ...byteAlphabet(),
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
  ];
  const types = tokens.map((_, i) => (i < 256 ? 1 : 3));
  const vocab = tokens.length;
  const { embd, layers, heads, headsKv, ff, ctx } = shape;
  const endLogit = "endLogit" in shape ? shape.endLogit : null;
  const kvDim = (embd / heads) * headsKv;
  const metadata: [string, GgufEntry][] = [
    ["general.architecture", { type: "string", value: "llama" }],
    ["general.name", {
      type: "string",
      value: opts.name ?? `orchard-fixture-${size}`,
    }],
    ["general.file_type", { type: "u32", value: 1 }],
    ["llama.context_length", { type: "u32", value: ctx }],
    ["llama.embedding_length", { type: "u32", value: embd }],
    ["llama.block_count", { type: "u32", value: layers }],
    ["llama.feed_forward_length", { type: "u32", value: ff }],
    ["llama.attention.head_count", { type: "u32", value: heads }],
    ["llama.attention.head_count_kv", { type: "u32", value: headsKv }],
    ["llama.rope.dimension_count", { type: "u32", value: embd / heads }],
    ["llama.rope.freq_base", { type: "f32", value: 10000 }],
    ["llama.attention.layer_norm_rms_epsilon", { type: "f32", value: 1e-5 }],
    ["llama.vocab_size", { type: "u32", value: vocab }],
    ["tokenizer.ggml.model", { type: "string", value: "gpt2" }],
    ["tokenizer.ggml.pre", { type: "string", value: "default" }],
    ["tokenizer.ggml.tokens", { type: "string[]", value: tokens }],
    ["tokenizer.ggml.token_type", { type: "i32[]", value: types }],
    ["tokenizer.ggml.merges", { type: "string[]", value: [] }],
    ["tokenizer.ggml.bos_token_id", { type: "u32", value: 256 }],
    ["tokenizer.ggml.eos_token_id", { type: "u32", value: 258 }],
    ["tokenizer.ggml.eot_token_id", { type: "u32", value: 258 }],
    ["tokenizer.ggml.padding_token_id", { type: "u32", value: 256 }],
    ["tokenizer.ggml.add_bos_token", { type: "bool", value: false }],
    ["tokenizer.chat_template", {
      type: "string",
      value: opts.template ?? QWEN_TOOLS_TEMPLATE,
    }],
  ];
  const ones = () => 1;
  const embeddings = tensor("token_embd.weight", [embd, vocab], 1, uniform(1));
  if (endLogit !== null) constantDim(embeddings, embd, END_DIM_VALUE);
  const tensors: GgufTensor[] = [
    embeddings,
    tensor("output_norm.weight", [embd], 0, ones),
    outputTensor(embd, vocab, uniform(4 / Math.sqrt(embd)), endLogit),
  ];
  for (let l = 0; l < layers; l++) {
    const w = uniform(1 / Math.sqrt(embd));
    const attnOut = tensor(`blk.${l}.attn_output.weight`, [embd, embd], 1, w);
    const ffnDown = tensor(
      `blk.${l}.ffn_down.weight`,
      [ff, embd],
      1,
      uniform(1 / Math.sqrt(ff)),
    );
    if (endLogit !== null) {
      constantDim(attnOut, embd, null);
      constantDim(ffnDown, ff, null);
    }
    tensors.push(
      tensor(`blk.${l}.attn_norm.weight`, [embd], 0, ones),
      tensor(`blk.${l}.attn_q.weight`, [embd, embd], 1, w),
      tensor(`blk.${l}.attn_k.weight`, [embd, kvDim], 1, w),
      tensor(`blk.${l}.attn_v.weight`, [embd, kvDim], 1, w),
      attnOut,
      tensor(`blk.${l}.ffn_norm.weight`, [embd], 0, ones),
      tensor(`blk.${l}.ffn_gate.weight`, [embd, ff], 1, w),
      tensor(`blk.${l}.ffn_up.weight`, [embd, ff], 1, w),
      ffnDown,
    );
  }
  const params = tensors.reduce(
    (n, t) => n + t.dims.reduce((a, b) => a * b, 1),
    0,
  );
  await Deno.mkdir(dirname(path) || ".", { recursive: true });
  const tmp = `${path}.tmp-${Deno.pid}`;
  try {
    using file = await Deno.open(tmp, {
      write: true,
      create: true,
      truncate: true,
    });
    await writeGguf(file, metadata, tensors);
  } catch (err) {
    await Deno.remove(tmp).catch(() => {});
    throw err;
  }
  await Deno.rename(tmp, path);
  return params;
}

if (import.meta.main) {
  const { values: args, positionals } = parseArgs({
    args: Deno.args,
    allowPositionals: true,
    options: {
      size: { type: "string" },
      seed: { type: "string" },
      name: { type: "string" },
      template: { type: "string" },
    },
  });
  const out = positionals[0];
  const size = (args.size ?? "tiny") as FixtureSize;
  const template = FIXTURE_TEMPLATES[args.template ?? "qwen2.5"];
  if (typeof out !== "string" || !(size in FIXTURE_SIZES) || !template) {
    // deno-lint-ignore no-console
    console.error(
      `usage: deno task fixture:model OUT.gguf [--size ${
        Object.keys(FIXTURE_SIZES).join("|")
      }] [--seed N] [--template ${Object.keys(FIXTURE_TEMPLATES).join("|")}]`,
    );
    Deno.exit(2);
  }
  const params = await writeFixtureModel(out, {
    size,
    seed: args.seed ? Number(args.seed) : undefined,
    name: args.name,
    template,
  });
  // deno-lint-ignore no-console
  console.log(
    `wrote ${out}: ${size}, ${(params / 1e6).toFixed(1)} M parameters`,
  );
}
