/**
 * The HTTP/1.1 wire format of lib/http1_client.ts: a connection and its
 * read buffer, the bytes of a request, and reading a response's head, body
 * framing and lines (RFC 9112), with the errors they raise.
 */

/** A request's options. */
export interface Http1RequestInit {
  /** Default `POST`. */
  method?: string;
  /** Header names in lower case; values must not hold CR or LF. */
  headers?: Record<string, string>;
  body?: string;
  signal?: AbortSignal;
  /** Called once the request is written to a connection (its response not read yet). */
  onSent?: () => void;
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

/** Where requests to one base URL go (parsed once per base URL). */
export interface Origin {
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
export const decoder = new TextDecoder();
const CR = 13;
const LF = 10;
const READ_SIZE = 16 * 1024;
const SAFE_VALUE = /^[^\r\n\0]*$/;
const SAFE_NAME = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;
const SAFE_PATH = /^\/[^\s\0]*$/;

/** One TCP (or TLS) connection and its read buffer. */
export class Connection {
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

/** How a response body ends. */
export type Framing =
  | { kind: "none" }
  | { kind: "length"; left: number }
  | { kind: "chunked"; left: number; state: "size" | "data" | "crlf" | "end" }
  | { kind: "close" };

/**
 * Reads a response head off `c` (at most `max` bytes): the HTTP/1.x minor
 * version, the status and the headers (names in lower case, repeated ones
 * joined by ", ").
 */
export async function readHead(
  c: Connection,
  max: number,
): Promise<{ minor: string; status: number; headers: Map<string, string> }> {
  const end = await findHeadEnd(c, max);
  const head = decoder.decode(c.buf.subarray(c.start, end));
  c.start = end + 4;
  c.uses++;
  const lines = head.split("\r\n");
  const m = /^HTTP\/1\.([01]) ([1-5]\d\d)(?: .*)?$/.exec(lines[0]!);
  if (!m) throw malformed("the status line is malformed");
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
  return { minor: m[1]!, status: Number(m[2]), headers };
}

/** The bytes of a request: head and body in one buffer (one write). */
export function requestBytes(
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
export function framingOf(
  status: number,
  headers: Map<string, string>,
): Framing {
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
export async function readLine(c: Connection, max: number): Promise<string> {
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

export function malformed(what: string): Http1Error {
  return new Http1Error("malformed", `The response is malformed: ${what}`);
}

export function tooLarge(message = "The response is too large"): Http1Error {
  return new Http1Error("too_large", message);
}

export function brokeOff(): Http1Error {
  return new Http1Error(
    "closed",
    "The connection closed before the response ended",
  );
}
