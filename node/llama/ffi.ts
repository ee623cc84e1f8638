/**
 * The llama.cpp binding: the one module that calls `Deno.dlopen` on
 * libllama and libggml. It loads llama.cpp built from the pinned package's
 * own source with RPC on (`build/llama/lib/`, node/native/llama_build.ts)
 * when that build exists, else the prebuilt `@node-llama-cpp/<platform>`
 * package libraries (no RPC); `Llama.build` says which.
 *
 * Bound against `include/llama.h` of the llama.cpp release bundled in
 * node-llama-cpp 3.21.1 (`llama/gitRelease.bundle`, tag v0.4.0). Struct
 * layouts change between releases, so `openLlama` checks the version string
 * and reads the library's default parameters back at the offsets below; any
 * mismatch refuses to start with a clear message instead of corrupting
 * memory.
 */
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { readLlamaManifest } from "../native/llama_build.ts";

/** The npm version every platform package is pinned to. */
export const LLAMA_PACKAGE_VERSION = "3.21.1";
/** `llama_version()` of that package's llama.cpp. */
export const LLAMA_VERSION_PREFIX = "0.4.0";

const P = "pointer" as const;

/** `struct llama_batch` (56 bytes): n_tokens, token, embd, pos, n_seq_id, seq_id, logits. */
export const BATCH_STRUCT = { struct: ["i32", P, P, P, P, P, P] } as const;
/** `struct llama_model_params` (80 bytes), passed and returned by value. */
export const MODEL_PARAMS = {
  struct: [
    P, // devices
    P, // tensor_buft_overrides
    "i32", // n_gpu_layers
    "i32", // split_mode
    "i32", // load_mode
    "i32", // lazy_mode
    "i32", // main_gpu
    P, // tensor_split
    P, // progress_callback
    P, // progress_callback_user_data
    P, // kv_overrides
    "u8", // vocab_only
    "u8", // check_tensors
    "u8", // use_extra_bufts
    "u8", // no_host
    "u8", // no_alloc
    "u8", // load_mtp
  ],
} as const;
/** Offsets in `struct llama_model_params` (from offsetof on the pinned header). */
export const MP = {
  devices: 0,
  n_gpu_layers: 16,
  tensor_split: 40,
  use_extra_bufts: 74,
  size: 80,
} as const;

/** `struct llama_context_params` (160 bytes), passed and returned by value. */
export const CONTEXT_PARAMS = {
  struct: [
    "u32", // n_ctx
    "u32", // n_batch
    "u32", // n_ubatch
    "u32", // n_seq_max
    "u32", // n_rs_seq
    "u32", // n_outputs_max
    "u32", // n_outputs_max_per_seq
    "i32", // n_threads
    "i32", // n_threads_batch
    "i32", // ctx_type
    "i32", // rope_scaling_type
    "i32", // pooling_type
    "i32", // attention_type
    "i32", // flash_attn_type
    "f32", // rope_freq_base
    "f32", // rope_freq_scale
    "f32", // yarn_ext_factor
    "f32", // yarn_attn_factor
    "f32", // yarn_beta_fast
    "f32", // yarn_beta_slow
    "u32", // yarn_orig_ctx
    "f32", // defrag_thold
    P, // cb_eval
    P, // cb_eval_user_data
    "i32", // type_k
    "i32", // type_v
    P, // abort_callback
    P, // abort_callback_data
    "u8", // embeddings
    "u8", // offload_kqv
    "u8", // no_perf
    "u8", // op_offload
    "u8", // swa_full
    "u8", // kv_unified
    P, // samplers
    "usize", // n_samplers
    P, // ctx_other
  ],
} as const;
/** Offsets in `struct llama_context_params`. */
export const CP = {
  n_ctx: 0,
  n_batch: 4,
  n_ubatch: 8,
  n_seq_max: 12,
  n_threads: 28,
  n_threads_batch: 32,
  pooling_type: 44,
  type_k: 104,
  type_v: 108,
  embeddings: 128,
  no_perf: 130,
  kv_unified: 133,
  size: 160,
} as const;

/** `struct llama_sampler_chain_params { bool no_perf; }`. */
const CHAIN_PARAMS = { struct: ["u8"] } as const;

