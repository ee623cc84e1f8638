/**
 * Which URLs webhooks may be sent to: http(s) only, no credentials, and
 * (unless the operator allows it: ORCHARD_ALLOW_PRIVATE_WEBHOOK_URLS)
 * never a loopback, private, link-local, shared, multicast or metadata
 * address, checked on the URL when an endpoint is created and on every
 * address its host resolves to before each delivery (SSRF).
 */
import { ValidationError } from "./errors.ts";

/** Host names that are this machine or a cloud metadata service. */
const LOCAL_NAMES = new Set([
  "localhost",
  "metadata",
  "metadata.google.internal",
  "metadata.goog",
  "metadata.azure.com",
  "instance-data",
  "instance-data.ec2.internal",
]);

function v4(host: string): number[] | null {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(host);
  if (!m) return null;
  const parts = m.slice(1).map(Number);
  return parts.every((n) => n <= 255) ? parts : null;
}

/** Why an IPv4 address is not public, or null. */
function privateV4([a, b]: number[]): string | null {
  if (a === 127) return "a loopback address";
  if (
    a === 10 || (a === 172 && b! >= 16 && b! <= 31) || (a === 192 && b === 168)
  ) {
    return "a private address";
  }
  if (a === 169 && b === 254) return "a link-local address";
  if (a === 100 && b! >= 64 && b! <= 127) return "a shared (CGNAT) address";
  if (a === 0) return "an unspecified address";
  if (a! >= 224) return "a multicast or reserved address";
  return null;
}

/** Expands an IPv6 literal to 8 groups (null when it is not one). */
function v6(host: string): number[] | null {
  if (!host.includes(":")) return null;
  let h = host.split("%")[0]!;
  const tail = /(\d+\.\d+\.\d+\.\d+)$/.exec(h);
  if (tail) {
    const p = v4(tail[1]!);
    if (!p) return null;
    h = h.slice(0, -tail[1]!.length) +
      `${((p[0]! << 8) | p[1]!).toString(16)}:${
        ((p[2]! << 8) | p[3]!).toString(16)
      }`;
  }
  const [head, rest] = h.split("::") as [string, string | undefined];
  const a = head ? head.split(":") : [];
  const b = rest ? rest.split(":") : [];
  if (rest === undefined && a.length !== 8) return null;
  const groups = [
    ...a,
    ...Array(Math.max(0, 8 - a.length - b.length)).fill("0"),
    ...b,
  ];
  if (groups.length !== 8 || groups.some((g) => !/^[0-9a-f]{1,4}$/i.test(g))) {
    return null;
  }
  return groups.map((g) => parseInt(g, 16));
}

/** Why an address (a literal IP, or a host name) may not receive webhooks, or null. */
export function privateHost(hostname: string): string | null {
  const host = hostname.toLowerCase().replace(/^\[|\]$/g, "").replace(
    /\.$/,
    "",
  );
  if (LOCAL_NAMES.has(host) || host.endsWith(".localhost")) {
    return host === "localhost" || host.endsWith(".localhost")
      ? "a loopback address"
      : "a cloud metadata address";
  }
  const four = v4(host);
  if (four) return privateV4(four);
  const six = v6(host);
  if (!six) return null; // a name: its addresses are checked before each delivery
  if (six.every((g, i) => g === (i === 7 ? 1 : 0))) return "a loopback address";
  if (six.every((g) => g === 0)) return "an unspecified address";
  // IPv4-mapped (::ffff:a.b.c.d)
  if (six.slice(0, 5).every((g) => g === 0) && six[5] === 0xffff) {
    return privateV4([
      six[6]! >> 8,
      six[6]! & 255,
      six[7]! >> 8,
      six[7]! & 255,
    ]);
  }
  if ((six[0]! & 0xfe00) === 0xfc00) return "a private address";
  if ((six[0]! & 0xffc0) === 0xfe80) return "a link-local address";
  if ((six[0]! & 0xff00) === 0xff00) return "a multicast address";
  return null;
}

/**
 * Checks a webhook URL: http or https, no credentials or fragment, at most
 * 2,000 characters, and no private host unless `allowPrivate`. Returns the
 * normalised URL.
 */
export function validateWebhookUrl(
  raw: unknown,
  allowPrivate: boolean,
): string {
  if (typeof raw !== "string" || raw.trim() === "") {
    throw new ValidationError("url: is required", "url");
  }
  if (raw.length > 2000) {
    throw new ValidationError("url: must be at most 2000 characters", "url");
  }
  let url: URL;
  try {
    url = new URL(raw.trim());
  } catch {
    throw new ValidationError("url: is not a valid URL", "url");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new ValidationError("url: must use http or https", "url");
  }
  if (url.username || url.password) {
    throw new ValidationError("url: must not contain credentials", "url");
  }
  if (url.hash) {
    throw new ValidationError("url: must not have a fragment", "url");
  }
  const why = privateHost(url.hostname);
  if (why && !allowPrivate) {
    throw new ValidationError(
      `url: ${url.hostname} is ${why}; webhooks go to public addresses only (the operator can allow others with ORCHARD_ALLOW_PRIVATE_WEBHOOK_URLS=true)`,
      "url",
    );
  }
  return url.href;
}

/** Looks up a host's addresses (default: A and AAAA records through Deno.resolveDns). */
export type Resolver = (host: string) => Promise<string[]>;

/** A and AAAA records; a type with no records adds none. */
export const resolveDns: Resolver = async (host) => {
  const addrs: string[] = [];
  for (const type of ["A", "AAAA"] as const) {
    try {
      addrs.push(...await Deno.resolveDns(host, type));
    } catch { /* no such records */ }
  }
  return addrs;
};

/**
 * Before a delivery: resolves the URL's host once and checks every address.
 * `why` says why the host may not receive webhooks (a private address), or
 * is null; `address` is the checked address the delivery must connect to
 * (null for a literal IP, or a name that did not resolve: the delivery then
 * fails by itself). Connecting to this address, not to the name again,
 * closes DNS rebinding: a name cannot resolve to a public address for the
 * check and to a private one for the connection.
 */
export async function publicAddress(
  url: string,
  resolve: Resolver = resolveDns,
): Promise<{ why: string | null; address: string | null }> {
  const host = new URL(url).hostname.replace(/^\[|\]$/g, "");
  const literal = privateHost(host);
  if (literal || v4(host) || v6(host)) return { why: literal, address: null };
  const addrs = await resolve(host);
  for (const a of addrs) {
    const why = privateHost(a);
    if (why) return { why: `${host} resolves to ${why}`, address: null };
  }
  return { why: null, address: addrs[0] ?? null };
}

/**
 * `fetch` connecting to `address` (a checked IP) instead of resolving the
 * URL's host again; TLS still checks the certificate against the URL's
 * host name, and the Host header is the URL's. The answer comes without
 * its body (a delivery needs only the status).
 */
export async function fetchPinned(
  url: string,
  init: RequestInit,
  address: string,
): Promise<Response> {
  const u = new URL(url);
  const port = u.port ? Number(u.port) : u.protocol === "https:" ? 443 : 80;
  const client = Deno.createHttpClient({
    proxy: { transport: "tcp", hostname: address, port },
  });
  try {
    const res = await fetch(url, { ...init, client });
    // Only the status counts: the answer's body is not read (nor kept).
    await res.body?.cancel().catch(() => {});
    return new Response(null, { status: res.status, headers: res.headers });
  } finally {
    client.close();
  }
}
