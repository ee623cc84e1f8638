/**
 * A keep-alive HTTP/1.1 client for the gateway's calls to its nodes and a
 * node's calls to the engine it fronts.
 *
 * Written here, not taken from a library: Deno's `fetch` costs ~100 µs of
 * CPU a request more than this at 500 req/s (Request, Headers, AbortSignal
 * and stream objects, and its pool's task wake-ups: measured as a whole
 * proxy, 200–285 against 115–165 µs a request), and that was most of the
 * gateway's cost over a bare pass-through proxy; reading a stream through
 * `fetch`'s body cost a node ~200 µs more a stream. The npm clients
 * (undici, got, node-fetch) run on Deno's `node:net`/`node:http` layers,
 * slower still, and Deno's standard library has no HTTP client. The peers
 * are an Orchard node worker (`Deno.serve`, hyper) or an engine's server
 * (aiohttp, Python's http.server, cpp-httplib, Go's net/http, uvicorn), so
 * the subset needed is small: one request at a time per connection,
 * `content-length` request bodies, responses framed by `content-length`,
 * chunked encoding or the connection's end (HTTP/1.0 servers), 1xx
 * responses skipped, no redirects followed.
 *
 * Connections are pooled per origin and reused once a response was read
 * to its end; a request on a reused connection that the server closed
 * while idle (nothing of a response read yet) is sent again on a new
 * connection, once. Aborting the signal closes the connection.
 */

import { concat } from "./bytes.ts";
import {
  brokeOff,
  Connection,
  decoder,
  type Framing,
  framingOf,
  Http1Error,
  type Http1RequestInit,
  malformed,
  type Origin,
  readHead,
  readLine,
  requestBytes,
  tooLarge,
} from "./http1_wire.ts";

export { Http1Error, type Http1RequestInit };

/** Options of an Http1Client. */
export interface Http1ClientOptions {
  /** Idle connections kept per origin (default 256). */
  maxIdlePerOrigin?: number;
  /** An idle connection unused this long is closed (default 30 s). */
  idleTimeoutMs?: number;
  /** Largest response head accepted (default 64 KiB). */
  maxHeadBytes?: number;
}

/** A response's headers (names in lower case). */
export class Http1Headers {
  readonly #map: Map<string, string>;
  constructor(map: Map<string, string>) {
    this.#map = map;
  }
  /** The header's value (repeated headers joined by ", "), or null. */
  get(name: string): string | null {
    return this.#map.get(name.toLowerCase()) ?? null;
  }
}

/** A body's reader: the part of `ReadableStreamDefaultReader` that readers of bytes use. */
export interface ByteReader {
  read(): Promise<ReadableStreamReadResult<Uint8Array>>;
  cancel(reason?: unknown): Promise<void>;
}

/** A response; its body is read once, with `text()`, `body()` or `cancel()`. */
export class Http1Response {
  readonly status: number;
  readonly headers: Http1Headers;
  readonly #c: Connection;
  readonly #framing: Framing;
  readonly #reusable: boolean;
  readonly #done: (reuse: boolean) => void;
  readonly #signal: AbortSignal | undefined;
  #finished = false;
  #complete = false;
  #brokeOff = false;
  #used = false;

  constructor(
    c: Connection,
    status: number,
    headers: Http1Headers,
    framing: Framing,
    reusable: boolean,
    signal: AbortSignal | undefined,
    done: (reuse: boolean) => void,
  ) {
    this.#c = c;
    this.status = status;
    this.headers = headers;
    this.#framing = framing;
    this.#reusable = reusable;
    this.#signal = signal;
    this.#done = done;
    if (framing.kind === "none") this.#finish(true);
  }

  /** Whether the body was read to its end or cancelled. */
  get finished(): boolean {
    return this.#finished;
  }

  /** Whether the body was read to its end (not cancelled, not broken off). */
  get complete(): boolean {
    return this.#complete;
  }

  /** Whether reading the body failed (the connection closed or the framing was wrong), not by abort or `cancel()`. */
  get brokeOff(): boolean {
    return this.#brokeOff;
  }

