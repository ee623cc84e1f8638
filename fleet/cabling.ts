/**
 * Cabling diagnostics from what a node already probes (`orchard.probe/1`
 * under `native`: RDMA devices and ports, network interfaces with their
 * IPv4 prefixes): the mistakes people make wiring Macs for RDMA over
 * Thunderbolt, each with its fix in words. Pure functions over probe data;
 * what only a real Mac can confirm is listed in native/README.md.
 *
 * Thunderbolt interfaces are the `enN` behind each `rdma_enN` device and,
 * on macOS, `bridge0` (the Thunderbolt Bridge).
 */

/** One finding on one node. */
export interface CablingIssue {
  code:
    | "tb4-link"
    | "no-tb5-device"
    | "dhcp-thunderbolt"
    | "shared-subnet"
    | "competing-routes";
  /** Interfaces or devices concerned. */
  where: string[];
  /** What is wrong, in words. */
  message: string;
  /** What to do about it. */
  fix: string;
}

type Obj = Record<string, unknown>;
const obj = (v: unknown): Obj | null =>
  v && typeof v === "object" && !Array.isArray(v) ? v as Obj : null;
const list = (v: unknown): unknown[] => Array.isArray(v) ? v.slice(0, 64) : [];
const str = (v: unknown): string | null =>
  typeof v === "string" && v ? v.slice(0, 64) : null;

/** Thunderbolt 5 links run at 80 Gb/s (120 boosted); Thunderbolt 4 at 40. */
const TB5_GBPS = 80;

// IPv4 arithmetic is a few lines; no dependency is worth it for this.
function ipv4(text: string): number | null {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(text);
  if (!m) return null;
  const parts = m.slice(1).map(Number);
  if (parts.some((p) => p > 255)) return null;
  return ((parts[0]! << 24) | (parts[1]! << 16) | (parts[2]! << 8) |
    parts[3]!) >>> 0;
}

function dotted(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join(".");
}

interface Net {
  iface: string;
  addr: number;
  prefix: number;
  network: number;
}

function parseCidr(iface: string, text: string): Net | null {
  const [ip, p] = text.split("/");
  const addr = ipv4(ip ?? "");
  const prefix = Number(p);
  if (addr === null || !Number.isInteger(prefix) || prefix < 0 || prefix > 32) {
    return null;
  }
  const mask = prefix === 0 ? 0 : (~0 << (32 - prefix)) >>> 0;
  return { iface, addr, prefix, network: (addr & mask) >>> 0 };
}

/** Two subnets overlap when the wider one contains the other's network. */
function overlap(a: Net, b: Net): boolean {
  const p = Math.min(a.prefix, b.prefix);
  const mask = p === 0 ? 0 : (~0 << (32 - p)) >>> 0;
  return ((a.addr & mask) >>> 0) === ((b.addr & mask) >>> 0);
}

const subnet = (n: Net) => `${dotted(n.network)}/${n.prefix}`;

const isLinkLocal = (n: Net) => n.addr >>> 16 === ((169 << 8) | 254);

/** The facts the checks read from a stored probe (`{ ..., native: orchard.probe/1 }` or the bare document). */
function facts(probe: unknown) {
  const root = obj(probe);
  const native = obj(root?.native) ?? root;
  const mac = str(obj(native?.os)?.name) === "macOS";
  const rdma = obj(native?.rdma);
  const devices = list(rdma?.devices).map(obj).filter((d): d is Obj =>
    d !== null
  );
  const tb = new Set<string>();
  for (const d of devices) {
    const i = str(d.interface);
    if (i) tb.add(i);
  }
  if (mac) tb.add("bridge0");
  const nets: Net[] = [];
  const up = new Set<string>();
  for (const raw of list(native?.interfaces)) {
    const i = obj(raw);
    const name = str(i?.name);
    if (!i || !name || i.loopback === true) continue;
    if (i.up === true) up.add(name);
    for (const c of list(i.ipv4_cidr)) {
      const n = typeof c === "string" ? parseCidr(name, c) : null;
      if (n) nets.push(n);
    }
  }
  return { mac, rdma, devices, tb, nets, up };
}

