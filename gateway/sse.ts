/**
 * Reads a node's server-sent events as untrusted input: line and event sizes
 * are capped, and every read races a timeout (first byte, then idle between
 * chunks). Yields the `data` of each event; comments and other fields are
 * dropped.
 */
import { race } from "./timers.ts";

/** Why reading a node's stream stopped early. */
export class UpstreamStreamError extends Error {
  readonly kind: "timeout" | "too_large" | "closed";
  constructor(
    kind: "timeout" | "too_large" | "closed",
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = "UpstreamStreamError";
    this.kind = kind;
  }
}

/** Pulls `data` payloads out of an SSE byte stream. */
export class SSEReader {
  readonly #reader: ReadableStreamDefaultReader<Uint8Array>;
  readonly #decoder = new TextDecoder();
  readonly #maxEvent: number;
  #buf = "";
  #data: string[] = [];
  #dataLen = 0;
  #ended = false;
  #pending: Promise<ReadableStreamReadResult<Uint8Array>> | null = null;
  /** Bytes received so far. */
  bytes = 0;

  constructor(body: ReadableStream<Uint8Array>, maxEventBytes = 1 << 20) {
    this.#reader = body.getReader();
    this.#maxEvent = maxEventBytes;
  }

  /** The next event's data, or null at the end of the stream; waits at most `timeoutMs` for bytes. */
  async next(timeoutMs: number): Promise<string | null> {
    for (;;) {
      const ev = this.#take();
      if (ev !== null) return ev;
      if (this.#ended) return null;
      const chunk = await this.#read(timeoutMs);
      if (chunk === null) {
        this.#ended = true;
        this.#buf += this.#decoder.decode();
        if (this.#buf.length > 0) this.#buf += "\n\n";
        else if (this.#data.length > 0) this.#buf = "\n";
        continue;
      }
      this.bytes += chunk.byteLength;
      this.#buf += this.#decoder.decode(chunk, { stream: true });
      if (this.#buf.length > this.#maxEvent && this.#buf.indexOf("\n") < 0) {
        throw new UpstreamStreamError(
          "too_large",
          "The node sent an over-long line",
        );
      }
    }
  }

  /** Whether the stream has ended. */
  get ended(): boolean {
    return this.#ended && this.#buf.length === 0 && this.#data.length === 0;
  }

  /** Stops reading and releases the node's stream. */
  cancel(reason?: unknown): void {
    this.#reader.cancel(reason).catch(() => {});
  }

  #take(): string | null {
    for (;;) {
      const nl = this.#buf.indexOf("\n");
      if (nl < 0) return null;
      let line = this.#buf.slice(0, nl);
      this.#buf = this.#buf.slice(nl + 1);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line === "") {
        if (this.#data.length === 0) continue;
        const data = this.#data.length === 1
          ? this.#data[0]!
          : this.#data.join("\n");
        this.#data = [];
        this.#dataLen = 0;
        return data;
      }
      if (line.startsWith("data:")) {
        const v = line.charCodeAt(5) === 32 ? line.slice(6) : line.slice(5);
        this.#dataLen += v.length;
        if (this.#dataLen > this.#maxEvent) {
          throw new UpstreamStreamError(
            "too_large",
            "The node sent an over-long event",
          );
        }
        this.#data.push(v);
      }
      // comments (":"), event:, id:, retry: are ignored
    }
  }

  async #read(timeoutMs: number): Promise<Uint8Array | null> {
    // A read that timed out stays pending and is awaited again next time,
    // so no chunk is lost when a caller treats a timeout as "not yet".
    this.#pending ??= this.#reader.read();
    try {
      const r = await race(this.#pending, timeoutMs);
      if (r === "timeout") {
        throw new UpstreamStreamError(
          "timeout",
          `The node sent nothing for ${timeoutMs} ms`,
        );
      }
      this.#pending = null;
      return r.done ? null : r.value;
    } catch (e) {
      if (e instanceof UpstreamStreamError) throw e;
      this.#pending = null;
      throw new UpstreamStreamError("closed", "The node's stream broke off", {
        cause: e,
      });
    }
  }
}