const SYMBOLS = {
  llama_version: { parameters: [], result: P }, // const char *(void)
  llama_backend_init: { parameters: [], result: "void" },
  llama_model_default_params: { parameters: [], result: MODEL_PARAMS },
  llama_context_default_params: { parameters: [], result: CONTEXT_PARAMS },
  llama_sampler_chain_default_params: { parameters: [], result: CHAIN_PARAMS },
  // llama_model *(const char * path, llama_model_params)
  llama_model_load_from_file: {
    parameters: ["buffer", MODEL_PARAMS],
    result: P,
    nonblocking: true,
  },
  llama_model_free: { parameters: [P], result: "void" },
  // llama_context *(llama_model *, llama_context_params)
  llama_init_from_model: { parameters: [P, CONTEXT_PARAMS], result: P },
  llama_free: { parameters: [P], result: "void" },
  llama_model_get_vocab: { parameters: [P], result: P },
  llama_model_n_embd: { parameters: [P], result: "i32" },
  llama_model_n_ctx_train: { parameters: [P], result: "i32" },
  llama_model_chat_template: { parameters: [P, P], result: P }, // (model, const char * name)
  llama_n_ctx: { parameters: [P], result: "u32" },
  llama_n_ctx_seq: { parameters: [P], result: "u32" },
  llama_n_batch: { parameters: [P], result: "u32" },
  llama_get_memory: { parameters: [P], result: P },
  // bool (llama_memory_t, llama_seq_id, llama_pos p0, llama_pos p1)
  llama_memory_seq_rm: { parameters: [P, "i32", "i32", "i32"], result: "bool" },
  llama_memory_clear: { parameters: [P, "bool"], result: "void" },
  // void (llama_memory_t, src, dst, llama_pos p0, llama_pos p1): with a unified
  // KV cache the cells are shared, not copied
  llama_memory_seq_cp: {
    parameters: [P, "i32", "i32", "i32", "i32"],
    result: "void",
  },
  // int32 (ctx, llama_batch). Synchronous: a `nonblocking` call (a hop to
  // a blocking-pool thread) measured 1.6-2x slower per token on CPU; the
  // child process that owns the context yields to its event loop between
  // decode steps instead, so cancellations still arrive.
  llama_decode: { parameters: [P, BATCH_STRUCT], result: "i32" },
  // size_t (ctx, llama_seq_id): the bytes llama_state_seq_get_data needs for the sequence
  llama_state_seq_get_size: { parameters: [P, "i32"], result: "usize" },
  // size_t (ctx, uint8_t * dst, size_t size, llama_seq_id): bytes written (0: failed).
  // Synchronous like llama_decode: only the child process that owns the context calls it.
  llama_state_seq_get_data: {
    parameters: [P, "buffer", "usize", "i32"],
    result: "usize",
  },
  // size_t (ctx, const uint8_t * src, size_t size, llama_seq_id dest): clears dest,
  // then loads the cells into it; bytes read, 0 when it failed (no room)
  llama_state_seq_set_data: {
    parameters: [P, "buffer", "usize", "i32"],
    result: "usize",
  },
  llama_get_embeddings_seq: { parameters: [P, "i32"], result: P }, // float *
  llama_vocab_n_tokens: { parameters: [P], result: "i32" },
  llama_vocab_is_eog: { parameters: [P, "i32"], result: "bool" },
  // int32 (vocab, const char * text, int32 len, llama_token * out, int32 max, bool add_special, bool parse_special)
  llama_tokenize: {
    parameters: [P, "buffer", "i32", "buffer", "i32", "bool", "bool"],
    result: "i32",
  },
  // int32 (vocab, llama_token, char * buf, int32 len, int32 lstrip, bool special)
  llama_token_to_piece: {
    parameters: [P, "i32", "buffer", "i32", "i32", "bool"],
    result: "i32",
  },
  // int32 (const char * tmpl, const llama_chat_message * chat, size_t n, bool add_ass, char * buf, int32 len)
  llama_chat_apply_template: {
    parameters: ["buffer", "buffer", "usize", "bool", "buffer", "i32"],
    result: "i32",
  },
  llama_sampler_chain_init: { parameters: [CHAIN_PARAMS], result: P },
  llama_sampler_chain_add: { parameters: [P, P], result: "void" },
  llama_sampler_init_greedy: { parameters: [], result: P },
  llama_sampler_init_dist: { parameters: ["u32"], result: P },
  llama_sampler_init_top_k: { parameters: ["i32"], result: P },
  llama_sampler_init_top_p: { parameters: ["f32", "usize"], result: P },
  llama_sampler_init_min_p: { parameters: ["f32", "usize"], result: P },
  llama_sampler_init_temp: { parameters: ["f32"], result: P },
  // (n_vocab, penalty_last_n, repeat, freq, present)
  llama_sampler_init_penalties: {
    parameters: ["i32", "i32", "f32", "f32", "f32"],
    result: P,
  },
  // llama_sampler * (const llama_vocab *, const char * grammar, const char * root): NULL when the grammar does not parse
  llama_sampler_init_grammar: {
    parameters: [P, "buffer", "buffer"],
    result: P,
  },
  // llama_sampler * (vocab, grammar, root, const char ** patterns, size_t n, const llama_token * tokens, size_t n):
  // the grammar applies only from the first match of a trigger pattern on
  llama_sampler_init_grammar_lazy_patterns: {
    parameters: [P, "buffer", "buffer", "buffer", "usize", "buffer", "usize"],
    result: P,
  },
  llama_sampler_sample: { parameters: [P, P, "i32"], result: "i32" },
  // float * (ctx, int32 i): the logits of the i-th output of the last decode (n_vocab floats)
  llama_get_logits_ith: { parameters: [P, "i32"], result: P },
  llama_sampler_free: { parameters: [P], result: "void" },
} as const;