  /** The whole body as text; rejects with Http1Error "too_large" past `max` bytes. */
  async text(max = Infinity): Promise<string> {
    this.#take();
    const f = this.#framing;
    if (f.kind === "none") return "";
    try {
      if (f.kind === "length") return await this.#textOfLength(f, max);
      const parts: Uint8Array[] = [];
      let size = 0;
      for (;;) {
        const part = await this.#next();
        if (part === null) break;
        size += part.length;
        if (size > max) throw tooLarge();
        parts.push(part);
      }
      return decoder.decode(concat(parts, size));
    } catch (e) {
      this.#fail();
      throw this.#why(e);
    }
  }

  /** The body as a byte stream (cancelling it closes the connection). */
  body(): ReadableStream<Uint8Array> {
    const reader = this.reader();
    return new ReadableStream<Uint8Array>({
      pull: async (ctl) => {
        try {
          const r = await reader.read();
          if (r.done) ctl.close();
          else ctl.enqueue(r.value);
        } catch (e) {
          ctl.error(e);
        }
      },
      cancel: () => reader.cancel(),
    }, { highWaterMark: 0 });
  }

  /**
   * The body's pieces with a stream reader's `read` and `cancel`, without
   * a ReadableStream under them: what an SSEReader reads. A stream costs a
   * promise chain and its controller per piece, which relays of short
   * streams paid per request. As with a stream, a read in progress when
   * `cancel` is called resolves as the end; `cancel` closes the
   * connection unless the body was read to its end.
   */
  reader(): ByteReader {
    this.#take();
    let cancelled = false;
    return {
      read: async () => {
        try {
          const value = cancelled ? null : await this.#next();
          return value === null
            ? { done: true, value: undefined }
            : { done: false, value };
        } catch (e) {
          if (cancelled) return { done: true, value: undefined };
          this.#fail();
          throw this.#why(e);
        }
      },
      cancel: () => {
        cancelled = true;
        this.cancel();
        return Promise.resolve();
      },
    };
  }

  /** Stops reading: the connection is closed unless the body was read to its end. */
  cancel(): void {
    if (this.#finished) return;
    this.#finish(false);
  }

  #fail(): void {
    if (!this.#finished && !this.#signal?.aborted) this.#brokeOff = true;
    this.cancel();
  }

  #take(): void {
    if (this.#used) throw new TypeError("Cannot read a response body twice");
    this.#used = true;
  }

  #finish(complete: boolean): void {
    if (this.#finished) return;
    this.#finished = true;
    this.#complete = complete;
    this.#done(complete && this.#reusable);
  }

  #why(e: unknown): unknown {
    if (this.#signal?.aborted) return this.#signal.reason;
    if (e instanceof Http1Error) return e;
    return new Http1Error("closed", "The response broke off", { cause: e });
  }

  async #textOfLength(
    f: { kind: "length"; left: number },
    max: number,
  ): Promise<string> {
    const c = this.#c;
    const len = f.left;
    if (len > max) throw tooLarge();
    if (c.end - c.start >= len) {
      // The usual case: the whole body came with the head.
      const s = decoder.decode(c.buf.subarray(c.start, c.start + len));
      c.start += len;
      f.left = 0;
      this.#finish(true);
      return s;
    }
    const out = new Uint8Array(len);
    let off = c.end - c.start;
    out.set(c.buf.subarray(c.start, c.end));
    c.start = c.end = 0;
    while (off < len) {
      const n = await c.readInto(out.subarray(off));
      if (n === null) throw brokeOff();
      off += n;
    }
    f.left = 0;
    this.#finish(true);
    return decoder.decode(out);
  }

