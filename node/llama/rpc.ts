/**
 * ggml's RPC backend through FFI: a model's layers placed on another
 * machine's memory. Only llama.cpp built from the pinned bundle has it
 * (`Llama.build === "built"`, node/native/llama_build.ts); the prebuilt
 * package libraries do not.
 *
 * A client adds a server's devices with `ggml_backend_rpc_add_server`
 * (ggml-rpc.h) and lists them in `llama_model_params.devices` (a
 * NULL-terminated array; `model.ts` `LoadOptions.devices`), so llama.cpp
 * offloads layers to them exactly as to a local GPU. The server side is the
 * `ggml-rpc-server` program the same build produces (`rpcServerPath`).
 *
 * ggml-rpc aborts the whole process when it cannot connect to a server or
 * the handshake fails (`GGML_ABORT` in `rpc_dispatcher::start`), so
 * `rpcDevices` first checks the endpoint answers over TCP, and callers add
 * servers only in a process that may die for it (a model's child process).
 *
 * @module
 */
import { join } from "node:path";
import { readLlamaManifest } from "../native/llama_build.ts";
import { cstr, type Llama, readCString } from "./ffi.ts";

const P = "pointer" as const;

const RPC_SYMBOLS = {
  // ggml_backend_reg_t (const char * endpoint): NULL when the server has no device
  ggml_backend_rpc_add_server: {
    parameters: ["buffer"],
    result: P,
    nonblocking: true,
  },
} as const;

/** libggml: the registry of every loaded backend's devices. */
const GGML_SYMBOLS = {
  ggml_backend_dev_count: { parameters: [], result: "usize" },
  ggml_backend_dev_get: { parameters: ["usize"], result: P },
} as const;

const BASE_SYMBOLS = {
  // enum ggml_backend_dev_type: CPU 0, GPU 1, IGPU 2, ACCEL 3
  ggml_backend_dev_type: { parameters: [P], result: "i32" },
  ggml_backend_reg_dev_count: { parameters: [P], result: "usize" },
  ggml_backend_reg_dev_get: { parameters: [P, "usize"], result: P },
  ggml_backend_dev_name: { parameters: [P], result: P },
  ggml_backend_dev_description: { parameters: [P], result: P },
  // void (dev, size_t * free, size_t * total)
  ggml_backend_dev_memory: {
    parameters: [P, "buffer", "buffer"],
    result: "void",
  },
} as const;

/** One device an RPC server offers. */
export interface RpcDevice {
  /** The `ggml_backend_dev_t` to list in the model's devices. */
  readonly ptr: Deno.PointerObject;
  /** `RPC0`, `RPC1`, … (numbered in the order servers are added). */
  readonly name: string;
  /** The server's endpoint, `host:port`. */
  readonly endpoint: string;
  /** The server's free and total memory on that device, in bytes. */
  memory(): { freeBytes: number; totalBytes: number };
}

/** The RPC API of a loaded `built` llama.cpp. */
export interface Rpc {
  /** Connects to `host:port` and returns its devices (throws when it does not answer). */
  devices(endpoint: string): Promise<RpcDevice[]>;
  /**
   * This machine's GPU devices (Metal on a Mac; none on a CPU-only host,
   * where the head's layers stay on the CPU), with their free memory.
   */
  localGpus(): { ptr: Deno.PointerObject; freeBytes: number }[];
  close(): void;
}

function libFile(dir: string, base: string): string {
  const names = [...Deno.readDirSync(dir)].map((e) => e.name);
  const name = names.find((n) =>
    new RegExp(`^lib${base}\\.(so|dylib|dll)$`).test(n)
  );
  if (!name) throw new Error(`Cannot use RPC: no lib${base} in ${dir}`);
  return join(dir, name);
}

