/**
 * Server-sent events, the one implementation for the whole project: a
 * streaming parser that treats its input as untrusted (line and event sizes
 * capped), a pull reader over a byte stream whose reads can race a timeout,
 * and the frame encoders.
 *
 * Parsing follows the HTML standard's event-stream rules: lines end with
 * `\r\n`, `\n` or `\r` (also when split across chunks); `:` lines are
 * comments; `data:` lines of one event are joined with "\n"; `event:` names
 * the event ("message" when absent); `id:` and `retry:` are ignored. Unlike
 * the standard, an event still open when the stream ends is delivered
 * (servers that omit the last blank line).
 *
 * Caps (defaults 1 MiB each, `SSE_MAX_LINE` and `SSE_MAX_EVENT`) count
 * decoded UTF-16 code units, which for ASCII (all JSON that servers send,
 * in practice) are bytes: a line longer than `maxLine` (complete or still
 * arriving) and an event whose data passes `maxEvent` end the stream with
 * an `SSEError` of kind "too_large". Taking events after each chunk (as
 * `SSEReader` does), the parser so holds at most one line plus one chunk,
 * and one event's data.
 *
 * This module uses no Deno API (it also runs in the browser).
 */

/** Default cap on one line, in code units (1 MiB). */
export const SSE_MAX_LINE = 1 << 20;
/** Default cap on one event's data, in code units (1 MiB). */
export const SSE_MAX_EVENT = 1 << 20;

/** Why reading an event stream stopped early. */
export class SSEError extends Error {
  readonly kind: "timeout" | "too_large" | "closed";
  constructor(
    kind: "timeout" | "too_large" | "closed",
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = "SSEError";
    this.kind = kind;
  }
}

/** Options of `SSEParser` and `SSEReader`. */
export interface SSEOptions {
  /** Longest line accepted (default `SSE_MAX_LINE`). */
  maxLine?: number;
  /** Most data one event may carry (default `SSE_MAX_EVENT`). */
  maxEvent?: number;
  /** Who sends the stream, as error messages name it (default "server"). */
  peer?: string;
  /** Called with each comment's text (after the ":"); comments are dropped otherwise. */
  onComment?: (text: string) => void;
}

const STREAM: TextDecodeOptions = { stream: true };
const CR_LF = /\r\n?/g;

/**
 * A push parser: `push` bytes (or `pushText` text) as they arrive, then
 * call `next` until it returns null; `end` when the stream ends. Allocates
 * per event only the event's data (one string per `data:` line).
 */
export class SSEParser {
  readonly #decoder = new TextDecoder();
  readonly #maxLine: number;
  readonly #maxEvent: number;
  readonly #peer: string;
  readonly #onComment: ((text: string) => void) | undefined;
  /** Text received and not yet parsed from `#pos` on. */
  #buf = "";
  #pos = 0;
  /** The last text pushed ended with "\r" (already read as a line end): a "\n" opening the next is its pair. */
  #cr = false;
  #data: string | null = null;
  #dataLen = 0;
  #type: string | null = null;
  #ended = false;
  /** The type of the event `next` returned last ("message" unless named). */
  event = "message";

  constructor(opts: SSEOptions = {}) {
    this.#maxLine = opts.maxLine ?? SSE_MAX_LINE;
    this.#maxEvent = opts.maxEvent ?? SSE_MAX_EVENT;
    this.#peer = opts.peer ?? "server";
    this.#onComment = opts.onComment;
  }

