/**
 * GGUF metadata: a bounds-checked reader used before any file reaches
 * llama.cpp (some malformed files abort the whole process inside the
 * library, e.g. `block_count = 0`), and a writer used by the fixture model
 * generator.
 *
 * Written by hand: the npm GGUF readers (@huggingface/gguf) fetch over HTTP
 * and trust the sizes in the file; we need a strict, local, size-capped
 * reader that never allocates what a hostile header asks for.
 */

/** GGUF value types (gguf.h `enum gguf_type`). */
export const GgufType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

/** A metadata value as read from the file. */
export type GgufValue = number | bigint | boolean | string | GgufValue[];

/** One tensor's header entry. */
export interface GgufTensorInfo {
  name: string;
  dims: number[];
  type: number;
  offset: number;
}

/** The parsed header of a GGUF file. */
export interface GgufInfo {
  version: number;
  metadata: Map<string, GgufValue>;
  tensors: GgufTensorInfo[];
  /** Absolute offset of the tensor data section. */
  dataOffset: number;
  fileSize: number;
}

/** A file that is not a GGUF llama.cpp can safely load. */
export class GgufError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "GgufError";
  }
}

const MAX_TENSORS = 1 << 16;
const MAX_KV = 1 << 16;
const MAX_STRING = 16 << 20;
const MAX_ARRAY = 1 << 24;
const MAX_HEADER = 512 << 20;

/** Bytes per block and elements per block of the ggml types we know. */
const TYPE_SIZES: Record<number, [bytes: number, elems: number]> = {
  0: [4, 1], // F32
  1: [2, 1], // F16
  2: [18, 32], // Q4_0
  3: [20, 32], // Q4_1
  6: [22, 32], // Q5_0
  7: [24, 32], // Q5_1
  8: [34, 32], // Q8_0
  9: [36, 32], // Q8_1
  10: [84, 256], // Q2_K
  11: [110, 256], // Q3_K
  12: [144, 256], // Q4_K
  13: [176, 256], // Q5_K
  14: [210, 256], // Q6_K
  15: [292, 256], // Q8_K
  16: [66, 256], // IQ2_XXS
  17: [74, 256], // IQ2_XS
  18: [98, 256], // IQ3_XXS
  19: [50, 256], // IQ1_S
  20: [18, 32], // IQ4_NL
  21: [110, 256], // IQ3_S
  22: [82, 256], // IQ2_S
  23: [136, 256], // IQ4_XS
  24: [1, 1], // I8
  25: [2, 1], // I16
  26: [4, 1], // I32
  27: [8, 1], // I64
  28: [8, 1], // F64
  29: [56, 256], // IQ1_M
  30: [2, 1], // BF16
  34: [54, 256], // TQ1_0
  35: [66, 256], // TQ2_0
};

class NeedMore extends Error {}

class Cursor {
  pos = 0;
  readonly view: DataView;
  constructor(readonly buf: Uint8Array, readonly eof: boolean) {
    this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  }
  need(n: number) {
    if (this.pos + n > this.buf.length) {
      if (this.eof) throw new GgufError("Cannot read GGUF: file is truncated");
      throw new NeedMore();
    }
  }
  u8() {
    this.need(1);
    return this.view.getUint8(this.pos++);
  }
  u32() {
    this.need(4);
    const v = this.view.getUint32(this.pos, true);
    this.pos += 4;
    return v;
  }
  u64(): number {
    this.need(8);
    const v = this.view.getBigUint64(this.pos, true);
    this.pos += 8;
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new GgufError(`Cannot read GGUF: 64-bit value ${v} is too large`);
    }
    return Number(v);
  }
  str(): string {
    const n = this.u64();
    if (n > MAX_STRING) {
      throw new GgufError(`Cannot read GGUF: string of ${n} bytes`);
    }
    this.need(n);
    const s = new TextDecoder().decode(
      this.buf.subarray(this.pos, this.pos + n),
    );
    this.pos += n;
    return s;
  }
  value(type: number, depth = 0): GgufValue {
    const v = this.view;
    const at = (n: number) => {
      this.need(n);
      const p = this.pos;
      this.pos += n;
      return p;
    };
    switch (type) {
      case GgufType.UINT8:
        return v.getUint8(at(1));
      case GgufType.INT8:
        return v.getInt8(at(1));
      case GgufType.UINT16:
        return v.getUint16(at(2), true);
      case GgufType.INT16:
        return v.getInt16(at(2), true);
      case GgufType.UINT32:
        return v.getUint32(at(4), true);
      case GgufType.INT32:
        return v.getInt32(at(4), true);
      case GgufType.FLOAT32:
        return v.getFloat32(at(4), true);
      case GgufType.BOOL:
        return v.getUint8(at(1)) !== 0;
      case GgufType.STRING:
        return this.str();
      case GgufType.UINT64:
        return v.getBigUint64(at(8), true);
      case GgufType.INT64:
        return v.getBigInt64(at(8), true);
      case GgufType.FLOAT64:
        return v.getFloat64(at(8), true);
      case GgufType.ARRAY: {
        if (depth > 1) throw new GgufError("Cannot read GGUF: nested arrays");
        const itemType = this.u32();
        const n = this.u64();
        if (n > MAX_ARRAY) {
          throw new GgufError(`Cannot read GGUF: array of ${n} items`);
        }
        const out: GgufValue[] = [];
        for (let i = 0; i < n; i++) out.push(this.value(itemType, depth + 1));
        return out;
      }
      default:
        throw new GgufError(`Cannot read GGUF: unknown value type ${type}`);
    }
  }
}

