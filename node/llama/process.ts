/**
 * One model's child process, seen from the engine: spawn and load, send
 * requests, route each event to its request, and fail everything in flight
 * with a clear error if the process dies (llama.cpp aborts on some inputs).
 */
import { fileURLToPath } from "node:url";
import { log } from "../../lib/log.ts";
import type { LlamaBuild } from "./ffi.ts";
import type {
  ChildEvent,
  ChildRequest,
  LoadedModel,
  RpcLoad,
} from "./protocol.ts";

const CHILD = fileURLToPath(new URL("./child.ts", import.meta.url));

/** Events of one request (everything but ready/fatal). */
export type RequestEvent = Exclude<
  ChildEvent,
  { ev: "ready" } | { ev: "fatal" }
>;

/** Options of `ModelProcess.spawn`. */
export interface ProcessOptions {
  path: string;
  ctxPerSeq: number;
  slots: number;
  threads: number;
  batch: number;
  /** Host memory for prefixes evicted from slots, bytes (prefix_store.ts; 0: none). */
  prefixCacheBytes?: number;
  loadTimeoutMs?: number;
  /** Load across RPC servers (a span's head): see protocol.ts RpcLoad. */
  rpc?: RpcLoad;
  /** Environment for the child (e.g. `GGML_RPC_NO_RDMA`). */
  env?: Record<string, string>;
}

/** Runs `child.ts --check`: loads the libraries and checks the ABI without a model. */
export async function checkLibraries(): Promise<
  { version: string; libDir: string; build: LlamaBuild }
> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-ffi",
      "--allow-read",
      "--allow-env",
      CHILD,
      "--check",
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim().split("\n").pop() ??
    "";
  try {
    const res = JSON.parse(text);
    if (res.ok) {
      return { version: res.version, libDir: res.libDir, build: res.build };
    }
    throw new Error(res.message);
  } catch (err) {
    if (err instanceof SyntaxError) {
      const tail = new TextDecoder().decode(out.stderr).slice(-500);
      throw new Error(`Cannot start llama.cpp (exit ${out.code}): ${tail}`);
    }
    throw err;
  }
}

export class ModelProcess {
  readonly ready: Promise<LoadedModel>;
  /** True once `kill()` was called: the exit that follows is not a crash. */
  expectedExit = false;
  #child: Deno.ChildProcess;
  #writer: WritableStreamDefaultWriter<Uint8Array>;
  #listeners = new Map<string, (e: RequestEvent) => void>();
  #stderr = "";
  #exited = false;
  #onExit: (reason: string) => void;

  private constructor(opts: ProcessOptions, onExit: (reason: string) => void) {
    this.#onExit = onExit;
    this.#child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-ffi",
        "--allow-read",
        "--allow-env",
        // a span's head checks its workers answer before ggml-rpc connects
        ...(opts.rpc ? ["--allow-net", "--allow-sys=systemMemoryInfo"] : []),
        CHILD,
      ],
      ...(opts.env ? { env: opts.env } : {}),
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#writer = this.#child.stdin.getWriter();
    let resolveReady!: (m: LoadedModel) => void;
    let rejectReady!: (e: Error) => void;
    this.ready = new Promise((res, rej) => {
      resolveReady = res;
      rejectReady = rej;
    });
    this.ready.catch(() => {});
    this.#collectStderr();
    this.#readEvents(resolveReady, rejectReady);
    const timeout = setTimeout(() => {
      rejectReady(
        new Error(
          `Cannot load ${opts.path}: no answer within ${
            opts.loadTimeoutMs ?? 120_000
          } ms`,
        ),
      );
      this.kill();
    }, opts.loadTimeoutMs ?? 120_000);
    this.ready.finally(() => clearTimeout(timeout)).catch(() => {});
    this.#child.status.then((st) => {
      this.#exited = true;
      const why = st.signal ? `signal ${st.signal}` : `exit code ${st.code}`;
      rejectReady(
        new Error(
          `Cannot load ${opts.path}: the model process ended (${why}) ${this.stderrTail()}`,
        ),
      );
      const reason =
        `The model process ended unexpectedly (${why}); it restarts on the next request`;
      for (const [id, fn] of this.#listeners) {
        fn({
          ev: "error",
          id,
          status: 503,
          code: "engine_restarting",
          message: reason,
        });
      }
      this.#listeners.clear();
      this.#onExit(why);
    });
    const { loadTimeoutMs: _t, env: _e, ...load } = opts;
    this.#send({ op: "load", ...load });
  }

  /** Starts a child process and loads the model. */
  static spawn(
    opts: ProcessOptions,
    onExit: (reason: string) => void = () => {},
  ): ModelProcess {
    return new ModelProcess(opts, onExit);
  }

  get alive(): boolean {
    return !this.#exited;
  }

  get pid(): number {
    return this.#child.pid;
  }

  /** The last lines the child wrote to stderr (llama.cpp's log), for diagnostics. */
  stderrTail(): string {
    return this.#stderr.slice(-800);
  }

  /** Sends a request; `on` receives its events until done or error. */
  request(
    req: Exclude<ChildRequest, { op: "load" } | { op: "cancel" }>,
    on: (e: RequestEvent) => void,
  ) {
    if (this.#exited) {
      on({
        ev: "error",
        id: req.id,
        status: 503,
        code: "engine_restarting",
        message: "The model process is restarting",
      });
      return;
    }
    this.#listeners.set(req.id, on);
    this.#send(req);
  }

  /** Asks the child to stop a generation; it answers with a final "done". */
  cancel(id: string) {
    if (this.#listeners.has(id)) this.#send({ op: "cancel", id });
  }

  /** Ends the process (idempotent); pending requests get an error. */
  kill() {
    this.expectedExit = true;
    if (this.#exited) return;
    try {
      this.#child.kill("SIGKILL");
    } catch { /* already gone */ }
  }

  /** Waits for the process to end. */
  async closed(): Promise<void> {
    await this.#child.status;
  }

  #send(req: ChildRequest) {
    this.#writer.write(new TextEncoder().encode(JSON.stringify(req) + "\n"))
      .catch(() => {});
  }

  async #collectStderr() {
    const dec = new TextDecoder();
    try {
      for await (const chunk of this.#child.stderr) {
        this.#stderr = (this.#stderr + dec.decode(chunk, { stream: true }))
          .slice(-8192);
      }
    } catch { /* process gone */ }
  }

  async #readEvents(ready: (m: LoadedModel) => void, fail: (e: Error) => void) {
    const dec = new TextDecoder();
    let buf = "";
    try {
      for await (const chunk of this.#child.stdout) {
        buf += dec.decode(chunk, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (line) this.#dispatch(JSON.parse(line) as ChildEvent, ready, fail);
        }
      }
    } catch (err) {
      log.warn("llama child output unreadable", { error: String(err) });
      this.kill();
    }
  }

  #dispatch(
    e: ChildEvent,
    ready: (m: LoadedModel) => void,
    fail: (e: Error) => void,
  ) {
    if (e.ev === "ready") return ready(e.model);
    if (e.ev === "fatal") return fail(new Error(e.message));
    const fn = this.#listeners.get(e.id);
    if (!fn) return;
    if (
      e.ev === "done" || e.ev === "error" || e.ev === "embedding" ||
      e.ev === "count"
    ) {
      this.#listeners.delete(e.id);
    }
    fn(e);
  }
}
