import assert from "node:assert/strict";
import { advance, START, Utf8Guard } from "./utf8_guard.ts";

const b = (...xs: number[]) => Uint8Array.from(xs);

Deno.test("advance() accepts valid UTF-8, partial characters included", () => {
  assert.deepEqual(
    advance(START, new TextEncoder().encode("héllo €😀")),
    START,
  );
  const mid = advance(START, b(0xe2, 0x82))!;
  assert.equal(mid.need, 1);
  assert.deepEqual(advance(mid, b(0xac)), START);
});

Deno.test("advance() refuses overlong forms, surrogates, stray continuations and bytes UTF-8 never has", () => {
  for (
    const bad of [
      b(0xc1, 0xa5), // overlong "e"
      b(0xc0, 0xa2), // overlong '"'
      b(0xe0, 0x81, 0xa2), // overlong 3-byte
      b(0xed, 0xa0, 0x80), // a surrogate
      b(0xf0, 0x80, 0x80, 0x80), // overlong 4-byte
      b(0xf4, 0x90, 0x80, 0x80), // past U+10FFFF
      b(0x80), // a continuation at a boundary
      b(0xff),
    ]
  ) assert.equal(advance(START, bad), null, bad.join(","));
});

Deno.test("Utf8Guard.mask() bans what cannot start a character, and mid-character all but valid continuations", () => {
  const pieces = [b(0x61), b(0xc1), b(0xe0), b(0xa5), b(0x85), b(0xa5, 0x61)];
  const g = new Utf8Guard(pieces);
  const at = (st = START) => {
    const l = new Float32Array(pieces.length).fill(1);
    g.mask(l, st);
    return [...l].map((x) => x === -Infinity ? 0 : 1);
  };
  assert.deepEqual(at(), [1, 0, 1, 0, 0, 0]);
  // after 0xE0 the next byte must be 0xA0–0xBF and one more must follow:
  // only 0xA5 fits (0x85 is out of range, "0xA5 a" ends the character early)
  assert.deepEqual(at(advance(START, b(0xe0))!), [0, 0, 0, 1, 0, 0]);
});
