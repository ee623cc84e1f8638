import * as assert from "node:assert/strict";
import { utf8Length } from "./tokens.ts";

Deno.test("utf8Length() equals the UTF-8 encoding's length", () => {
  const te = new TextEncoder();
  const samples = [
    "",
    "hello",
    "é",
    "日本語",
    "😀",
    "a😀b漢é",
    "x".repeat(1000) + "ü",
    "\ud83d", // lone surrogates are encoded as U+FFFD
    "a\ude00b",
    "\ud83d\ud83d\ude00",
  ];
  for (const s of samples) assert.equal(utf8Length(s), te.encode(s).length, s);
  const units = [
    0x41,
    0x7f,
    0x80,
    0x7ff,
    0x800,
    0xd7ff,
    0xd800,
    0xdbff,
    0xdc00,
    0xdfff,
    0xe000,
    0xffff,
  ];
  for (let i = 0; i < 2000; i++) {
    const s = String.fromCharCode(
      ...Array.from(
        { length: 1 + (i % 9) },
        () => units[Math.floor(Math.random() * units.length)]!,
      ),
    );
    assert.equal(utf8Length(s), te.encode(s).length, JSON.stringify(s));
  }
});
