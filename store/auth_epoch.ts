/**
 * The auth epoch: a KV entry rewritten in the same atomic operation as any
 * change that affects API key verification (a key created or revoked, a
 * tenant suspended or resumed, limits changed). Gateways cache verified keys
 * for long, and re-read only this one entry (at most every few hundred ms,
 * shared by all requests) to learn that their caches are stale.
 */
import { k } from "./kv_keys.ts";

/** Adds the epoch bump to an atomic operation. */
export function markAuthChange(op: Deno.AtomicOperation): Deno.AtomicOperation {
  return op.set(k.authEpoch(), Date.now());
}

/** The current epoch (the entry's versionstamp; null before any change). */
export async function readAuthEpoch(kv: Deno.Kv): Promise<string | null> {
  return (await kv.get(k.authEpoch())).versionstamp;
}
