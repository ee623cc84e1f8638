/** The handle every service function takes first: KV plus the server secrets. */
import { loadSecrets, type Secrets } from "./secrets.ts";

/** KV and the secrets derived from it. */
export interface Store {
  kv: Deno.Kv;
  secrets: Secrets;
}

/** Wraps an open KV (the entry point opens it; tests pass `:memory:`). */
export async function createStore(kv: Deno.Kv): Promise<Store> {
  return { kv, secrets: await loadSecrets(kv) };
}