function parse(buf: Uint8Array, eof: boolean, fileSize: number): GgufInfo {
  const c = new Cursor(buf, eof);
  if (c.u32() !== 0x46554747) {
    throw new GgufError("Cannot read GGUF: not a GGUF file (bad magic)");
  }
  const version = c.u32();
  if (version !== 2 && version !== 3) {
    throw new GgufError(`Cannot read GGUF: unsupported version ${version}`);
  }
  const nTensors = c.u64();
  const nKv = c.u64();
  if (nTensors > MAX_TENSORS || nKv > MAX_KV) {
    throw new GgufError(
      `Cannot read GGUF: ${nTensors} tensors and ${nKv} metadata keys is beyond the limits`,
    );
  }
  const metadata = new Map<string, GgufValue>();
  for (let i = 0; i < nKv; i++) {
    const key = c.str();
    metadata.set(key, c.value(c.u32()));
  }
  const tensors: GgufTensorInfo[] = [];
  for (let i = 0; i < nTensors; i++) {
    const name = c.str();
    const nDims = c.u32();
    if (nDims < 1 || nDims > 4) {
      throw new GgufError(`Cannot read GGUF: tensor ${name} has ${nDims} dims`);
    }
    const dims: number[] = [];
    for (let d = 0; d < nDims; d++) dims.push(c.u64());
    tensors.push({ name, dims, type: c.u32(), offset: c.u64() });
  }
  const alignment = Number(metadata.get("general.alignment") ?? 32);
  if (!(alignment > 0) || (alignment & (alignment - 1)) !== 0) {
    throw new GgufError(`Cannot read GGUF: bad alignment ${alignment}`);
  }
  const dataOffset = Math.ceil(c.pos / alignment) * alignment;
  return { version, metadata, tensors, dataOffset, fileSize };
}

/** Reads and parses a GGUF header, growing the read window as needed. */
export async function readGguf(path: string): Promise<GgufInfo> {
  using file = await Deno.open(path, { read: true });
  const size = (await file.stat()).size;
  let want = Math.min(size, 1 << 20);
  while (true) {
    const buf = new Uint8Array(want);
    await file.seek(0, Deno.SeekMode.Start);
    let got = 0;
    while (got < want) {
      const n = await file.read(buf.subarray(got));
      if (n === null) break;
      got += n;
    }
    try {
      return parse(buf.subarray(0, got), got >= size, size);
    } catch (err) {
      if (!(err instanceof NeedMore)) throw err;
      if (want >= MAX_HEADER) {
        throw new GgufError("Cannot read GGUF: header larger than 512 MiB");
      }
      want = Math.min(size, want * 4, MAX_HEADER);
    }
  }
}

/** What the engine needs to know about a model, from its header. */
export interface ModelFacts {
  architecture: string;
  name: string | null;
  blockCount: number;
  contextLength: number | null;
  embeddingLength: number | null;
  /**
   * Bytes one token takes in an f16 KV cache: layers × (n_head_kv ×
   * key_length + n_head_kv × value_length) × 2; null when the header
   * lacks the attention facts.
   */
  kvBytesPerToken: number | null;
  /** True for encoder/embedding-only architectures. */
  embeddingOnly: boolean;
  chatTemplate: string | null;
  /** Text of the BOS and EOS tokens, for chat templates that print them. */
  bosToken: string;
  eosToken: string;
  parameterCount: number;
}

