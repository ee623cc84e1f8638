/**
 * Server secrets shared by every gateway instance: the pepper for keyed
 * hashes of API keys and tokens, the session-signing key, and the gateway's
 * Ed25519 key pair for calls to nodes. Created once, atomically, in KV so
 * instances sharing a remote KV agree on them.
 */
import { fromBase64Url, importHmacKey, toBase64Url } from "../lib/crypto.ts";
import { k } from "./kv_keys.ts";

interface StoredSecrets {
  pepper: string;
  sessionKey: string;
  gatewayPrivateJwk: JsonWebKey;
  gatewayPublicJwk: JsonWebKey;
  createdAt: string;
}

/** The loaded secrets, as keys ready for use. */
export interface Secrets {
  /** HMAC key for stored hashes of API keys, admin tokens and join tokens. */
  pepper: CryptoKey;
  /** Raw bytes of the HS256 session-signing key. */
  sessionKey: Uint8Array;
  /** The gateway's Ed25519 private key (signs JWTs sent to nodes). */
  gatewayPrivateKey: CryptoKey;
  /** The gateway's Ed25519 public key as JWK (given to nodes at enrollment). */
  gatewayPublicJwk: JsonWebKey;
}

async function generate(): Promise<StoredSecrets> {
  const pair = await crypto.subtle.generateKey({ name: "Ed25519" }, true, [
    "sign",
    "verify",
  ]) as CryptoKeyPair;
  const rand = () => toBase64Url(crypto.getRandomValues(new Uint8Array(32)));
  return {
    pepper: rand(),
    sessionKey: rand(),
    gatewayPrivateJwk: await crypto.subtle.exportKey("jwk", pair.privateKey),
    gatewayPublicJwk: await crypto.subtle.exportKey("jwk", pair.publicKey),
    createdAt: new Date().toISOString(),
  };
}

/** Loads the server secrets, creating them on first use (one winner under races). */
export async function loadSecrets(kv: Deno.Kv): Promise<Secrets> {
  let entry = await kv.get<StoredSecrets>(k.secrets());
  if (!entry.value) {
    const fresh = await generate();
    await kv.atomic().check({ key: k.secrets(), versionstamp: null }).set(
      k.secrets(),
      fresh,
    ).commit();
    entry = await kv.get<StoredSecrets>(k.secrets());
  }
  const s = entry.value!;
  return {
    pepper: await importHmacKey(fromBase64Url(s.pepper)),
    sessionKey: fromBase64Url(s.sessionKey),
    gatewayPrivateKey: await crypto.subtle.importKey(
      "jwk",
      s.gatewayPrivateJwk,
      { name: "Ed25519" },
      false,
      ["sign"],
    ),
    gatewayPublicJwk: s.gatewayPublicJwk,
  };
}