/** A Thunderbolt 4 port or cable where RDMA needs Thunderbolt 5. */
export function thunderbolt4Links(probe: unknown): CablingIssue[] {
  const { mac, rdma, devices } = facts(probe);
  const out: CablingIssue[] = [];
  for (const d of devices) {
    for (const raw of list(d.ports)) {
      const p = obj(raw);
      const gbps = p?.speed_gbps;
      if (
        p?.state !== "ACTIVE" || typeof gbps !== "number" || gbps <= 0 ||
        gbps >= TB5_GBPS
      ) continue;
      const name = str(d.name) ?? "?";
      out.push({
        code: "tb4-link",
        where: [name],
        message:
          `${name} links at ${gbps} Gb/s: a Thunderbolt 4 port or cable (Thunderbolt 5 runs at ${TB5_GBPS} Gb/s)`,
        fix:
          "RDMA over Thunderbolt needs Thunderbolt 5 ports on both Macs and a Thunderbolt 5 cable; swap the cable or use a Thunderbolt 5 port",
      });
    }
  }
  if (
    mac && rdma?.rdma_ctl === "enabled" && rdma.available === false &&
    devices.length === 0
  ) {
    out.push({
      code: "no-tb5-device",
      where: [],
      message: "RDMA is enabled but this Mac shows no RDMA device",
      fix:
        "RDMA over Thunderbolt needs Thunderbolt 5 ports (Thunderbolt 4 ports get none) and macOS 26.2 or later; use a Mac with Thunderbolt 5",
    });
  }
  return out;
}

/** DHCP on a Thunderbolt bridge or interface: a self-assigned 169.254.x.x address that comes and goes. */
export function dhcpOnThunderbolt(probe: unknown): CablingIssue[] {
  const { tb, nets } = facts(probe);
  const hit = [
    ...new Set(
      nets.filter((n) => tb.has(n.iface) && isLinkLocal(n)).map((n) => n.iface),
    ),
  ];
  return hit.map((iface) => ({
    code: "dhcp-thunderbolt" as const,
    where: [iface],
    message:
      `${iface} has a self-assigned 169.254.x.x address: it asks for DHCP and nobody on a Thunderbolt cable answers, so the address (and the node count) comes and goes`,
    fix: `Set ${iface} to a manual IPv4 address (System Settings → Network → ${
      iface === "bridge0" ? "Thunderbolt Bridge" : iface
    } → Details → TCP/IP → Configure IPv4: Manually), one small subnet per cable, e.g. 10.0.12.1/30 and 10.0.12.2/30`,
  }));
}

/** Two Thunderbolt cables in one subnet: each link wants its own. */
export function sharedSubnets(probe: unknown): CablingIssue[] {
  const { tb, nets } = facts(probe);
  const links = nets.filter((n) =>
    tb.has(n.iface) && n.iface !== "bridge0" && !isLinkLocal(n)
  );
  const out: CablingIssue[] = [];
  const seen = new Set<string>();
  for (let i = 0; i < links.length; i++) {
    for (let j = i + 1; j < links.length; j++) {
      const a = links[i]!, b = links[j]!;
      if (a.iface === b.iface || !overlap(a, b)) continue;
      const key = [a.iface, b.iface].sort().join("|");
      if (seen.has(key)) continue;
      seen.add(key);
      const wide = a.prefix <= b.prefix ? a : b;
      out.push({
        code: "shared-subnet",
        where: [a.iface, b.iface],
        message: `${a.iface} and ${b.iface} are both in ${
          subnet(wide)
        }: two cables in one subnet, so replies may leave by the wrong cable`,
        fix:
          "Give each Thunderbolt link its own small subnet (a /30 per cable: 10.0.12.0/30 for one pair of Macs, 10.0.13.0/30 for the next)",
      });
    }
  }
  return out;
}

/** Ethernet (or Wi-Fi) and Thunderbolt in overlapping subnets: routes compete. */
export function competingRoutes(probe: unknown): CablingIssue[] {
  const { tb, nets, up } = facts(probe);
  const links = nets.filter((n) => tb.has(n.iface) && !isLinkLocal(n));
  const others = nets.filter((n) =>
    !tb.has(n.iface) && up.has(n.iface) && !isLinkLocal(n)
  );
  const out: CablingIssue[] = [];
  for (const t of links) {
    for (const e of others) {
      if (!overlap(t, e)) continue;
      out.push({
        code: "competing-routes",
        where: [e.iface, t.iface],
        message: `${e.iface} and ${t.iface} (Thunderbolt) overlap in ${
          subnet(t.prefix <= e.prefix ? t : e)
        }: traffic between nodes may take Ethernet/Wi-Fi instead of the cable`,
        fix:
          `Put ${t.iface} in a subnet of its own outside the LAN's (e.g. 10.0.12.0/30), or take ${e.iface} off that subnet`,
      });
    }
  }
  return out;
}

/** Every cabling finding for one node's probe (none when the probe lacks the facts). */
export function diagnoseCabling(probe: unknown): CablingIssue[] {
  return [
    ...thunderbolt4Links(probe),
    ...dhcpOnThunderbolt(probe),
    ...sharedSubnets(probe),
    ...competingRoutes(probe),
  ];
}
