/**
 * The one module that uses oauth4webapi (panva's OAuth 2 / OpenID Connect
 * client): discovery through the issuer's
 * `/.well-known/openid-configuration`, the authorization code flow with
 * PKCE (S256), `state` and `nonce` per attempt, and the callback: the
 * authorization response checked (state, `iss` where the provider sends
 * it, errors), the code exchanged, the ID token validated (issuer,
 * audience, expiry, nonce, and its signature against the provider's JWKS),
 * and UserInfo claims merged in when the provider has that endpoint.
 *
 * Issuers must be https; plain http is accepted only on loopback addresses
 * (a provider on the same machine, as in tests), where nothing on the
 * network can read or change the traffic.
 */
import * as oauth from "oauth4webapi";

/** What a relying party needs to know of a provider. */
export interface OidcClient {
  issuer: string;
  clientId: string;
  clientSecret: string;
  /** Space-separated; always includes `openid`. */
  scopes: string;
}

/** What the browser's sign-in attempt must remember until the callback. */
export interface OidcAttempt {
  state: string;
  nonce: string;
  codeVerifier: string;
}

/** Why a sign-in did not complete. */
export type OidcFailure =
  /** The provider answered the authorization request with an error (the user cancelled, consent refused…). */
  | "provider_refused"
  /** The callback's `state` is not this browser's attempt's. */
  | "state_mismatch"
  /** The ID token's nonce is not this attempt's. */
  | "nonce_mismatch"
  /** The token response or ID token did not validate (signature, audience, expiry…). */
  | "invalid_response"
  /** The provider could not be reached or its discovery document is unusable. */
  | "unreachable";

/** A sign-in failure; `message` is safe to show, `detail` is for the log (never tokens). */
export class OidcError extends Error {
  readonly failure: OidcFailure;
  readonly detail: string;
  constructor(failure: OidcFailure, message: string, detail = "") {
    super(message);
    this.name = "OidcError";
    this.failure = failure;
    this.detail = detail.slice(0, 300);
  }
}

const TIMEOUT_MS = 10_000;
const DISCOVERY_TTL_MS = 10 * 60_000;
const discovered = new Map<
  string,
  { as: oauth.AuthorizationServer; at: number }
>();

/** Whether a URL's host is a loopback address (http allowed there). */
function loopback(url: URL): boolean {
  const h = url.hostname.replace(/^\[|\]$/g, "");
  return h === "localhost" || h === "::1" || /^127\.\d+\.\d+\.\d+$/.test(h);
}

/**
 * Checks an issuer URL: https (or http on loopback), no query or fragment.
 * Returns it trimmed, or a reason it is refused.
 */
export function checkIssuer(raw: string): { url: string } | { error: string } {
  let url: URL;
  try {
    url = new URL(raw.trim());
  } catch {
    return { error: "must be a URL such as https://login.example.com" };
  }
  if (
    url.protocol !== "https:" && !(url.protocol === "http:" && loopback(url))
  ) {
    return { error: "must use https (http only on localhost)" };
  }
  if (url.search || url.hash || url.username || url.password) {
    return { error: "must not have a query, fragment or credentials" };
  }
  // kept as written: the discovery document's `issuer` must equal it
  // exactly (Authentik's ends with a slash, Google's does not)
  return { url: raw.trim() };
}

function options(issuer: URL) {
  return {
    signal: AbortSignal.timeout(TIMEOUT_MS),
    [oauth.allowInsecureRequests]: issuer.protocol === "http:" &&
      loopback(issuer),
  };
}

/**
 * Reads the provider's discovery document (cached 10 minutes per process;
 * `fresh` reads it again). Throws `OidcError("unreachable")`.
 */
export async function discover(
  issuer: string,
  fresh = false,
): Promise<oauth.AuthorizationServer> {
  const hit = discovered.get(issuer);
  if (!fresh && hit && Date.now() - hit.at < DISCOVERY_TTL_MS) return hit.as;
  const checked = checkIssuer(issuer);
  if ("error" in checked) {
    throw new OidcError("unreachable", `The issuer URL ${checked.error}.`);
  }
  const url = new URL(issuer);
  let as: oauth.AuthorizationServer;
  try {
    const res = await oauth.discoveryRequest(url, {
      algorithm: "oidc",
      ...options(url),
    });
    as = await oauth.processDiscoveryResponse(url, res);
  } catch (err) {
    throw new OidcError(
      "unreachable",
      `Cannot read the provider's discovery document at ${issuer}/.well-known/openid-configuration.`,
      errorText(err),
    );
  }
  if (!as.authorization_endpoint || !as.token_endpoint || !as.jwks_uri) {
    throw new OidcError(
      "unreachable",
      "The provider's discovery document lacks an authorization, token or JWKS endpoint.",
    );
  }
  discovered.set(issuer, { as, at: Date.now() });
  return as;
}

/**
 * Starts a sign-in: a fresh state, nonce and PKCE verifier, and the
 * provider's authorization URL to send the browser to.
 */