const EMBEDDING_ARCHS = new Set([
  "bert",
  "nomic-bert",
  "nomic-bert-moe",
  "jina-bert-v2",
  "jina-bert-v3",
  "neo-bert",
  "modern-bert",
  "t5encoder",
]);

function num(v: GgufValue | undefined): number | null {
  if (typeof v === "number") return v;
  if (typeof v === "bigint") return Number(v);
  return null;
}

/** Bytes of f16 K and V per token over all layers (see ModelFacts). */
function kvBytesPerToken(
  info: GgufInfo,
  arch: string,
  layers: number,
): number | null {
  const meta = (k: string) => info.metadata.get(`${arch}.${k}`);
  const heads = num(meta("attention.head_count"));
  const embd = num(meta("embedding_length"));
  const headDim = heads && embd ? embd / heads : null;
  const kLen = num(meta("attention.key_length")) ?? headDim;
  const vLen = num(meta("attention.value_length")) ?? headDim;
  const kv = meta("attention.head_count_kv") ?? meta("attention.head_count");
  if (kLen === null || vLen === null || kv === undefined) return null;
  // one value for every layer, or one per layer (0 for a layer without attention)
  const perLayer = Array.isArray(kv)
    ? kv.map((v) => num(v) ?? 0)
    : Array.from({ length: layers }, () => num(kv) ?? 0);
  const kvHeads = perLayer.reduce((a, b) => a + b, 0);
  const bytes = kvHeads * (kLen + vLen) * 2;
  return bytes > 0 && Number.isFinite(bytes) ? bytes : null;
}

/**
 * Checks the header against what llama.cpp asserts on (an abort, not an
 * error, inside the library) and returns the facts the engine uses.
 */
export function validateModel(info: GgufInfo): ModelFacts {
  const arch = info.metadata.get("general.architecture");
  if (typeof arch !== "string" || !/^[a-z0-9_.-]{1,64}$/.test(arch)) {
    throw new GgufError("Cannot load model: general.architecture is missing");
  }
  const blockCount = num(info.metadata.get(`${arch}.block_count`));
  if (blockCount === null || !(blockCount >= 1) || blockCount > 4096) {
    throw new GgufError(
      `Cannot load model: ${arch}.block_count must be 1 to 4096: current value is ${blockCount}`,
    );
  }
  if (info.tensors.length === 0) {
    throw new GgufError("Cannot load model: the file has no tensors");
  }
  const dataSize = info.fileSize - info.dataOffset;
  const names = new Set<string>();
  let params = 0;
  for (const t of info.tensors) {
    if (names.has(t.name)) {
      throw new GgufError(`Cannot load model: duplicate tensor ${t.name}`);
    }
    names.add(t.name);
    let elems = 1;
    for (const d of t.dims) {
      if (!(d >= 1)) {
        throw new GgufError(`Cannot load model: tensor ${t.name} has a 0 dim`);
      }
      elems *= d;
    }
    if (elems > 2 ** 40) {
      throw new GgufError(`Cannot load model: tensor ${t.name} is too large`);
    }
    params += elems;
    const size = TYPE_SIZES[t.type];
    if (!size) continue; // a type newer than this table: llama.cpp checks it
    const [bytes, per] = size;
    if ((t.dims[0] ?? 0) % per !== 0) {
      throw new GgufError(
        `Cannot load model: tensor ${t.name} rows are not whole blocks`,
      );
    }
    if (t.offset + (elems / per) * bytes > dataSize) {
      throw new GgufError(
        `Cannot load model: tensor ${t.name} extends past the end of the file`,
      );
    }
  }
  const template = info.metadata.get("tokenizer.chat_template");
  const tokens = info.metadata.get("tokenizer.ggml.tokens");
  const tokenText = (key: string) => {
    const id = num(info.metadata.get(key));
    const t = Array.isArray(tokens) && id !== null ? tokens[id] : undefined;
    return typeof t === "string" ? t : "";
  };
  return {
    architecture: arch,
    name: typeof info.metadata.get("general.name") === "string"
      ? info.metadata.get("general.name") as string
      : null,
    blockCount,
    contextLength: num(info.metadata.get(`${arch}.context_length`)),
    embeddingLength: num(info.metadata.get(`${arch}.embedding_length`)),
    kvBytesPerToken: kvBytesPerToken(info, arch, blockCount),
    embeddingOnly: EMBEDDING_ARCHS.has(arch) ||
      info.metadata.has(`${arch}.pooling_type`),
    chatTemplate: typeof template === "string" ? template : null,
    bosToken: tokenText("tokenizer.ggml.bos_token_id"),
    eosToken: tokenText("tokenizer.ggml.eos_token_id"),
    parameterCount: params,
  };
}

