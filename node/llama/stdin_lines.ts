/**
 * A worker that reads the model process's stdin and posts each line to the
 * child's main thread. The main thread runs synchronous decode steps and
 * yields with a MessageChannel, which delivers messages between steps but
 * lets the I/O reactor go unpolled for seconds (Deno polls it only when the
 * loop parks, or every few dozen turns); a worker's own event loop parks
 * while it waits for input, so its lines arrive within one decode step.
 */
/// <reference lib="deno.worker" />
const dec = new TextDecoder();
let buf = "";
for await (const chunk of Deno.stdin.readable) {
  buf += dec.decode(chunk, { stream: true });
  let nl;
  while ((nl = buf.indexOf("\n")) >= 0) {
    const line = buf.slice(0, nl);
    buf = buf.slice(nl + 1);
    if (line.trim()) self.postMessage(line);
  }
}
self.postMessage(null); // end of input: the engine closed our stdin
