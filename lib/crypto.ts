/**
 * Small cryptographic helpers on WebCrypto: random tokens, checksums, keyed
 * hashes and constant-time comparison. WebCrypto covers all of it, so no
 * library is needed here.
 */
import { timingSafeEqual } from "node:crypto";

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const encoder = new TextEncoder();

/** `n` random base62 characters (5.95 bits each; 22 chars ≥ 128 bits). */
export function randomBase62(n: number): string {
  // Rejection sampling keeps the distribution uniform (62 does not divide 256).
  let out = "";
  while (out.length < n) {
    const bytes = crypto.getRandomValues(new Uint8Array(n * 2));
    for (const b of bytes) {
      if (b < 248 && out.length < n) out += BASE62[b % 62];
    }
  }
  return out;
}

/** CRC-32 (IEEE) of a string, for key checksums. */
export function crc32(text: string): number {
  let crc = 0xffffffff;
  for (const byte of encoder.encode(text)) {
    crc ^= byte;
    for (let i = 0; i < 8; i++) crc = (crc >>> 1) ^ (0xedb88320 & -(crc & 1));
  }
  return (crc ^ 0xffffffff) >>> 0;
}

/** A 6-character base62 checksum of `text`. */
export function checksum6(text: string): string {
  let n = crc32(text);
  let out = "";
  for (let i = 0; i < 6; i++) {
    out += BASE62[n % 62];
    n = Math.floor(n / 62);
  }
  return out;
}

/** Imports raw bytes as an HMAC-SHA-256 key. */
export function importHmacKey(raw: Uint8Array): Promise<CryptoKey> {
  return crypto.subtle.importKey(
    "raw",
    raw as BufferSource,
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
}

/** HMAC-SHA-256 of `text` under `key`, base64url. */
export async function hmac(key: CryptoKey, text: string): Promise<string> {
  const sig = await crypto.subtle.sign("HMAC", key, encoder.encode(text));
  return toBase64Url(new Uint8Array(sig));
}

/** SHA-256 of `text`, base64url. */
export async function sha256(text: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", encoder.encode(text));
  return toBase64Url(new Uint8Array(digest));
}

/** Constant-time string comparison (lengths may leak, contents do not). */
export function safeEqual(a: string, b: string): boolean {
  const ab = encoder.encode(a);
  const bb = encoder.encode(b);
  if (ab.length !== bb.length) return false;
  return timingSafeEqual(ab, bb);
}

/** Bytes to base64url without padding. */
export function toBase64Url(bytes: Uint8Array): string {
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

/** base64url to bytes. */
export function fromBase64Url(text: string): Uint8Array {
  const b64 = text.replaceAll("-", "+").replaceAll("_", "/");
  const bin = atob(b64 + "===".slice((b64.length + 3) % 4));
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

/**
 * A 256-bit key for one purpose, derived with HKDF-SHA-256 from a server
 * secret (`info` names the purpose, so keys of two purposes never match).
 */
export async function deriveKey256(
  secret: Uint8Array,
  info: string,
): Promise<Uint8Array> {
  const base = await crypto.subtle.importKey(
    "raw",
    secret as BufferSource,
    "HKDF",
    false,
    ["deriveBits"],
  );
  const bits = await crypto.subtle.deriveBits(
    {
      name: "HKDF",
      hash: "SHA-256",
      salt: encoder.encode("orchard-portal"),
      info: encoder.encode(info),
    },
    base,
    256,
  );
  return new Uint8Array(bits);
}
