import assert from "node:assert/strict";
import {
  parseSSE,
  sseComment,
  sseData,
  SSEError,
  sseFrame,
  SSEParser,
  SSEReader,
} from "./sse.ts";

const enc = new TextEncoder();

type Ev = { event: string; data: string };

/** Feeds `chunks` to a parser, taking events after each one. */
function feed(
  chunks: Uint8Array[],
  opts: ConstructorParameters<typeof SSEParser>[0] = {},
): Ev[] {
  const p = new SSEParser(opts);
  const out: Ev[] = [];
  const take = () => {
    for (let d = p.next(); d !== null; d = p.next()) {
      out.push({ event: p.event, data: d });
    }
  };
  for (const c of chunks) {
    p.push(c);
    take();
  }
  p.end();
  take();
  assert.ok(p.done);
  return out;
}

function stream(chunks: (string | Uint8Array)[]): ReadableStream<Uint8Array> {
  return ReadableStream.from(
    chunks.map((c) => typeof c === "string" ? enc.encode(c) : c),
  );
}

const MIXED = ": hello\r\n" +
  'data: {"a":"é😀"}\r\n\r\n' +
  "event: add\n" +
  "data: line 1\n" +
  "data:line 2\n" +
  "id: 7\n" +
  "retry: 10\n" +
  "\n" +
  "data: cr only\r\r" +
  "data\n\n" +
  "event: ignored\n\n" +
  "unknown: x\n" +
  "data: [DONE]\n\n";

const MIXED_EVENTS: Ev[] = [
  { event: "message", data: '{"a":"é😀"}' },
  { event: "add", data: "line 1\nline 2" },
  { event: "message", data: "cr only" },
  { event: "message", data: "" },
  { event: "message", data: "[DONE]" },
];

Deno.test("SSEParser: the same events however the bytes are split", () => {
  const bytes = enc.encode(MIXED);
  assert.deepEqual(feed([bytes]), MIXED_EVENTS);
  // one split at every byte (inside UTF-8 sequences and CRLF pairs too)
  for (let i = 0; i <= bytes.length; i++) {
    assert.deepEqual(
      feed([bytes.subarray(0, i), bytes.subarray(i)]),
      MIXED_EVENTS,
      `split at ${i}`,
    );
  }
  // every byte its own chunk
  assert.deepEqual(
    feed(Array.from(bytes, (_, i) => bytes.subarray(i, i + 1))),
    MIXED_EVENTS,
  );
});

Deno.test("SSEParser: CRLF, CR and LF line ends, alone and mixed", () => {
  for (const nl of ["\n", "\r\n", "\r"]) {
    const text = `data: a${nl}data: b${nl}${nl}event: x${nl}data: c${nl}${nl}`;
    assert.deepEqual(parseSSE(text), [
      { event: "message", data: "a\nb" },
      { event: "x", data: "c" },
    ], JSON.stringify(nl));
  }
  // "\r" then "\n" in the next chunk is one line end, not two
  const p = new SSEParser();
  p.pushText("data: a\r");
  assert.equal(p.next(), null);
  p.pushText("\ndata: b\r");
  p.pushText("\r");
  assert.equal(p.next(), "a\nb");
});

Deno.test("SSEParser: comments go to onComment, never become events", () => {
  const comments: string[] = [];
  const events = parseSSE(": ping\n\n:\n: note: x\ndata: 1\n\n", {
    onComment: (t) => comments.push(t),
  });
  assert.deepEqual(events, [{ event: "message", data: "1" }]);
  assert.deepEqual(comments, [" ping", "", " note: x"]);
});

Deno.test("SSEParser: an event still open at the end is delivered", () => {
  assert.deepEqual(parseSSE("data: a\n\ndata: b"), [
    { event: "message", data: "a" },
    { event: "message", data: "b" },
  ]);
  assert.deepEqual(parseSSE("data: a\n"), [{ event: "message", data: "a" }]);
  assert.deepEqual(parseSSE("data: a\r"), [{ event: "message", data: "a" }]);
  assert.deepEqual(parseSSE(": only a comment"), []);
  assert.deepEqual(parseSSE(""), []);
});

Deno.test("SSEParser: a line over the cap is an error, complete or still arriving", () => {
  const cap = 64;
  const opts = { maxLine: cap, maxEvent: 1000, peer: "node" };
  // exactly at the cap is fine
  assert.deepEqual(parseSSE(`data: ${"x".repeat(cap - 6)}\n\n`, opts), [
    { event: "message", data: "x".repeat(cap - 6) },
  ]);
  assert.throws(
    () => parseSSE(`data: ${"x".repeat(cap - 5)}\n\n`, opts),
    (e) =>
      e instanceof SSEError && e.kind === "too_large" &&
      e.message === "The node sent an over-long line",
  );
  // comments count too
  assert.throws(
    () => parseSSE(`:${"x".repeat(cap)}\n`, opts),
    (e) => e instanceof SSEError && e.kind === "too_large",
  );
  // no line end yet: refused before the rest arrives, events before it kept
  const p = new SSEParser(opts);
  p.pushText("data: ok\n\ndata: ");
  assert.equal(p.next(), "ok");
  for (let i = 0; i < cap; i += 8) p.pushText("xxxxxxxx");
  assert.throws(() => p.next(), /over-long line/);
});