/** Whether `host:port` accepts a TCP connection within `timeoutMs`. */
async function answers(endpoint: string, timeoutMs: number): Promise<boolean> {
  const at = endpoint.lastIndexOf(":");
  const hostname = endpoint.slice(0, at).replace(/^\[|\]$/g, "");
  const port = Number(endpoint.slice(at + 1));
  if (at < 1 || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw new Error(
      `Cannot use RPC server ${endpoint}: expected host:port`,
    );
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const conn = await Promise.race([
      Deno.connect({ hostname, port }),
      new Promise<null>((resolve) => {
        timer = setTimeout(() => resolve(null), timeoutMs);
      }),
    ]);
    if (!conn) return false;
    conn.close();
    return true;
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Opens the RPC backend of a loaded llama.cpp. Throws when the libraries
 * are the prebuilt package's (they have no RPC backend).
 */
export function openRpc(llama: Llama): Rpc {
  if (llama.build !== "built") {
    throw new Error(
      `Cannot use RPC: llama.cpp from ${llama.libDir} is the prebuilt package, built without RPC (run \`deno task build:native\`)`,
    );
  }
  const rpc = Deno.dlopen(libFile(llama.libDir, "ggml-rpc"), RPC_SYMBOLS);
  const base = Deno.dlopen(libFile(llama.libDir, "ggml-base"), BASE_SYMBOLS);
  const ggml = Deno.dlopen(libFile(llama.libDir, "ggml"), GGML_SYMBOLS);
  const b = base.symbols;
  let closed = false;
  return {
    async devices(endpoint: string): Promise<RpcDevice[]> {
      if (!await answers(endpoint, 5000)) {
        throw new Error(
          `Cannot use RPC server ${endpoint}: it does not answer`,
        );
      }
      const reg = await rpc.symbols.ggml_backend_rpc_add_server(cstr(endpoint));
      if (!reg) {
        throw new Error(`Cannot use RPC server ${endpoint}: it has no device`);
      }
      const out: RpcDevice[] = [];
      const n = Number(b.ggml_backend_reg_dev_count(reg));
      for (let i = 0; i < n; i++) {
        const ptr = b.ggml_backend_reg_dev_get(reg, BigInt(i));
        if (!ptr) continue;
        out.push({
          ptr,
          endpoint: readCString(b.ggml_backend_dev_description(ptr)) ??
            endpoint,
          name: readCString(b.ggml_backend_dev_name(ptr)) ?? `RPC?`,
          memory() {
            const free = new BigUint64Array(1), total = new BigUint64Array(1);
            b.ggml_backend_dev_memory(
              ptr,
              new Uint8Array(free.buffer),
              new Uint8Array(total.buffer),
            );
            return {
              freeBytes: Number(free[0]),
              totalBytes: Number(total[0]),
            };
          },
        });
      }
      return out;
    },
    localGpus() {
      const out: { ptr: Deno.PointerObject; freeBytes: number }[] = [];
      const n = Number(ggml.symbols.ggml_backend_dev_count());
      for (let i = 0; i < n; i++) {
        const ptr = ggml.symbols.ggml_backend_dev_get(BigInt(i));
        if (!ptr) continue;
        const type = b.ggml_backend_dev_type(ptr);
        if (type !== 1 && type !== 2) continue;
        const name = readCString(b.ggml_backend_dev_name(ptr)) ?? "";
        if (name.startsWith("RPC")) continue;
        const free = new BigUint64Array(1), total = new BigUint64Array(1);
        b.ggml_backend_dev_memory(
          ptr,
          new Uint8Array(free.buffer),
          new Uint8Array(total.buffer),
        );
        out.push({ ptr, freeBytes: Number(free[0]) });
      }
      return out;
    },
    close() {
      if (closed) return;
      closed = true;
      rpc.close();
      base.close();
      ggml.close();
    },
  };
}

/** The `ggml-rpc-server` program of a built llama.cpp folder, or null when there is none. */
export function rpcServerPath(libDir: string): string | null {
  const m = readLlamaManifest(libDir);
  if (!m) return null;
  const path = join(libDir, m.rpcServer);
  try {
    return Deno.statSync(path).isFile ? path : null;
  } catch {
    return null;
  }
}

/**
 * How a span's layers are spread: the shares per member (head first), from
 * the admin's split or else the members' free memory, and how many of the
 * `layers` the head keeps. Throws on a split of the wrong length or all
 * zeros.
 */
export function planSplit(
  layers: number,
  freeBytes: number[],
  split: number[] | null,
): { shares: number[]; headLayers: number } {
  const raw = split ?? freeBytes.map((b) => Math.max(0, b));
  if (raw.length !== freeBytes.length) {
    throw new Error(
      `Cannot split the model: the split gives ${raw.length} shares for ${freeBytes.length} members (head first)`,
    );
  }
  const sum = raw.reduce((a, b) => a + b, 0);
  if (!(sum > 0)) {
    throw new Error("Cannot split the model: every share is zero");
  }
  const shares = raw.map((x) => x / sum);
  return { shares, headLayers: Math.round(layers * shares[0]!) };
}
