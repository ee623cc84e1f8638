import * as assert from "node:assert/strict";
import { jsonDepth } from "./body.ts";

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