const GGML_SYMBOLS = {
  ggml_backend_load_all_from_path: { parameters: ["buffer"], result: "void" },
} as const;

export type LlamaSymbols = Deno.DynamicLibrary<typeof SYMBOLS>["symbols"];

/** The loaded libraries. */
export interface Llama {
  readonly symbols: LlamaSymbols;
  readonly libDir: string;
  readonly version: string;
  /** `built`: from the pinned bundle with RPC (build/llama/lib); `prebuilt`: the npm package's libraries, without RPC. */
  readonly build: LlamaBuild;
  close(): void;
}

/** The `@node-llama-cpp` package name for this machine. */
export function platformPackage(
  os: string = Deno.build.os,
  arch: string = Deno.build.arch,
): string {
  const a = arch === "aarch64" ? "arm64" : "x64";
  if (os === "darwin") return a === "arm64" ? "mac-arm64-metal" : "mac-x64";
  if (os === "windows") return `win-${a}`;
  return `linux-${a}`;
}

/** Which llama.cpp a library folder holds: see `Llama.build`. */
export type LlamaBuild = "built" | "prebuilt";

/**
 * Candidate library folders, most specific first: `ORCHARD_LLAMA_LIB_DIR`,
 * then the build from the pinned bundle when it is complete (its manifest is
 * written last) and of this package version, then the npm package's
 * prebuilt libraries.
 */
export function libraryDirCandidates(
  root: string,
  pkg = platformPackage(),
): string[] {
  const env = Deno.env.get("ORCHARD_LLAMA_LIB_DIR");
  const name = `@node-llama-cpp/${pkg}`;
  const built = join(root, "build", "llama", "lib"); // LLAMA_LIB_DIR under root
  return [
    ...(env ? [env] : []),
    // a build of another package version's source is stale: not used
    ...(readLlamaManifest(built)?.packageVersion === LLAMA_PACKAGE_VERSION
      ? [built]
      : []),
    join(
      root,
      "node_modules",
      ".deno",
      `@node-llama-cpp+${pkg}@${LLAMA_PACKAGE_VERSION}`,
      "node_modules",
      name,
      "bins",
      pkg,
    ),
    join(root, "node_modules", name, "bins", pkg),
  ];
}

const PROJECT_ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** Finds libllama and libggml in the first candidate folder that has them. */
export function findLibraries(
  root = PROJECT_ROOT,
): { dir: string; llama: string; ggml: string; build: LlamaBuild } {
  const tried: string[] = [];
  for (const dir of libraryDirCandidates(root)) {
    tried.push(dir);
    let names: string[];
    try {
      names = [...Deno.readDirSync(dir)].map((e) => e.name);
    } catch {
      continue;
    }
    const pick = (base: string) =>
      names.find((n) =>
        new RegExp(`^lib${base}(\\.metal)?(\\.v[0-9.]+)?\\.(so|dylib|dll)$`)
          .test(n)
      );
    const llama = pick("llama");
    const ggml = pick("ggml");
    if (llama && ggml) {
      const meta = join(dir, "..", "..", "package.json");
      try {
        const pkg = JSON.parse(Deno.readTextFileSync(meta));
        if (pkg.version !== LLAMA_PACKAGE_VERSION) {
          throw new Error(
            `Cannot use llama.cpp in ${dir}: package version is ${pkg.version}, the bindings need ${LLAMA_PACKAGE_VERSION}`,
          );
        }
      } catch (err) {
        if (!(err instanceof Deno.errors.NotFound)) throw err;
      }
      const build = readLlamaManifest(dir) ? "built" : "prebuilt";
      return { dir, llama: join(dir, llama), ggml: join(dir, ggml), build };
    }
  }
  throw new Error(
    `Cannot find llama.cpp libraries for ${platformPackage()} (run \`deno install\`; looked in ${
      tried.join(", ")
    })`,
  );
}

