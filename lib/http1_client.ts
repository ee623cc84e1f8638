/**
 * A keep-alive HTTP/1.1 client for the gateway's calls to its nodes.
 *
 * Written here, not taken from a library: Deno's `fetch` costs ~100 µs of
 * CPU a request more than this at 500 req/s (Request, Headers, AbortSignal
 * and stream objects, and its pool's task wake-ups: measured as a whole
 * proxy, 200–285 against 115–165 µs a request), and that was most of the
 * gateway's cost over a bare pass-through proxy. The npm clients (undici,
 * got, node-fetch) run on Deno's `node:net`/`node:http` layers, slower
 * still, and Deno's standard library has no HTTP client. The peer is always
 * an Orchard node worker (`Deno.serve`, hyper), so the subset needed is
 * small: one request at a time per connection, `content-length` request
 * bodies, responses framed by `content-length`, chunked encoding or the
 * connection's end, 1xx responses skipped, no redirects followed.
 *
 * Connections are pooled per origin and reused once a response was read
 * to its end; a request on a reused connection that the node closed while
 * idle (nothing of a response read yet) is sent again on a new connection,
 * once. Aborting the signal closes the connection.
 */

/** A request's options. */
export interface Http1RequestInit {
  /** Default `POST`. */
  method?: string;
  /** Header names in lower case; values must not hold CR or LF. */
  headers?: Record<string, string>;
  body?: string;
  signal?: AbortSignal;
}

/** Options of an Http1Client. */
export interface Http1ClientOptions {
  /** Idle connections kept per origin (default 256). */
  maxIdlePerOrigin?: number;
  /** An idle connection unused this long is closed (default 30 s). */
  idleTimeoutMs?: number;
  /** Largest response head accepted (default 64 KiB). */
  maxHeadBytes?: number;
}

/** Why a response could not be read: malformed, too large, or broken off. */
export class Http1Error extends Error {
  readonly kind: "malformed" | "too_large" | "closed";
  constructor(
    kind: "malformed" | "too_large" | "closed",
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = "Http1Error";
    this.kind = kind;
  }
}

interface Origin {
  key: string;
  hostname: string;
  port: number;
  tls: boolean;
  /** The base URL's path without its trailing slash ("" for none). */
  prefix: string;
  /** `host:` header line. */
  host: string;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const CR = 13;
const LF = 10;
const READ_SIZE = 16 * 1024;
const SAFE_VALUE = /^[^\r\n\0]*$/;
const SAFE_NAME = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;
const SAFE_PATH = /^\/[^\s\0]*$/;

/** One TCP (or TLS) connection and its read buffer. */
class Connection {
  readonly origin: Origin;
  readonly #conn: Deno.Conn;
  #buf = new Uint8Array(READ_SIZE);
  /** Unread bytes are `#buf[start, end)`. */
  start = 0;
  end = 0;
  closed = false;
  /** Responses read on it so far (0: new, so not closed by the node while idle). */
  uses = 0;
  /** Bytes read on it so far. */
  received = 0;
  /** When it went back to the pool (performance.now()). */
  idleSince = 0;

  constructor(origin: Origin, conn: Deno.Conn) {
    this.origin = origin;
    this.#conn = conn;
  }

  get buf(): Uint8Array {
    return this.#buf;
  }

  async write(bytes: Uint8Array): Promise<void> {
    let off = 0;
    while (off < bytes.length) {
      off += await this.#conn.write(off ? bytes.subarray(off) : bytes);
    }
  }

  /** Reads more bytes after the unread ones; false at the connection's end. */
  async fill(): Promise<boolean> {
    if (this.start === this.end) this.start = this.end = 0;
    else if (this.#buf.length - this.end < READ_SIZE / 4) {
      // Little room left: move the unread bytes to the front, or grow.
      const live = this.end - this.start;
      if (live + READ_SIZE > this.#buf.length) {
        const next = new Uint8Array(
          Math.max(2 * this.#buf.length, live + READ_SIZE),
        );
        next.set(this.#buf.subarray(this.start, this.end));
        this.#buf = next;
      } else this.#buf.copyWithin(0, this.start, this.end);
      this.start = 0;
      this.end = live;
    }
    const n = await this.#conn.read(this.#buf.subarray(this.end));
    if (n === null) return false;
    this.end += n;
    this.received += n;
    return true;
  }

  /** Reads straight into `into` (after the buffered bytes were used). */
  async readInto(into: Uint8Array): Promise<number | null> {
    const n = await this.#conn.read(into);
    if (n !== null) this.received += n;
    return n;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    try {
      this.#conn.close();
    } catch { /* already closed */ }
  }
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

/** How a response body ends. */
type Framing =
  | { kind: "none" }
  | { kind: "length"; left: number }
  | { kind: "chunked"; left: number; state: "size" | "data" | "crlf" | "end" }
  | { kind: "close" };

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
      this.cancel();
      throw this.#why(e);
    }
  }

