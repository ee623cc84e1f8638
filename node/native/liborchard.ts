/**
 * The only Deno.dlopen of liborchard: symbol table, explicit loading with an
 * ABI version check, and a handle class for the library.
 *
 * @module
 */
import { nativePaths } from "./build.ts";

/** ABI version this binding was written against (ORCH_ABI_VERSION in orchard.h). */
export const EXPECTED_ABI_VERSION = 1;

/** Status codes of orchard.h (`orch_status`). */
export const OrchStatus = {
  OK: 0,
  INVALID_ARG: -1,
  BUFFER_TOO_SMALL: -2,
  NO_MEMORY: -3,
  TIMEOUT: -4,
  CANCELLED: -5,
  UNAVAILABLE: -6,
  IO: -7,
  AUTH: -8,
  PROTOCOL: -9,
  BUSY: -10,
  STATE: -11,
  INTERNAL: -12,
} as const;

/** Probe flags of orchard.h. */
export const ProbeFlags = { DEFAULT: 0, SKIP_RDMA: 1, SKIP_GPU: 2 } as const;

const symbols = {
  orch_abi_version: { parameters: [], result: "u32" },
  orch_version: { parameters: [], result: "pointer" /* const char* */ },
  orch_status_str: {
    parameters: ["i32" /* int32_t status */],
    result: "pointer", /* const char* (static) */
  },
  orch_free: { parameters: ["pointer" /* void* */], result: "void" },
  orch_json_escape: {
    parameters: [
      "buffer", /* const char* in (NUL-terminated) */
      "buffer", /* char* out (caller-owned) */
      "usize", /* size_t cap */
      "buffer", /* size_t* needed */
    ],
    result: "i32", /* orch_status */
  },
  orch_probe_json: {
    parameters: ["u32", /* uint32_t flags */ "u32" /* uint32_t timeout_ms */],
    result: "pointer", /* char* (caller frees with orch_free) */
    nonblocking: true,
  },
} as const satisfies Deno.ForeignLibraryInterface;

type Symbols = Deno.DynamicLibrary<typeof symbols>["symbols"];

/** Path of liborchard: env ORCHARD_LIBORCHARD, else the build folder. */
export function liborchardPath(): string {
  return Deno.env.get("ORCHARD_LIBORCHARD") || nativePaths.lib;
}

const encoder = new TextEncoder();

function cstring(text: string): Uint8Array<ArrayBuffer> {
  return encoder.encode(text + "\0") as Uint8Array<ArrayBuffer>;
}

/** An open liborchard; close() (or `using`) releases it. */
export class Liborchard {
  #lib: Deno.DynamicLibrary<typeof symbols> | null;
  #pending = 0;
  #closing = false;
  readonly path: string;
  readonly version: string;

  private constructor(lib: Deno.DynamicLibrary<typeof symbols>, path: string) {
    this.#lib = lib;
    this.path = path;
    this.version = Deno.UnsafePointerView.getCString(
      lib.symbols.orch_version()!,
    );
  }

  /**
   * Opens liborchard at `path` (default liborchardPath()) and refuses a
   * library whose ABI version differs from EXPECTED_ABI_VERSION.
   */
  static open(path: string = liborchardPath()): Liborchard {
    let lib: Deno.DynamicLibrary<typeof symbols>;
    try {
      lib = Deno.dlopen(path, symbols);
    } catch (cause) {
      throw new Error("Cannot load liborchard", { cause });
    }
    const abi = lib.symbols.orch_abi_version();
    if (abi !== EXPECTED_ABI_VERSION) {
      lib.close();
      throw new Error(
        `Cannot use liborchard at ${path}: ABI version is ${abi}, this Orchard expects ${EXPECTED_ABI_VERSION}; rebuild it with \`deno task build:native\``,
      );
    }
    return new Liborchard(lib, path);
  }

  get #symbols(): Symbols {
    if (!this.#lib || this.#closing) {
      throw new Error("Cannot use liborchard: it is closed");
    }
    return this.#lib.symbols;
  }

  /** ABI version reported by the loaded library. */
  abiVersion(): number {
    return this.#symbols.orch_abi_version();
  }

  /** English text of a status code. */
  statusString(status: number): string {
    return Deno.UnsafePointerView.getCString(
      this.#symbols.orch_status_str(status)!,
    );
  }

  /** JSON-escapes text with the library's emitter (caller-owned buffer, grown once if needed). */
  jsonEscape(text: string): string {
    const input = cstring(text);
    const needed = new BigUint64Array(1);
    let out = new Uint8Array(64);
    let rc = this.#symbols.orch_json_escape(
      input,
      out,
      BigInt(out.length),
      needed,
    );
    if (rc === OrchStatus.BUFFER_TOO_SMALL) {
      out = new Uint8Array(Number(needed[0]));
      rc = this.#symbols.orch_json_escape(
        input,
        out,
        BigInt(out.length),
        needed,
      );
    }
    if (rc !== OrchStatus.OK) {
      throw new Error(`Cannot escape JSON: ${this.statusString(rc)}`);
    }
    return new TextDecoder().decode(out.subarray(0, Number(needed[0]) - 1));
  }

  /** Runs orch_probe_json off the event loop and returns the raw JSON text. */
  async probeJson(flags = 0, timeoutMs = 5000): Promise<string> {
    const syms = this.#symbols;
    this.#pending++;
    try {
      const ptr = await syms.orch_probe_json(flags, timeoutMs);
      if (ptr === null) {
        throw new Error("Cannot probe: liborchard ran out of memory");
      }
      try {
        return Deno.UnsafePointerView.getCString(ptr);
      } finally {
        syms.orch_free(ptr);
      }
    } finally {
      if (--this.#pending === 0 && this.#closing) this.#unload();
    }
  }

  #unload(): void {
    this.#lib?.close();
    this.#lib = null;
  }

  /**
   * Unloads the library; safe to call more than once. With a call still in
   * flight the unload waits for it to settle.
   */
  close(): void {
    this.#closing = true;
    if (this.#pending === 0) this.#unload();
  }

  /** Same as close(), for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
}
