/**
 * Password hashing with argon2id at OWASP's parameters (m = 19 MiB, t = 2,
 * p = 1) through hash-wasm, a well-kept WebAssembly implementation that runs
 * unchanged in Deno (no native addon to build).
 */
import { argon2id, argon2Verify } from "hash-wasm";

/** OWASP Password Storage Cheat Sheet, argon2id minimum configuration. */
export const ARGON2_PARAMS = {
  memorySize: 19_456,
  iterations: 2,
  parallelism: 1,
  hashLength: 32,
} as const;

/** Hashes a password into an encoded `$argon2id$…` string. */
export function hashPassword(password: string): Promise<string> {
  return argon2id({
    password,
    salt: crypto.getRandomValues(new Uint8Array(16)),
    ...ARGON2_PARAMS,
    outputType: "encoded",
  });
}

/** A hash of a random password, verified against when no user exists (equal timing). */
let dummyHash: Promise<string> | null = null;

/** Verifies a password against an encoded hash (or a dummy hash when `hash` is null). */
export async function verifyPassword(
  password: string,
  hash: string | null,
): Promise<boolean> {
  if (hash === null || password === "") {
    dummyHash ??= hashPassword(crypto.randomUUID());
    // Same work as a real check, so timing does not reveal unknown accounts.
    await argon2Verify({ password: password || "-", hash: await dummyHash });
    return false;
  }
  try {
    return await argon2Verify({ password, hash });
  } catch {
    return false;
  }
}