Deno.test("SSEParser: an event whose data passes the cap is an error", () => {
  const opts = { maxLine: 100, maxEvent: 30, peer: "engine" };
  const line = `data: ${"y".repeat(10)}\n`;
  assert.deepEqual(parseSSE(line.repeat(3) + "\n", opts), [
    { event: "message", data: Array(3).fill("y".repeat(10)).join("\n") },
  ]);
  assert.throws(
    () => parseSSE(line.repeat(4) + "\n", opts),
    (e) =>
      e instanceof SSEError && e.kind === "too_large" &&
      e.message === "The engine sent an over-long event",
  );
  // the count starts again at each event
  assert.equal(parseSSE((line.repeat(3) + "\n").repeat(5), opts).length, 5);
});

Deno.test("SSEParser: event names apply to their own event only", () => {
  assert.deepEqual(
    parseSSE(
      "event: message_start\ndata: {}\n\ndata: plain\n\nevent:\ndata: e\n\nevent: a\nevent: b\ndata: 2\n\n",
    ),
    [
      { event: "message_start", data: "{}" },
      { event: "message", data: "plain" },
      { event: "message", data: "e" },
      { event: "b", data: "2" },
    ],
  );
});

Deno.test("sseFrame and sseComment round-trip through the parser", () => {
  assert.equal(sseFrame({ a: 1 }), 'data: {"a":1}\n\n');
  assert.equal(sseFrame("[DONE]"), "data: [DONE]\n\n");
  assert.equal(sseFrame({ t: 1 }, "ping"), 'event: ping\ndata: {"t":1}\n\n');
  assert.equal(sseFrame("a\nb\r\nc"), "data: a\ndata: b\ndata: c\n\n");
  assert.equal(sseComment("ping"), ": ping\n\n");
  assert.equal(sseComment("two\nlines"), ": two lines\n\n");
  const comments: string[] = [];
  const text = sseComment("hi") + sseFrame("x\ny", "named") +
    sseFrame({ s: "multi\nline" });
  assert.deepEqual(parseSSE(text, { onComment: (c) => comments.push(c) }), [
    { event: "named", data: "x\ny" },
    { event: "message", data: '{"s":"multi\\nline"}' },
  ]);
  assert.deepEqual(comments, [" hi"]);
});

Deno.test("SSEReader: events, byte count and the end of the stream", async () => {
  const r = new SSEReader(stream(["data: a\n", "\nevent: e\ndata: b\n\n"]));
  assert.equal(await r.next(), "a");
  assert.equal(r.event, "message");
  assert.equal(r.ended, false);
  assert.equal(await r.next(), "b");
  assert.equal(r.event, "e");
  assert.equal(await r.next(), null);
  assert.equal(r.ended, true);
  assert.equal(r.bytes, 27);
});

Deno.test("SSEReader: a timed-out read loses no chunk", async () => {
  let push!: (s: string) => void;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      push = (s) => c.enqueue(enc.encode(s));
    },
  });
  const r = new SSEReader(body, { peer: "node" });
  await assert.rejects(
    r.next(20),
    (e) =>
      e instanceof SSEError && e.kind === "timeout" &&
      e.message === "The node sent nothing for 20 ms",
  );
  push("data: late\n\n");
  assert.equal(await r.next(1000), "late");
  r.cancel();
  assert.equal(await r.next(1000), null);
});

Deno.test("SSEReader: uses the race it is given", async () => {
  let raced = 0;
  const r = new SSEReader(stream(["data: x\n\n"]), {
    race: (p, _ms) => {
      raced++;
      return p;
    },
  });
  assert.equal(await r.next(50), "x");
  assert.equal(await r.next(), null);
  assert.equal(raced, 1);
});

Deno.test("SSEReader: a failing stream is 'closed', an over-long line 'too_large'", async () => {
  let sent = false;
  const broken = new ReadableStream<Uint8Array>({
    pull(c) {
      if (sent) c.error(new Error("reset"));
      else c.enqueue(enc.encode("data: a\n\n"));
      sent = true;
    },
  });
  const r = new SSEReader(broken, { peer: "node" });
  assert.equal(await r.next(), "a");
  await assert.rejects(
    r.next(),
    (e) =>
      e instanceof SSEError && e.kind === "closed" &&
      e.message === "The node's stream broke off",
  );

  let pulls = 0;
  const endless = new ReadableStream<Uint8Array>({
    pull(c) {
      pulls++;
      c.enqueue(enc.encode("x".repeat(1024)));
    },
  });
  const big = new SSEReader(endless, { maxLine: 64 * 1024 });
  await assert.rejects(
    big.next(),
    (e) => e instanceof SSEError && e.kind === "too_large",
  );
  assert.ok(pulls <= 66, `read ${pulls} KiB before refusing`);
  big.cancel();
});

Deno.test("sseData: yields data and cancels the stream when the loop stops", async () => {
  let cancelled = false;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      c.enqueue(enc.encode("data: 1\n\ndata: 2\n\n"));
    },
    cancel() {
      cancelled = true;
    },
  });
  for await (const d of sseData(body)) {
    assert.equal(d, "1");
    break;
  }
  assert.ok(cancelled);
  const all: string[] = [];
  for await (const d of sseData(stream(["data: a\n\n", "data: b"]))) {
    all.push(d);
  }
  assert.deepEqual(all, ["a", "b"]);
});
