import * as assert from "node:assert/strict";
import {
  JsonBodyError,
  type JsonBodyProblem,
  jsonDepth,
  parseJsonObject,
  readBodyBytes,
  readJsonObject,
} from "./json_body.ts";

Deno.test("jsonDepth() counts nesting outside strings, escapes included", () => {
  const cases: [string, number][] = [
    ["[]", 1],
    ['{"a":[{"b":1}]}', 3],
    ['{"a":"}}}]]]"}', 1],
    ['{"a":"\\"[[["}', 1],
    ['{"a":"\\\\"}', 1],
    ['{"a":"\\\\\\"{"}', 1],
    ['[[["x\\\\\\"]"]]]', 3],
    ['{"a":"\\\\\\\\"}', 1],
    ['"unterminated [[[', 0],
    ["[".repeat(100) + "]".repeat(100), 100],
  ];
  for (const [text, depth] of cases) assert.equal(jsonDepth(text), depth, text);
});

Deno.test("jsonDepth() agrees with the nesting of generated JSON", () => {
  const rnd = (n: number) => Math.floor(Math.random() * n);
  const gen = (d: number): [unknown, number] => {
    if (d === 0 || rnd(3) === 0) {
      const s = Array.from({ length: rnd(8) }, () => '"\\[]{}ab'[rnd(8)]).join(
        "",
      );
      return [s, 0];
    }
    const kids = Array.from({ length: 1 + rnd(3) }, () => gen(d - 1));
    const depth = 1 + Math.max(...kids.map((k) => k[1]));
    return rnd(2)
      ? [kids.map((k) => k[0]), depth]
      : [Object.fromEntries(kids.map((k, i) => [`k"${i}\\`, k[0]])), depth];
  };
  for (let i = 0; i < 500; i++) {
    const [v, depth] = gen(8);
    assert.equal(jsonDepth(JSON.stringify(v)), depth);
  }
});

const enc = new TextEncoder();

/** A POST whose body arrives in `chunks` with no content-length (chunked). */
function streamed(
  chunks: (string | Uint8Array)[],
  headers: Record<string, string> = {},
): { req: Request; pulled: () => number } {
  let i = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(c) {
      if (i === chunks.length) return c.close();
      const ch = chunks[i++]!;
      c.enqueue(typeof ch === "string" ? enc.encode(ch) : ch);
    },
  }, { highWaterMark: 0 });
  const req = new Request("http://x/", {
    method: "POST",
    body,
    headers,
    // @ts-ignore: required by the fetch standard for a stream body
    duplex: "half",
  });
  return { req, pulled: () => i };
}

async function problem(p: Promise<unknown>): Promise<JsonBodyProblem> {
  try {
    await p;
  } catch (e) {
    if (e instanceof JsonBodyError) return e.problem;
    throw e;
  }
  throw new Error("no error");
}

Deno.test("readJsonObject() reads a body with or without content-length", async () => {
  const json = '{"a":[1,{"b":"é"}]}';
  assert.deepEqual(
    await readJsonObject(
      new Request("http://x/", {
        method: "POST",
        body: json,
        headers: { "content-length": String(enc.encode(json).length) },
      }),
      { maxBytes: 100 },
    ),
    { a: [1, { b: "é" }] },
  );
  const { req } = streamed(['{"a":', "[1,", '{"b":"', enc.encode("é"), '"}]}']);
  assert.deepEqual(await readJsonObject(req, { maxBytes: 100 }), {
    a: [1, { b: "é" }],
  });
});

Deno.test("readBodyBytes() refuses a declared length over the cap before reading", async () => {
  const { req, pulled } = streamed(["x".repeat(10)], {
    "content-length": "101",
  });
  const e = await readBodyBytes(req, 100).catch((e) => e);
  assert.ok(e instanceof JsonBodyError);
  assert.equal(e.problem, "too_large");
  assert.equal(e.limit, 100);
  assert.equal(pulled(), 0);
});

Deno.test("readBodyBytes() stops a streamed body as soon as it passes the cap", async () => {
  const chunks = Array.from({ length: 100 }, () => "x".repeat(10));
  const { req, pulled } = streamed(chunks);
  assert.equal(await problem(readBodyBytes(req, 35)), "too_large");
  assert.ok(pulled() <= 5, `read ${pulled()} chunks`);
  // exactly at the cap is fine
  const ok = streamed(["x".repeat(20), "x".repeat(15)]);
  assert.equal((await readBodyBytes(ok.req, 35)).byteLength, 35);
});

Deno.test("readBodyBytes() checks a lying content-length after reading", async () => {
  const req = new Request("http://x/", {
    method: "POST",
    body: "x".repeat(50),
    headers: { "content-length": "5" },
  });
  assert.equal(await problem(readBodyBytes(req, 10)), "too_large");
});

Deno.test("readBodyBytes() reports a failing body stream as unreadable", async () => {
  let sent = false;
  const body = new ReadableStream<Uint8Array>({
    pull(c) {
      if (sent) c.error(new Error("reset"));
      else c.enqueue(enc.encode("{"));
      sent = true;
    },
  });
  const req = new Request("http://x/", {
    method: "POST",
    body,
    // @ts-ignore: required by the fetch standard for a stream body
    duplex: "half",
  });
  assert.equal(await problem(readBodyBytes(req, 100)), "unreadable");
});

Deno.test("parseJsonObject() names each problem, in order", () => {
  const cases: [Uint8Array | string, JsonBodyProblem, object?][] = [
    [new Uint8Array([0x7b, 0xff, 0x7d]), "not_utf8"],
    ["[".repeat(65) + "]".repeat(65), "too_deep", { maxDepth: 64 }],
    ["{not json", "not_json"],
    ["", "not_json"],
    ["[1,2]", "not_object"],
    ["null", "not_object"],
    ['"s"', "not_object"],
  ];
  for (const [body, want, opts] of cases) {
    const bytes = typeof body === "string" ? enc.encode(body) : body;
    assert.throws(
      () => parseJsonObject(bytes, opts),
      (e) => e instanceof JsonBodyError && e.problem === want,
      String(body).slice(0, 20),
    );
  }
  assert.deepEqual(
    parseJsonObject(new Uint8Array(), { emptyIsObject: true }),
    {},
  );
  const deep = "[".repeat(64) + "]".repeat(64);
  assert.deepEqual(
    parseJsonObject(enc.encode(`{"a":${deep}}`), { maxDepth: 65 }).a,
    JSON.parse(deep),
  );
  // no depth limit unless asked
  const deeper = `{"a":${"[".repeat(500)}${"]".repeat(500)}}`;
  assert.ok(parseJsonObject(enc.encode(deeper)));
});

Deno.test("readJsonObject() can require a JSON content-type", async () => {
  const req = (type: string) =>
    new Request("http://x/", {
      method: "POST",
      body: "{}",
      headers: { "content-type": type },
    });
  const opts = { maxBytes: 10, requireJsonType: true };
  assert.equal(
    await problem(readJsonObject(req("text/plain"), opts)),
    "not_json_type",
  );
  assert.deepEqual(
    await readJsonObject(req("application/json; charset=utf-8"), opts),
    {},
  );
});