  /** The next piece of the body (a copy), or null at its end. */
  async #next(): Promise<Uint8Array | null> {
    const f = this.#framing;
    const c = this.#c;
    if (this.#finished) return null;
    if (f.kind === "length") {
      if (f.left === 0) return this.#end();
      if (c.end === c.start && !await c.fill()) throw brokeOff();
      const n = Math.min(f.left, c.end - c.start);
      const part = c.buf.slice(c.start, c.start + n);
      c.start += n;
      f.left -= n;
      if (f.left === 0) this.#finish(true);
      return part;
    }
    if (f.kind === "close") {
      if (c.end === c.start && !await c.fill()) return this.#end();
      const part = c.buf.slice(c.start, c.end);
      c.start = c.end;
      return part;
    }
    if (f.kind !== "chunked") return this.#end();
    for (;;) {
      if (f.state === "end") return this.#end();
      if (f.state === "size") {
        const line = await readLine(c, 1024);
        const size = /^([0-9a-fA-F]{1,8})[ \t]*(;.*)?$/.exec(line);
        if (!size) throw malformed("a chunk size is malformed");
        f.left = parseInt(size[1]!, 16);
        if (f.left === 0) {
          // Trailers, up to the empty line.
          let lines = 0;
          while ((await readLine(c, 8192)) !== "") {
            if (++lines > 64) throw malformed("too many trailers");
          }
          f.state = "end";
          continue;
        }
        f.state = "data";
      }
      if (f.state === "data") {
        if (c.end === c.start && !await c.fill()) throw brokeOff();
        const n = Math.min(f.left, c.end - c.start);
        const part = c.buf.slice(c.start, c.start + n);
        c.start += n;
        f.left -= n;
        if (f.left === 0) f.state = "crlf";
        return part;
      }
      if ((await readLine(c, 2)) !== "") {
        throw malformed("a chunk does not end with CRLF");
      }
      f.state = "size";
    }
  }

  #end(): null {
    this.#finish(true);
    return null;
  }
}

/** Sends requests over pooled keep-alive connections. */
export class Http1Client {
  readonly #maxIdle: number;
  readonly #idleMs: number;
  readonly #maxHead: number;
  readonly #origins = new Map<string, Origin>();
  readonly #idle = new Map<string, Connection[]>();
  #sweep: ReturnType<typeof setInterval> | undefined;

  constructor(opts: Http1ClientOptions = {}) {
    const {
      maxIdlePerOrigin = 256,
      idleTimeoutMs = 30_000,
      maxHeadBytes = 64 * 1024,
    } = opts;
    if (!(idleTimeoutMs > 0)) {
      throw new RangeError(
        `Cannot create HTTP client: idleTimeoutMs must be > 0: current value is ${idleTimeoutMs}`,
      );
    }
    this.#maxIdle = maxIdlePerOrigin;
    this.#idleMs = idleTimeoutMs;
    this.#maxHead = maxHeadBytes;
  }

