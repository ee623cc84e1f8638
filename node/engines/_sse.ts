/** Server-sent events: reading `data:` payloads from a byte stream. */

/**
 * Yields the data of each event (multi-line data joined by "\n"); comments
 * are skipped. Given a reader, its owner can cancel it mid-read.
 */
export async function* sseData(
  body: ReadableStream<Uint8Array> | ReadableStreamDefaultReader<Uint8Array>,
): AsyncGenerator<string> {
  const reader = body instanceof ReadableStream ? body.getReader() : body;
  const decoder = new TextDecoder();
  let buf = "";
  let data: string[] = [];
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length) yield data.join("\n");
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const i = line.indexOf(":");
        if ((i < 0 ? line : line.slice(0, i)) !== "data") continue;
        const v = i < 0 ? "" : line.slice(i + 1);
        data.push(v.startsWith(" ") ? v.slice(1) : v);
      }
    }
    if (buf.startsWith("data:")) data.push(buf.slice(5).trimStart());
    if (data.length) yield data.join("\n");
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** Encodes one SSE `data:` frame. */
export function sseFrame(value: unknown): string {
  return `data: ${
    typeof value === "string" ? value : JSON.stringify(value)
  }\n\n`;
}
