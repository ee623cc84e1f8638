/**
 * Reasoning handed to the client sealed, for `store: false` conversations
 * (`include: ["reasoning.encrypted_content"]`, as Codex CLI asks): a
 * `reasoning` output item's `encrypted_content` is its text in a JWE
 * (`dir` + A256GCM, jose through lib/jwt.ts) under a key derived with HKDF from the
 * server's session secret with this purpose's own label, bound to the
 * tenant (`sub`). Sent back as input on a later turn, it is opened and the
 * text goes back into the assistant turn the model sees; one that does not
 * open (altered, another server's or tenant's, or older than
 * SEALED_TTL_SECONDS) is a 400 naming `input[i].encrypted_content`.
 */
import { deriveKey256 } from "../lib/crypto.ts";
import { invalidParam } from "../protocol/openai/errors.ts";
import { decryptJWT, encryptJWT } from "../lib/jwt.ts";
import type { Store } from "../store/store.ts";
import type { Item } from "./responses_request.ts";

/** How long sealed reasoning opens: a paused agent session resumed within 30 days. */
export const SEALED_TTL_SECONDS = 30 * 86_400;

const ISS = "orchard";
const AUD = "orchard:reasoning";

const keys = new WeakMap<Uint8Array, Promise<Uint8Array>>();

/** The key reasoning is sealed under (derived once per server secret). */
export function reasoningKey(store: Store): Promise<Uint8Array> {
  const raw = store.secrets.sessionKey;
  let key = keys.get(raw);
  if (!key) {
    key = deriveKey256(raw, "orchard reasoning encrypted_content v1");
    keys.set(raw, key);
  }
  return key;
}

/** Seals reasoning text for a tenant (jose's compact JWE). */
export function sealReasoning(
  key: Uint8Array,
  tenantId: string,
  text: string,
): Promise<string> {
  return encryptJWT(key, { r: text }, {
    iss: ISS,
    aud: AUD,
    sub: tenantId,
    ttlSeconds: SEALED_TTL_SECONDS,
  });
}

/** Opens sealed reasoning; null when it does not open for this tenant. */
export async function unsealReasoning(
  key: Uint8Array,
  tenantId: string,
  sealed: string,
): Promise<string | null> {
  const claims = await decryptJWT(key, sealed, {
    iss: ISS,
    aud: AUD,
    sub: tenantId,
  });
  return claims && typeof claims.r === "string" ? claims.r : null;
}

/** Whether some input item still holds sealed reasoning. */
export function hasSealed(items: readonly Item[]): boolean {
  return items.some((i) => typeof i.sealed === "string");
}

/**
 * The input items with each sealed reasoning item opened into its `text`;
 * 400 naming `input[i].encrypted_content` for one that does not open.
 */
export async function openReasoning(
  key: Uint8Array,
  tenantId: string,
  items: Item[],
): Promise<Item[]> {
  const out: Item[] = [];
  for (const item of items) {
    if (typeof item.sealed !== "string") {
      out.push(item);
      continue;
    }
    const text = await unsealReasoning(key, tenantId, item.sealed);
    if (text === null) {
      const at = `input[${item.at}].encrypted_content`;
      throw invalidParam(
        at,
        `${at} could not be decrypted: it was not made by this server for this organization, was altered, or is older than ${
          SEALED_TTL_SECONDS / 86_400
        } days`,
        "invalid_encrypted_content",
      );
    }
    out.push({ type: "reasoning", text });
  }
  return out;
}
