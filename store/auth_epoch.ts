/**
 * The auth epoch: a KV entry rewritten in the same atomic operation as any
 * change that affects API key verification (a key created or revoked, a
 * tenant suspended or resumed, limits changed). Gateways cache verified keys
 * for long and learn that their caches are stale in three ways:
 *
 * - this process: `commitAuthChange` runs the listeners registered with
 *   `onAuthChange` once the change is committed, before it returns, so the
 *   admin call (API or portal) that revoked a key answers only after the
 *   gateway in its process refuses the key;
 * - other processes sharing a remote KV: `watchAuthEpoch` (a KV watch);
 * - always, as the bound: a re-read of this one entry every few hundred ms,
 *   shared by all requests (gateway/auth.ts).
 */
import { k } from "./kv_keys.ts";

/** Called with the epoch (a versionstamp) after it changed. */
export type AuthChangeListener = (epoch: string) => void;

const listeners = new WeakMap<Deno.Kv, Set<AuthChangeListener>>();

/**
 * Commits `op` with the epoch bump. Once it is committed, the listeners
 * this process registered on `kv` have run (synchronously) when it returns.
 */
export async function commitAuthChange(
  kv: Deno.Kv,
  op: Deno.AtomicOperation,
): Promise<Deno.KvCommitResult | Deno.KvCommitError> {
  const res = await op.set(k.authEpoch(), Date.now()).commit();
  if (res.ok) {
    for (const fn of listeners.get(kv) ?? []) fn(res.versionstamp);
  }
  return res;
}

/** Runs `fn` after each auth change this process commits on `kv`; returns the function that stops it. */
export function onAuthChange(
  kv: Deno.Kv,
  fn: AuthChangeListener,
): () => void {
  let set = listeners.get(kv);
  if (!set) listeners.set(kv, set = new Set());
  set.add(fn);
  return () => void set.delete(fn);
}

/** The current epoch (the entry's versionstamp; null before any change). */
export async function readAuthEpoch(kv: Deno.Kv): Promise<string | null> {
  return (await kv.get(k.authEpoch())).versionstamp;
}

/**
 * Runs `fn` with the epoch whenever it changes, whichever process changed
 * it (a KV watch; first with the current epoch). A watch that fails (KV
 * unreachable) is opened again after `retryMs`. Returns the function that
 * stops watching.
 */
export function watchAuthEpoch(
  kv: Deno.Kv,
  fn: (epoch: string | null) => void,
  retryMs = 1000,
): () => void {
  let stopped = false;
  let reader: ReadableStreamDefaultReader<Deno.KvEntryMaybe<unknown>[]> | null =
    null;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let wake = () => {};
  (async () => {
    while (!stopped) {
      try {
        reader = kv.watch([k.authEpoch()]).getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          fn(value[0]!.versionstamp);
        }
      } catch { /* KV unreachable: the epoch is still re-read */ }
      if (stopped) break;
      await new Promise<void>((r) => {
        wake = r;
        timer = setTimeout(r, retryMs);
      });
    }
  })();
  return () => {
    stopped = true;
    reader?.cancel().catch(() => {});
    clearTimeout(timer);
    wake();
  };
}