export async function beginSignIn(
  client: OidcClient,
  redirectUri: string,
): Promise<{ url: string; attempt: OidcAttempt }> {
  const as = await discover(client.issuer);
  const attempt: OidcAttempt = {
    state: oauth.generateRandomState(),
    nonce: oauth.generateRandomNonce(),
    codeVerifier: oauth.generateRandomCodeVerifier(),
  };
  const url = new URL(as.authorization_endpoint!);
  url.searchParams.set("client_id", client.clientId);
  url.searchParams.set("redirect_uri", redirectUri);
  url.searchParams.set("response_type", "code");
  url.searchParams.set("scope", client.scopes);
  url.searchParams.set("state", attempt.state);
  url.searchParams.set("nonce", attempt.nonce);
  url.searchParams.set(
    "code_challenge",
    await oauth.calculatePKCECodeChallenge(attempt.codeVerifier),
  );
  url.searchParams.set("code_challenge_method", "S256");
  return { url: url.href, attempt };
}

/** How the client authenticates at the token endpoint: Basic unless only Post is offered. */
function clientAuth(
  as: oauth.AuthorizationServer,
  secret: string,
): oauth.ClientAuth {
  const methods = as.token_endpoint_auth_methods_supported;
  return methods && !methods.includes("client_secret_basic") &&
      methods.includes("client_secret_post")
    ? oauth.ClientSecretPost(secret)
    : oauth.ClientSecretBasic(secret);
}

/**
 * Completes a sign-in from the callback URL: returns the validated claims
 * (ID token claims over UserInfo's). Throws `OidcError`.
 */
export async function finishSignIn(
  client: OidcClient,
  redirectUri: string,
  callbackUrl: URL,
  attempt: OidcAttempt,
): Promise<Record<string, unknown> & { sub: string }> {
  const as = await discover(client.issuer);
  const rp: oauth.Client = { client_id: client.clientId };
  const issuerUrl = new URL(client.issuer);
  let params: URLSearchParams;
  try {
    params = oauth.validateAuthResponse(as, rp, callbackUrl, attempt.state);
  } catch (err) {
    if (err instanceof oauth.AuthorizationResponseError) {
      throw new OidcError(
        "provider_refused",
        `The identity provider refused the sign-in: ${
          (err.error_description ?? err.error).slice(0, 200)
        }`,
        err.error,
      );
    }
    if (
      err instanceof oauth.OperationProcessingError &&
      /"state"/.test(err.message)
    ) {
      throw new OidcError(
        "state_mismatch",
        "This sign-in answer does not belong to your sign-in attempt (its state does not match).",
        err.message,
      );
    }
    throw new OidcError(
      "invalid_response",
      "The identity provider's answer is not valid.",
      errorText(err),
    );
  }
  try {
    const res = await oauth.authorizationCodeGrantRequest(
      as,
      rp,
      clientAuth(as, client.clientSecret),
      params,
      redirectUri,
      attempt.codeVerifier,
      options(issuerUrl),
    );
    const tokens = await oauth.processAuthorizationCodeResponse(as, rp, res, {
      expectedNonce: attempt.nonce,
      requireIdToken: true,
    });
    // the ID token's signature, against the provider's JWKS (oauth4webapi
    // validates its claims above; the signature only on request)
    await oauth.validateApplicationLevelSignature(
      as,
      res,
      options(issuerUrl),
    );
    const id = oauth.getValidatedIdTokenClaims(tokens)!;
    if (!as.userinfo_endpoint || !tokens.access_token) return { ...id };
    const info = await oauth.processUserInfoResponse(
      as,
      rp,
      id.sub,
      await oauth.userInfoRequest(
        as,
        rp,
        tokens.access_token,
        options(issuerUrl),
      ),
    );
    return { ...info, ...id };
  } catch (err) {
    if (err instanceof oauth.ResponseBodyError) {
      throw new OidcError(
        "invalid_response",
        `The identity provider refused to complete the sign-in (${
          err.error.slice(0, 60)
        }).`,
        err.error_description ?? err.error,
      );
    }
    if (
      err instanceof oauth.OperationProcessingError &&
      /"nonce"/.test(err.message)
    ) {
      throw new OidcError(
        "nonce_mismatch",
        "The identity provider's ID token does not belong to your sign-in attempt (its nonce does not match).",
        errorText(err),
      );
    }
    if (err instanceof DOMException || err instanceof TypeError) {
      throw new OidcError(
        "unreachable",
        "The identity provider could not be reached.",
        errorText(err),
      );
    }
    throw new OidcError(
      "invalid_response",
      "The identity provider's answer did not validate.",
      errorText(err),
    );
  }
}

function errorText(err: unknown): string {
  const e = err as { code?: unknown; message?: unknown };
  return `${typeof e?.code === "string" ? e.code + ": " : ""}${
    String(e?.message ?? err)
  }`;
}