  /** Adds bytes (UTF-8, split anywhere). */
  push(chunk: Uint8Array): void {
    this.pushText(this.#decoder.decode(chunk, STREAM));
  }

  /** Adds decoded text. */
  pushText(text: string): void {
    if (this.#cr && text.length > 0) {
      this.#cr = false;
      if (text.charCodeAt(0) === 10) text = text.slice(1);
    }
    if (text.indexOf("\r") >= 0) {
      this.#cr = text.charCodeAt(text.length - 1) === 13;
      text = text.replace(CR_LF, "\n");
    }
    if (this.#pos === this.#buf.length) {
      this.#buf = text;
      this.#pos = 0;
    } else if (this.#pos > 0) {
      this.#buf = this.#buf.slice(this.#pos) + text;
      this.#pos = 0;
    } else this.#buf += text;
  }

  /** Marks the end of the stream: a last line and event still open are completed. */
  end(): void {
    if (this.#ended) return;
    this.pushText(this.#decoder.decode());
    this.#cr = false;
    this.pushText("\n\n");
    this.#ended = true;
  }

  /** Whether `end` was called and every event has been taken. */
  get done(): boolean {
    return this.#ended && this.#pos >= this.#buf.length;
  }

  /** The next complete event's data (its type in `event`), or null until more text arrives. */
  next(): string | null {
    const buf = this.#buf;
    let pos = this.#pos;
    try {
      for (;;) {
        const nl = buf.indexOf("\n", pos);
        if (nl < 0) {
          if (buf.length - pos > this.#maxLine) throw this.#tooLarge("line");
          return null;
        }
        if (nl === pos) {
          pos++;
          if (this.#data === null) {
            this.#type = null;
            continue;
          }
          const data = this.#data;
          this.event = this.#type ?? "message";
          this.#data = null;
          this.#dataLen = 0;
          this.#type = null;
          return data;
        }
        if (nl - pos > this.#maxLine) throw this.#tooLarge("line");
        const c = buf.charCodeAt(pos);
        if (c === 100 && buf.startsWith("data:", pos)) {
          // The common case first: no field-name slice.
          const from = buf.charCodeAt(pos + 5) === 32 ? pos + 6 : pos + 5;
          this.#addData(buf.slice(from, nl));
        } else if (c === 58) {
          this.#onComment?.(buf.slice(pos + 1, nl));
        } else {
          const colon = buf.indexOf(":", pos);
          let name: string;
          let value = "";
          if (colon < 0 || colon > nl) name = buf.slice(pos, nl);
          else {
            name = buf.slice(pos, colon);
            const from = buf.charCodeAt(colon + 1) === 32
              ? colon + 2
              : colon + 1;
            value = buf.slice(from, nl);
          }
          if (name === "data") this.#addData(value);
          else if (name === "event") this.#type = value || null;
          // id:, retry: and unknown fields are ignored
        }
        pos = nl + 1;
      }
    } finally {
      this.#pos = pos;
    }
  }

  #addData(v: string): void {
    this.#dataLen += v.length;
    if (this.#dataLen > this.#maxEvent) throw this.#tooLarge("event");
    this.#data = this.#data === null ? v : this.#data + "\n" + v;
  }

  #tooLarge(what: "line" | "event"): SSEError {
    return new SSEError(
      "too_large",
      `The ${this.#peer} sent an over-long ${what}`,
    );
  }
}

/** Resolves "timeout" after `ms` unless `p` settles first (then as `p`). */
export type Race = <T>(p: Promise<T>, ms: number) => Promise<T | "timeout">;

/** Options of `SSEReader`. */
export interface SSEReaderOptions extends SSEOptions {
  /** How a read races its timeout (default: one setTimeout per timed read). */
  race?: Race;
}

const setTimeoutRace: Race = <T>(p: Promise<T>, ms: number) =>
  new Promise<T | "timeout">((resolve, reject) => {
    const t = setTimeout(() => resolve("timeout"), ms);
    p.then((v) => {
      clearTimeout(t);
      resolve(v);
    }, (e) => {
      clearTimeout(t);
      reject(e);
    });
  });

/**
 * Where an `SSEReader` reads bytes: a stream's reader, or anything with
 * its `read` and `cancel` (lib/http1_client.ts's response reader).
 */
export interface ByteSource {
  read(): Promise<ReadableStreamReadResult<Uint8Array>>;
  cancel(reason?: unknown): Promise<void>;
}

/**
 * Pulls events out of a byte stream; each read may race a timeout. A read
 * that timed out stays pending and is awaited by the next call, so no chunk
 * is lost when a caller treats a timeout as "not yet".
 */
export class SSEReader {
  readonly #reader: ByteSource;
  readonly #parser: SSEParser;
  readonly #race: Race;
  readonly #peer: string;
  #pending: Promise<ReadableStreamReadResult<Uint8Array>> | null = null;
  /** Bytes received so far. */
  bytes = 0;

  constructor(
    body: ReadableStream<Uint8Array> | ByteSource,
    opts: SSEReaderOptions = {},
  ) {
    this.#reader = body instanceof ReadableStream ? body.getReader() : body;
    this.#parser = new SSEParser(opts);
    this.#race = opts.race ?? setTimeoutRace;
    this.#peer = opts.peer ?? "server";
  }

  /**
   * The next event's data (its type in `event`), or null at the end of the
   * stream; waits at most `timeoutMs` for bytes (default: no limit).
   * Throws `SSEError`: "timeout", "too_large" or "closed" (the stream
   * failed).
   */
  async next(timeoutMs = Infinity): Promise<string | null> {
    for (;;) {
      const ev = this.#parser.next();
      if (ev !== null) return ev;
      if (this.#parser.done) return null;
      const chunk = await this.#read(timeoutMs);
      if (chunk === null) this.#parser.end();
      else {
        this.bytes += chunk.byteLength;
        this.#parser.push(chunk);
      }
    }
  }

  /**
   * The next event if it already arrived (its bytes came with an earlier
   * read), else null without reading: relays send the events of one read
   * as one write instead of a write each.
   */
  buffered(): string | null {
    return this.#parser.next();
  }

  /** The type of the event `next` returned last. */
  get event(): string {
    return this.#parser.event;
  }

  /** Whether the stream has ended and every event has been taken. */
  get ended(): boolean {
    return this.#parser.done;
  }

  /**
   * After the last event (`[DONE]`): waits up to `timeoutMs` for the
   * body's end and says whether it came. Reading it lets the HTTP
   * connection under the stream go back to its pool; cancelling first
   * closes it, a TCP connect and teardown per stream. More events, an
   * error or the time passing give false (the caller then cancels).
   */
  async drain(timeoutMs: number): Promise<boolean> {
    try {
      return await this.next(timeoutMs) === null;
    } catch {
      return false;
    }
  }

  /** Stops reading and releases the stream (a read in progress resolves as its end). */
  cancel(reason?: unknown): void {
    this.#reader.cancel(reason).catch(() => {});
  }

  async #read(timeoutMs: number): Promise<Uint8Array | null> {
    this.#pending ??= this.#reader.read();
    try {
      const r = timeoutMs === Infinity
        ? await this.#pending
        : await this.#race(this.#pending, timeoutMs);
      if (r === "timeout") {
        throw new SSEError(
          "timeout",
          `The ${this.#peer} sent nothing for ${timeoutMs} ms`,
        );
      }
      this.#pending = null;
      return r.done ? null : r.value;
    } catch (e) {
      if (e instanceof SSEError) throw e;
      this.#pending = null;
      throw new SSEError("closed", `The ${this.#peer}'s stream broke off`, {
        cause: e,
      });
    }
  }
}

/**
 * Yields the data of each event of a byte stream (no timeouts); the stream
 * is cancelled when the loop ends, early or not.
 */
export async function* sseData(
  body: ReadableStream<Uint8Array> | ByteSource,
  opts: SSEOptions = {},
): AsyncGenerator<string> {
  const reader = new SSEReader(body, opts);
  try {
    for (let d = await reader.next(); d !== null; d = await reader.next()) {
      yield d;
    }
  } finally {
    reader.cancel();
  }
}

/** The events of a whole event-stream text (comments go to `opts.onComment`). */
export function parseSSE(
  text: string,
  opts: SSEOptions = {},
): { event: string; data: string }[] {
  const p = new SSEParser(opts);
  p.pushText(text);
  p.end();
  const out: { event: string; data: string }[] = [];
  for (let d = p.next(); d !== null; d = p.next()) {
    out.push({ event: p.event, data: d });
  }
  return out;
}

const HAS_LINE_BREAK = /[\r\n]/;
const LINE_BREAK = /\r\n|\r|\n/;

/**
 * Encodes one event: `value` as is when a string (one `data:` line per
 * line of it), else as JSON; `event` names it.
 */
export function sseFrame(value: unknown, event?: string): string {
  let data = typeof value === "string" ? value : JSON.stringify(value);
  if (HAS_LINE_BREAK.test(data)) data = data.split(LINE_BREAK).join("\ndata: ");
  return event === undefined
    ? `data: ${data}\n\n`
    : `event: ${event}\ndata: ${data}\n\n`;
}

/** Encodes a comment (a keep-alive or a note), one line. */
export function sseComment(text: string): string {
  return `: ${text.replace(/[\r\n]+/g, " ")}\n\n`;
}
