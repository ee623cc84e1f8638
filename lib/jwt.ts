/**
 * The one module that uses jose. Session JWTs are HS256 with the server's
 * session key; gateway↔node JWTs are EdDSA (Ed25519); the portal's
 * one-time flash messages and secrets kept at rest (SSO client secrets) are
 * JWEs (`dir` + A256GCM). Algorithms are pinned
 * on verification, and `iss`, `aud` and `exp` are always required.
 */
import * as jose from "jose";

/** Claims every Orchard JWT carries. */
export interface BaseClaims {
  iss: string;
  aud: string;
  sub: string;
  exp: number;
  iat: number;
  [claim: string]: unknown;
}

/** Signs an HS256 JWT. */
export function signHS256(
  key: Uint8Array,
  claims: Record<string, unknown>,
  opts: { iss: string; aud: string; sub: string; ttlSeconds: number },
): Promise<string> {
  return new jose.SignJWT(claims)
    .setProtectedHeader({ alg: "HS256", typ: "JWT" })
    .setIssuer(opts.iss).setAudience(opts.aud).setSubject(opts.sub)
    .setIssuedAt().setExpirationTime(`${opts.ttlSeconds}s`)
    .sign(key);
}

/** Verifies an HS256 JWT (algorithm pinned); null when invalid for any reason. */
export async function verifyHS256(
  key: Uint8Array,
  token: string,
  opts: { iss: string; aud: string },
): Promise<BaseClaims | null> {
  try {
    const { payload } = await jose.jwtVerify(token, key, {
      algorithms: ["HS256"],
      issuer: opts.iss,
      audience: opts.aud,
      requiredClaims: ["exp", "iat", "sub"],
    });
    return payload as BaseClaims;
  } catch {
    return null;
  }
}

/** Encrypts claims as a JWT in a JWE (`dir`, A256GCM) under a 32-byte key. */
export function encryptJWT(
  key: Uint8Array,
  claims: Record<string, unknown>,
  opts: { iss: string; aud: string; sub: string; ttlSeconds: number },
): Promise<string> {
  return new jose.EncryptJWT(claims)
    .setProtectedHeader({ alg: "dir", enc: "A256GCM", typ: "JWT" })
    .setIssuer(opts.iss).setAudience(opts.aud).setSubject(opts.sub)
    .setIssuedAt().setExpirationTime(`${opts.ttlSeconds}s`)
    .encrypt(key);
}

/**
 * Decrypts and checks a JWE made by `encryptJWT` (algorithms pinned, `sub`
 * must match); null when invalid, tampered with or expired.
 */
export async function decryptJWT(
  key: Uint8Array,
  token: string,
  opts: { iss: string; aud: string; sub: string },
): Promise<BaseClaims | null> {
  try {
    const { payload } = await jose.jwtDecrypt(token, key, {
      keyManagementAlgorithms: ["dir"],
      contentEncryptionAlgorithms: ["A256GCM"],
      issuer: opts.iss,
      audience: opts.aud,
      subject: opts.sub,
      requiredClaims: ["exp", "iat", "sub"],
    });
    return payload as BaseClaims;
  } catch {
    return null;
  }
}

/** Generates an Ed25519 key pair, exportable as JWK. */
export async function generateEd25519(): Promise<
  { privateJwk: JsonWebKey; publicJwk: JsonWebKey }
> {
  const pair = await jose.generateKeyPair("EdDSA", {
    crv: "Ed25519",
    extractable: true,
  });
  return {
    privateJwk: await jose.exportJWK(pair.privateKey) as JsonWebKey,
    publicJwk: await jose.exportJWK(pair.publicKey) as JsonWebKey,
  };
}

/** Imports an Ed25519 JWK (private or public) for signing or verifying. */
export async function importEd25519(jwk: JsonWebKey): Promise<CryptoKey> {
  if (jwk.kty !== "OKP" || jwk.crv !== "Ed25519") {
    throw new Error("Cannot import key: expected an Ed25519 OKP JWK");
  }
  return await jose.importJWK(jwk as jose.JWK, "EdDSA") as CryptoKey;
}

/** RFC 7638 thumbprint of a public JWK (stable id for a key). */
export function jwkThumbprint(jwk: JsonWebKey): Promise<string> {
  return jose.calculateJwkThumbprint(jwk as jose.JWK, "sha256");
}

/** Signs a short-lived EdDSA JWT. */
export function signEdDSA(
  key: CryptoKey,
  claims: Record<string, unknown>,
  opts: { iss: string; aud: string; sub: string; ttlSeconds: number },
): Promise<string> {
  return new jose.SignJWT(claims)
    .setProtectedHeader({ alg: "EdDSA", typ: "JWT" })
    .setIssuer(opts.iss).setAudience(opts.aud).setSubject(opts.sub)
    .setIssuedAt().setExpirationTime(`${opts.ttlSeconds}s`)
    .setJti(crypto.randomUUID())
    .sign(key);
}

/** Verifies an EdDSA JWT (algorithm pinned); null when invalid for any reason. */
export async function verifyEdDSA(
  key: CryptoKey,
  token: string,
  opts: { iss?: string; aud: string; maxTokenAge?: string },
): Promise<BaseClaims | null> {
  try {
    const { payload } = await jose.jwtVerify(token, key, {
      algorithms: ["EdDSA"],
      issuer: opts.iss,
      audience: opts.aud,
      requiredClaims: ["exp", "iat", "sub"],
      maxTokenAge: opts.maxTokenAge ?? "5m",
    });
    return payload as BaseClaims;
  } catch {
    return null;
  }
}

/** Reads the unverified `iss`/`sub` of a JWT to pick the key to verify with. */
export function peekClaims(
  token: string,
): { iss?: string; sub?: string } | null {
  try {
    const c = jose.decodeJwt(token);
    return { iss: c.iss, sub: c.sub };
  } catch {
    return null;
  }
}

/**
 * Encrypts a secret for storage at rest: a compact JWE (`dir`, A256GCM)
 * whose protected (authenticated) header names what it belongs to, so a
 * sealed value copied onto another record does not open there.
 */
export function sealSecret(
  key: Uint8Array,
  secret: string,
  boundTo: string,
): Promise<string> {
  return new jose.CompactEncrypt(new TextEncoder().encode(secret))
    .setProtectedHeader({ alg: "dir", enc: "A256GCM", "orchard.for": boundTo })
    .encrypt(key);
}

/** Opens a value sealed by `sealSecret` for `boundTo`; null when it does not open. */
export async function openSecret(
  key: Uint8Array,
  sealed: string,
  boundTo: string,
): Promise<string | null> {
  try {
    const { plaintext, protectedHeader } = await jose.compactDecrypt(
      sealed,
      key,
      {
        keyManagementAlgorithms: ["dir"],
        contentEncryptionAlgorithms: ["A256GCM"],
      },
    );
    if (protectedHeader["orchard.for"] !== boundTo) return null;
    return new TextDecoder().decode(plaintext);
  } catch {
    return null;
  }
}
