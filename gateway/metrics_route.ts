/** Access to `/metrics`: a platform admin bearer token, or a client IP in `config.metricsAllow` (IPs or IPv4 CIDRs). */
import type { Store } from "../store/store.ts";
import { verifyAdminToken } from "../store/admin_tokens.ts";

function ipv4(ip: string): number | null {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(ip);
  if (!m) return null;
  const p = m.slice(1).map(Number);
  if (p.some((x) => x > 255)) return null;
  return ((p[0]! << 24) | (p[1]! << 16) | (p[2]! << 8) | p[3]!) >>> 0;
}

/** Whether `ip` matches one of `allow` (exact addresses or IPv4 CIDRs). */
export function ipAllowed(ip: string | null, allow: string[]): boolean {
  if (!ip) return false;
  const bare = ip.startsWith("::ffff:") ? ip.slice(7) : ip;
  for (const rule of allow) {
    if (rule === ip || rule === bare) return true;
    const [net, bitsRaw] = rule.split("/");
    if (bitsRaw === undefined) continue;
    const a = ipv4(bare);
    const b = ipv4(net!);
    const bits = Number(bitsRaw);
    if (a === null || b === null || !(bits >= 0 && bits <= 32)) continue;
    const mask = bits === 0 ? 0 : (~0 << (32 - bits)) >>> 0;
    if (((a & mask) >>> 0) === ((b & mask) >>> 0)) return true;
  }
  return false;
}

/** Whether a `/metrics` request may read the metrics. */
export async function metricsAllowed(
  store: Store,
  req: Request,
  ip: string | null,
  allow: string[],
): Promise<boolean> {
  const auth = req.headers.get("authorization");
  const m = auth ? /^Bearer\s+(\S+)$/i.exec(auth) : null;
  if (m) {
    try {
      const p = await verifyAdminToken(store, m[1]!, ip);
      return p?.role === "platform_admin";
    } catch {
      return false;
    }
  }
  return ipAllowed(ip, allow);
}