/** Encodes a NUL-terminated C string. */
export function cstr(s: string): Uint8Array<ArrayBuffer> {
  const b = new TextEncoder().encode(s);
  const out = new Uint8Array(b.length + 1);
  out.set(b);
  return out;
}

/** Reads a NUL-terminated C string, or null for a null pointer. */
export function readCString(p: Deno.PointerValue): string | null {
  return p ? Deno.UnsafePointerView.getCString(p) : null;
}

/**
 * Loads the libraries, loads every ggml backend in their folder once, and
 * checks version and struct layouts. Throws a readable error on mismatch.
 */
export function openLlama(root = PROJECT_ROOT): Llama {
  const found = findLibraries(root);
  let ggml: Deno.DynamicLibrary<typeof GGML_SYMBOLS>;
  let lib: Deno.DynamicLibrary<typeof SYMBOLS>;
  try {
    ggml = Deno.dlopen(found.ggml, GGML_SYMBOLS);
    lib = Deno.dlopen(found.llama, SYMBOLS);
  } catch (err) {
    throw new Error(
      `Cannot load llama.cpp from ${found.dir}: ${(err as Error).message}`,
    );
  }
  const s = lib.symbols;
  const version = readCString(s.llama_version()) ?? "";
  if (!version.startsWith(LLAMA_VERSION_PREFIX)) {
    lib.close();
    ggml.close();
    throw new Error(
      `Cannot use llama.cpp ${version} from ${found.dir}: the bindings are for ${LLAMA_VERSION_PREFIX}`,
    );
  }
  const problems = checkDefaults(s);
  if (problems.length) {
    lib.close();
    ggml.close();
    throw new Error(
      `Cannot use llama.cpp from ${found.dir}: default parameters do not read back as the bindings expect (${
        problems.join("; ")
      }); the library does not match include/llama.h of node-llama-cpp ${LLAMA_PACKAGE_VERSION}`,
    );
  }
  // The package's backends are loadable modules (GGML_BACKEND_DL); the
  // built ones are linked into libggml and registered already.
  if (found.build === "prebuilt") {
    ggml.symbols.ggml_backend_load_all_from_path(cstr(found.dir));
  }
  s.llama_backend_init();
  let closed = false;
  return {
    symbols: s,
    libDir: found.dir,
    version,
    build: found.build,
    close() {
      if (closed) return;
      closed = true;
      lib.close();
      ggml.close();
    },
  };
}

/** Compares the library's default parameters with the values the header documents. */
function checkDefaults(s: LlamaSymbols): string[] {
  const problems: string[] = [];
  const ctx = new DataView(s.llama_context_default_params().buffer);
  const expect = (what: string, got: number, want: number) => {
    if (got !== want) problems.push(`${what} is ${got}, expected ${want}`);
  };
  expect("n_ctx", ctx.getUint32(CP.n_ctx, true), 512);
  expect("n_batch", ctx.getUint32(CP.n_batch, true), 2048);
  expect("n_ubatch", ctx.getUint32(CP.n_ubatch, true), 512);
  expect("n_seq_max", ctx.getUint32(CP.n_seq_max, true), 1);
  expect("n_threads", ctx.getInt32(CP.n_threads, true), 4);
  expect("type_k", ctx.getInt32(CP.type_k, true), 1);
  expect("type_v", ctx.getInt32(CP.type_v, true), 1);
  expect("embeddings", ctx.getUint8(CP.embeddings), 0);
  expect("kv_unified", ctx.getUint8(CP.kv_unified), 0); // default read back; we set 1
  const model = new DataView(s.llama_model_default_params().buffer);
  expect("n_gpu_layers", model.getInt32(MP.n_gpu_layers, true), -1);
  expect("use_extra_bufts", model.getUint8(MP.use_extra_bufts), 1);
  return problems;
}