  /** The body as a byte stream (cancelling it closes the connection). */
  body(): ReadableStream<Uint8Array> {
    this.#take();
    return new ReadableStream<Uint8Array>({
      pull: async (ctl) => {
        try {
          const part = await this.#next();
          if (part === null) ctl.close();
          else ctl.enqueue(part);
        } catch (e) {
          this.cancel();
          ctl.error(this.#why(e));
        }
      },
      cancel: () => this.cancel(),
    }, { highWaterMark: 0 });
  }

  /** Stops reading: the connection is closed unless the body was read to its end. */
  cancel(): void {
    if (this.#finished) return;
    this.#finish(false);
  }

  #take(): void {
    if (this.#used) throw new TypeError("Cannot read a response body twice");
    this.#used = true;
  }

  #finish(complete: boolean): void {
    if (this.#finished) return;
    this.#finished = true;
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
        return await this.#readHead(conn, signal, release);
      } catch (e) {
        release(false);
        if (signal?.aborted) throw signal.reason;
        // A reused connection the node closed while it sat idle: nothing of
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
      c.close(); // bytes past the response: the node is not speaking HTTP/1.1 as we know it
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
      const end = await findHeadEnd(c, this.#maxHead);
      const head = decoder.decode(c.buf.subarray(c.start, end));
      c.start = end + 4;
      c.uses++;
      const lines = head.split("\r\n");
      const m = /^HTTP\/1\.([01]) ([1-5]\d\d)(?: .*)?$/.exec(lines[0]!);
      if (!m) throw malformed("the status line is malformed");
      const status = Number(m[2]);
      const headers = new Map<string, string>();
      for (let i = 1; i < lines.length; i++) {
        const line = lines[i]!;
        const colon = line.indexOf(":");
        if (colon <= 0) throw malformed("a header line is malformed");
        const name = line.slice(0, colon).trim().toLowerCase();
        const value = line.slice(colon + 1).trim();
        const had = headers.get(name);
        headers.set(name, had === undefined ? value : `${had}, ${value}`);
      }
      if (status < 200) {
        if (status === 101) throw malformed("the node switched protocols");
        continue; // 100 Continue, 103 Early Hints: the real head follows
      }
      const framing = framingOf(status, headers);
      const connection = headers.get("connection")?.toLowerCase() ?? "";
      const reusable = m[1] === "1" && framing.kind !== "close" &&
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

/** The bytes of a request: head and body in one buffer (one write). */
function requestBytes(
  origin: Origin,
  path: string,
  init: Http1RequestInit,
): Uint8Array {
  const method = init.method ?? "POST";
  if (!/^[A-Z]+$/.test(method)) {
    throw new TypeError(`Cannot send a request: method ${method} is invalid`);
  }
  if (!SAFE_PATH.test(path)) {
    throw new TypeError("Cannot send a request: the path is invalid");
  }
  const body = init.body === undefined ? null : encoder.encode(init.body);
  let head =
    `${method} ${origin.prefix}${path} HTTP/1.1\r\nhost: ${origin.host}\r\n`;
  for (const name in init.headers) {
    const value = init.headers[name]!;
    if (!SAFE_NAME.test(name) || !SAFE_VALUE.test(value)) {
      throw new TypeError(`Cannot send a request: header ${name} is invalid`);
    }
    if (name === "host" || name === "content-length") continue;
    head += `${name}: ${value}\r\n`;
  }
  if (body || method === "POST" || method === "PUT") {
    head += `content-length: ${body?.length ?? 0}\r\n`;
  }
  head += "\r\n";
  const h = encoder.encode(head);
  if (!body) return h;
  const out = new Uint8Array(h.length + body.length);
  out.set(h);
  out.set(body, h.length);
  return out;
}

/** How a response's body is framed (RFC 9112 §6.3). */
function framingOf(status: number, headers: Map<string, string>): Framing {
  if (status === 204 || status === 304) return { kind: "none" };
  const te = headers.get("transfer-encoding");
  if (te !== undefined) {
    return /(^|,)\s*chunked\s*$/i.test(te)
      ? { kind: "chunked", left: 0, state: "size" }
      : { kind: "close" };
  }
  const cl = headers.get("content-length");
  if (cl !== undefined) {
    const values = new Set(cl.split(",").map((v) => v.trim()));
    const [only] = values;
    if (values.size !== 1 || !/^\d{1,15}$/.test(only!)) {
      throw malformed("the content-length is invalid");
    }
    const left = Number(only);
    return left === 0 ? { kind: "none" } : { kind: "length", left };
  }
  return { kind: "close" };
}

/** The index of the CRLFCRLF ending the head in `c.buf`, reading until it came. */
async function findHeadEnd(c: Connection, max: number): Promise<number> {
  let from = c.start;
  for (;;) {
    const b = c.buf;
    for (let i = from; i + 3 < c.end; i++) {
      if (
        b[i] === CR && b[i + 1] === LF && b[i + 2] === CR && b[i + 3] === LF
      ) {
        if (i - c.start > max) break;
        return i;
      }
    }
    if (c.end - c.start > max) throw tooLarge("The response head is too large");
    const scanned = Math.max(c.start, c.end - 3) - c.start;
    if (!await c.fill()) throw brokeOff();
    from = c.start + scanned;
  }
}

/** Reads one CRLF-ended line (without it), of at most `max` bytes. */
async function readLine(c: Connection, max: number): Promise<string> {
  let from = c.start;
  for (;;) {
    const b = c.buf;
    for (let i = from; i + 1 < c.end; i++) {
      if (b[i] === CR && b[i + 1] === LF) {
        const line = decoder.decode(b.subarray(c.start, i));
        c.start = i + 2;
        return line;
      }
    }
    if (c.end - c.start > max + 2) throw malformed("a line is too long");
    const scanned = Math.max(c.start, c.end - 1) - c.start;
    if (!await c.fill()) throw brokeOff();
    from = c.start + scanned;
  }
}

function concat(parts: Uint8Array[], size: number): Uint8Array {
  if (parts.length === 1) return parts[0]!;
  const out = new Uint8Array(size);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

function malformed(what: string): Http1Error {
  return new Http1Error("malformed", `The response is malformed: ${what}`);
}

function tooLarge(message = "The response is too large"): Http1Error {
  return new Http1Error("too_large", message);
}

function brokeOff(): Http1Error {
  return new Http1Error(
    "closed",
    "The connection closed before the response ended",
  );
}