/** A metadata entry to write: the value and its GGUF type. */
export type GgufEntry =
  | { type: "string"; value: string }
  | { type: "u32" | "i32" | "f32" | "bool"; value: number | boolean }
  | { type: "string[]"; value: string[] }
  | { type: "i32[]" | "f32[]"; value: ArrayLike<number> };

/** A tensor to write: ggml dims (ne0 first), type F32 (0) or F16 (1), and its bytes. */
export interface GgufTensor {
  name: string;
  dims: number[];
  type: 0 | 1;
  data: Uint8Array;
}

/** Writes a GGUF v3 file (32-byte alignment) to an open file. */
export async function writeGguf(
  file: Deno.FsFile,
  metadata: [string, GgufEntry][],
  tensors: GgufTensor[],
): Promise<void> {
  const parts: Uint8Array[] = [];
  const enc = new TextEncoder();
  const scalar = (size: number, fill: (v: DataView) => void) => {
    const b = new Uint8Array(size);
    fill(new DataView(b.buffer));
    parts.push(b);
  };
  const u32 = (n: number) => scalar(4, (v) => v.setUint32(0, n, true));
  const u64 = (n: number) =>
    scalar(8, (v) => v.setBigUint64(0, BigInt(n), true));
  const str = (s: string) => {
    const b = enc.encode(s);
    u64(b.length);
    parts.push(b);
  };
  u32(0x46554747);
  u32(3);
  u64(tensors.length);
  u64(metadata.length);
  for (const [key, e] of metadata) {
    str(key);
    switch (e.type) {
      case "string":
        u32(GgufType.STRING), str(e.value);
        break;
      case "u32":
        u32(GgufType.UINT32), u32(Number(e.value));
        break;
      case "i32":
        u32(GgufType.INT32);
        scalar(4, (v) => v.setInt32(0, Number(e.value), true));
        break;
      case "f32":
        u32(GgufType.FLOAT32);
        scalar(4, (v) => v.setFloat32(0, Number(e.value), true));
        break;
      case "bool":
        u32(GgufType.BOOL), parts.push(new Uint8Array([e.value ? 1 : 0]));
        break;
      case "string[]":
        u32(GgufType.ARRAY), u32(GgufType.STRING), u64(e.value.length);
        for (const s of e.value) str(s);
        break;
      case "i32[]":
      case "f32[]": {
        u32(GgufType.ARRAY);
        u32(e.type === "i32[]" ? GgufType.INT32 : GgufType.FLOAT32);
        u64(e.value.length);
        const b = new DataView(new ArrayBuffer(e.value.length * 4));
        for (let i = 0; i < e.value.length; i++) {
          if (e.type === "i32[]") b.setInt32(i * 4, e.value[i]!, true);
          else b.setFloat32(i * 4, e.value[i]!, true);
        }
        parts.push(new Uint8Array(b.buffer));
        break;
      }
    }
  }
  let offset = 0;
  for (const t of tensors) {
    str(t.name);
    u32(t.dims.length);
    for (const d of t.dims) u64(d);
    u32(t.type);
    u64(offset);
    offset += Math.ceil(t.data.length / 32) * 32;
  }
  let pos = parts.reduce((n, p) => n + p.length, 0);
  parts.push(new Uint8Array(Math.ceil(pos / 32) * 32 - pos));
  for (const p of parts) await writeAll(file, p);
  for (const t of tensors) {
    await writeAll(file, t.data);
    pos = t.data.length;
    await writeAll(file, new Uint8Array(Math.ceil(pos / 32) * 32 - pos));
  }
}

async function writeAll(file: Deno.FsFile, data: Uint8Array) {
  let off = 0;
  while (off < data.length) off += await file.write(data.subarray(off));
}
