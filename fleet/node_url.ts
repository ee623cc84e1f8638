/**
 * Validation of the URL a node advertises, so enrollment cannot point the
 * gateway at cloud metadata services or link-local hosts (SSRF). Private
 * LAN and loopback addresses are normal for nodes and stay allowed.
 */
import { ValidationError } from "../store/errors.ts";

/** Host names of cloud metadata services. */
const METADATA_HOSTS = new Set([
  "metadata",
  "metadata.google.internal",
  "metadata.goog",
  "metadata.azure.com",
  "instance-data",
  "instance-data.ec2.internal",
]);

/** Literal IPs of metadata services outside 169.254/16. */
const METADATA_IPS = new Set(["100.100.100.200", "fd00:ec2::254"]);

function ipv4(host: string): number[] | null {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(host);
  if (!m) return null;
  const parts = m.slice(1).map(Number);
  return parts.every((n) => n <= 255) ? parts : null;
}

/** An IPv4 address embedded in an IPv6 one (mapped `::ffff:a.b.c.d` or `::ffff:hhhh:hhhh`). */
function mappedV4(host: string): number[] | null {
  const m = /^::ffff:(?:([0-9a-f]{1,4}):([0-9a-f]{1,4})|(\d+\.\d+\.\d+\.\d+))$/
    .exec(host);
  if (!m) return null;
  if (m[3]) return ipv4(m[3]);
  const hi = parseInt(m[1]!, 16);
  const lo = parseInt(m[2]!, 16);
  return [hi >> 8, hi & 255, lo >> 8, lo & 255];
}

/** Why a host is refused, or null when it is fine. */
export function refusedHost(hostname: string): string | null {
  const host = hostname.toLowerCase().replace(/^\[|\]$/g, "").replace(
    /\.$/,
    "",
  );
  if (METADATA_HOSTS.has(host) || METADATA_IPS.has(host)) {
    return "a cloud metadata address";
  }
  const v4 = ipv4(host) ?? mappedV4(host);
  if (v4) {
    if (v4[0] === 169 && v4[1] === 254) return "a link-local address";
    if (v4[0] === 0) return "an unspecified address";
    if (METADATA_IPS.has(v4.join("."))) return "a cloud metadata address";
    return null;
  }
  if (host.includes(":")) {
    if (/^fe[89ab][0-9a-f]?:/.test(host)) return "a link-local address";
    if (host === "::") return "an unspecified address";
  }
  return null;
}

/**
 * Checks an advertised node URL: http(s) only, no credentials, query or
 * fragment, and no link-local or metadata host unless `allowPrivate`.
 * Returns the normalised base URL (no trailing slash).
 */
export function validateNodeUrl(raw: string, allowPrivate: boolean): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new ValidationError("url: is not a valid URL", "url");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new ValidationError("url: must use http or https", "url");
  }
  if (url.username || url.password) {
    throw new ValidationError("url: must not contain credentials", "url");
  }
  if (url.search || url.hash) {
    throw new ValidationError(
      "url: must not have a query or fragment",
      "url",
    );
  }
  const why = refusedHost(url.hostname);
  if (why && !allowPrivate) {
    throw new ValidationError(
      `url: ${url.hostname} is ${why}; set ORCHARD_ALLOW_PRIVATE_NODE_URLS=true to allow it`,
      "url",
    );
  }
  return url.href.replace(/\/+$/, "");
}