  /** Idle connections held now. */
  get idleConnections(): number {
    let n = 0;
    for (const list of this.#idle.values()) n += list.length;
    return n;
  }

  /**
   * Sends a request to `base` (an http(s) URL, its path a prefix) + `path`
   * and resolves with the response once its head arrived. Rejects with the
   * signal's reason when aborted, or with a connection error.
   */
  async request(
    base: string,
    path: string,
    init: Http1RequestInit = {},
  ): Promise<Http1Response> {
    const origin = this.#origin(base);
    const bytes = requestBytes(origin, path, init);
    const signal = init.signal;
    signal?.throwIfAborted();
    for (let attempt = 0;; attempt++) {
      const conn = (attempt === 0 ? this.#pooled(origin) : null) ??
        await this.#connect(origin, signal);
      const reused = conn.uses > 0;
      const received = conn.received;
      const onAbort = () => conn.close();
      signal?.addEventListener("abort", onAbort, { once: true });
      const release = (reuse: boolean) => {
        signal?.removeEventListener("abort", onAbort);
        if (reuse && !signal?.aborted) this.#release(conn);
        else conn.close();
      };
      try {
        await conn.write(bytes);
        init.onSent?.();
        return await this.#readHead(conn, signal, release);
      } catch (e) {
        release(false);
        if (signal?.aborted) throw signal.reason;
        // A reused connection the server closed while it sat idle: nothing of
        // a response came, so the request was not served; send it again.
        if (reused && attempt === 0 && conn.received === received) continue;
        throw e;
      }
    }
  }

  /** Closes every idle connection (they are opened again when needed). */
  closeIdle(): void {
    for (const list of this.#idle.values()) for (const c of list) c.close();
    this.#idle.clear();
    clearInterval(this.#sweep);
    this.#sweep = undefined;
  }

  #origin(base: string): Origin {
    let o = this.#origins.get(base);
    if (o) return o;
    const u = new URL(base);
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw new TypeError(
        `Cannot call ${u.protocol} URLs: only http and https`,
      );
    }
    const tls = u.protocol === "https:";
    o = {
      key: `${u.protocol}//${u.host}`,
      hostname: u.hostname.replace(/^\[(.*)\]$/, "$1"),
      port: u.port ? Number(u.port) : tls ? 443 : 80,
      tls,
      prefix: u.pathname.replace(/\/+$/, ""),
      host: u.host,
    };
    if (this.#origins.size >= 1024) this.#origins.clear();
    this.#origins.set(base, o);
    return o;
  }

  #pooled(origin: Origin): Connection | null {
    const list = this.#idle.get(origin.key);
    if (!list) return null;
    const now = performance.now();
    for (;;) {
      const c = list.pop();
      if (!c) return null;
      if (this.#fresh(c, now)) return c;
    }
  }

  #release(c: Connection): void {
    if (c.closed || c.start !== c.end) {
      c.close(); // bytes past the response: the server is not speaking HTTP/1.1 as we know it
      return;
    }
    let list = this.#idle.get(c.origin.key);
    if (!list) {
      list = [];
      this.#idle.set(c.origin.key, list);
    }
    if (list.length >= this.#maxIdle) {
      c.close();
      return;
    }
    c.idleSince = performance.now();
    list.push(c);
    if (this.#sweep === undefined) {
      this.#sweep = setInterval(() => this.#sweepIdle(), this.#idleMs / 2);
      // Idle connections alone do not keep the process alive.
      Deno.unrefTimer(this.#sweep as unknown as number);
    }
  }

  /** Whether an idle connection may still be used; closes it if not. */
  #fresh(c: Connection, now: number): boolean {
    if (now - c.idleSince < this.#idleMs && !c.closed) return true;
    c.close();
    return false;
  }

  #sweepIdle(): void {
    const now = performance.now();
    for (const [key, list] of this.#idle) {
      const keep = list.filter((c) => this.#fresh(c, now));
      if (keep.length) this.#idle.set(key, keep);
      else this.#idle.delete(key);
    }
    if (this.#idle.size === 0) {
      clearInterval(this.#sweep);
      this.#sweep = undefined;
    }
  }

  async #connect(origin: Origin, signal?: AbortSignal): Promise<Connection> {
    const { hostname, port } = origin;
    const conn = origin.tls
      ? await Deno.connectTls({ hostname, port })
      : await Deno.connect({ hostname, port, signal });
    if (signal?.aborted) {
      conn.close();
      throw signal.reason;
    }
    if ("setNoDelay" in conn) (conn as Deno.TcpConn).setNoDelay(true);
    return new Connection(origin, conn);
  }

  async #readHead(
    c: Connection,
    signal: AbortSignal | undefined,
    release: (reuse: boolean) => void,
  ): Promise<Http1Response> {
    for (;;) {
      const { minor, status, headers } = await readHead(c, this.#maxHead);
      if (status < 200) {
        if (status === 101) throw malformed("the server switched protocols");
        continue; // 100 Continue, 103 Early Hints: the real head follows
      }
      const framing = framingOf(status, headers);
      const connection = headers.get("connection")?.toLowerCase() ?? "";
      const reusable = minor === "1" && framing.kind !== "close" &&
        !/(^|,)\s*close\s*(,|$)/.test(connection);
      return new Http1Response(
        c,
        status,
        new Http1Headers(headers),
        framing,
        reusable,
        signal,
        release,
      );
    }
  }
}
