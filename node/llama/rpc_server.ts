/**
 * The worker role of a spanning placement: this node lends its memory to
 * another node's model by running ggml's RPC server (the `ggml-rpc-server`
 * program the pinned llama.cpp build produces, rpc.ts `rpcServerPath`) in
 * a child process, for one placement at a time.
 *
 * Who may reach it: ggml-rpc has no authentication (llama.cpp's README
 * calls it insecure on an open network), so the server exists only while
 * the gateway places this node as a worker, binds only to the address that
 * faces the head (the Thunderbolt link's own address from the link test,
 * else the node's advertised address; never 0.0.0.0), on a port chosen
 * afresh for each start, and stops when the placement ends, when the head
 * goes offline, or when this node loses the gateway (no heartbeat answer).
 *
 * @module
 */
import { log } from "../../lib/log.ts";

/** Where to run the server. */
export interface RpcServerSpec {
  /** The instance it serves (`rpc:<placement id>`). */
  instance: string;
  /** The head-facing address to bind to (never a wildcard). */
  bind: string;
  /** TCP only (`GGML_RPC_NO_RDMA`), or let ggml-rpc negotiate RDMA. */
  transport: "rdma" | "tcp";
}

/** A running `ggml-rpc-server`, or one starting. */
export class RpcServerProcess {
  readonly spec: RpcServerSpec;
  /** `host:port` it listens on. */
  readonly endpoint: string;
  #child: Deno.ChildProcess;
  #stdin: WritableStreamDefaultWriter<Uint8Array>;
  #serverPid: number | null = null;
  #exited = false;
  #stderr = "";
  readonly ready: Promise<void>;

  private constructor(
    program: string,
    spec: RpcServerSpec,
    port: number,
    threads: number,
  ) {
    this.spec = spec;
    const host = spec.bind.includes(":") ? `[${spec.bind}]` : spec.bind;
    this.endpoint = `${host}:${port}`;
    // The server runs under a small shell that holds a pipe from this
    // node: when the node dies (even SIGKILL) the pipe closes and the shell
    // ends the server, so no server outlives the node that was placed.
    this.#child = new Deno.Command("/bin/sh", {
      args: [
        "-c",
        `"$0" "$@" </dev/null & p=$!; echo "pid $p"; read _; kill $p 2>/dev/null; wait $p`,
        program,
        "-H",
        spec.bind,
        "-p",
        String(port),
        "-t",
        String(threads),
      ],
      env: spec.transport === "tcp" ? { GGML_RPC_NO_RDMA: "1" } : {},
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#stdin = this.#child.stdin.getWriter();
    this.#drain(this.#child.stdout);
    this.#drain(this.#child.stderr);
    this.#child.status.then(() => this.#exited = true);
    this.ready = this.#listening(port);
    this.ready.catch(() => {});
  }

  /**
   * Starts the server bound to `spec.bind` on a free port. Throws when the
   * address is a wildcard or not one of this machine's.
   */
  static start(
    program: string,
    spec: RpcServerSpec,
    threads: number,
  ): RpcServerProcess {
    if (["0.0.0.0", "::", "", "*"].includes(spec.bind)) {
      throw new Error(
        `Cannot start the RPC server on ${spec.bind}: it binds only to the address facing the head`,
      );
    }
    let port: number;
    try {
      const l = Deno.listen({ hostname: spec.bind, port: 0 });
      port = (l.addr as Deno.NetAddr).port;
      l.close();
    } catch (err) {
      throw new Error(
        `Cannot start the RPC server on ${spec.bind}: it is not an address of this machine (${
          (err as Error).message
        })`,
      );
    }
    return new RpcServerProcess(program, spec, port, threads);
  }

  /** The `ggml-rpc-server` process id (null until it started). */
  get pid(): number | null {
    return this.#serverPid;
  }

  get alive(): boolean {
    return !this.#exited;
  }

  /** The server's last output, for logs. */
  outputTail(): string {
    return this.#stderr.slice(-2000);
  }

  /** Stops the server (SIGTERM, then SIGKILL after 3 s) and waits for it. */
  async stop(): Promise<void> {
    if (this.#exited) return;
    // closing the pipe makes the shell end the server and wait for it
    await this.#stdin.close().catch(() => {});
    const pid = this.#serverPid;
    const t = setTimeout(() => {
      try {
        if (pid) Deno.kill(pid, "SIGKILL");
        this.#child.kill("SIGKILL");
      } catch { /* gone */ }
    }, 3000);
    await this.#child.status;
    clearTimeout(t);
  }

  async #drain(stream: ReadableStream<Uint8Array>) {
    const dec = new TextDecoder();
    try {
      for await (const c of stream) {
        this.#stderr = (this.#stderr + dec.decode(c, { stream: true }))
          .slice(-8192);
        if (this.#serverPid === null) {
          const m = /^pid (\d+)$/m.exec(this.#stderr);
          if (m) this.#serverPid = Number(m[1]);
        }
      }
    } catch { /* closed */ }
  }

  async #listening(port: number): Promise<void> {
    const until = Date.now() + 20_000;
    const hostname = this.spec.bind;
    while (Date.now() < until && !this.#exited) {
      try {
        // a connection that closes at once is harmless: the server serves
        // the next client
        (await Deno.connect({ hostname, port })).close();
        log.info("RPC server listening", {
          instance: this.spec.instance,
          endpoint: this.endpoint,
          transport: this.spec.transport,
          pid: this.pid,
        });
        return;
      } catch {
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    await this.stop();
    throw new Error(
      `Cannot start the RPC server on ${this.endpoint}: ${
        this.#exited ? "it exited" : "it did not listen"
      }: ${this.outputTail()}`,
    );
  }
}
