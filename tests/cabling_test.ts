/**
 * Cabling diagnostics over probe documents. The fixtures under
 * fixtures/probes/ are orchard.probe/1 documents shaped as liborchard writes
 * them on a Mac (hand-made: CI has no Mac; README's Mac checklist says what
 * to confirm), each with one wiring mistake; the last test feeds this
 * machine's real probe through the same functions.
 */
import assert from "node:assert/strict";
import {
  competingRoutes,
  dhcpOnThunderbolt,
  diagnoseCabling,
  sharedSubnets,
  thunderbolt4Links,
} from "../fleet/cabling.ts";
import { probe } from "../node/native/probe.ts";

const load = async (name: string) =>
  JSON.parse(
    await Deno.readTextFile(
      new URL(`./fixtures/probes/${name}.json`, import.meta.url),
    ),
  );

Deno.test("a well-wired Mac (one /30 per cable, Ethernet elsewhere, TB5 speed) has no findings", async () => {
  const p = await load("mac_ok");
  assert.deepEqual(diagnoseCabling(p), []);
  // the stored form wraps the document under `native`
  assert.deepEqual(diagnoseCabling({ os: "darwin", native: p }), []);
});

Deno.test("a Thunderbolt 4 link is named with its speed and the Thunderbolt 5 requirement", async () => {
  const issues = thunderbolt4Links(await load("mac_tb4_cable"));
  assert.equal(issues.length, 1);
  assert.equal(issues[0]!.code, "tb4-link");
  assert.deepEqual(issues[0]!.where, ["rdma_en2"]);
  assert.match(
    issues[0]!.message,
    /rdma_en2 links at 40 Gb\/s: a Thunderbolt 4 port or cable/,
  );
  assert.match(
    issues[0]!.fix,
    /Thunderbolt 5 ports on both Macs and a Thunderbolt 5 cable/,
  );
});

Deno.test("RDMA enabled with no RDMA device on a Mac says Thunderbolt 5 ports are needed", async () => {
  const issues = thunderbolt4Links(await load("mac_no_tb5_ports"));
  assert.deepEqual(issues.map((i) => i.code), ["no-tb5-device"]);
  assert.match(issues[0]!.fix, /needs Thunderbolt 5 ports/);
});

Deno.test("DHCP on the Thunderbolt Bridge (a self-assigned 169.254 address) is found with the manual-address fix", async () => {
  const issues = dhcpOnThunderbolt(await load("mac_dhcp_bridge"));
  assert.equal(issues.length, 1);
  assert.deepEqual(issues[0]!.where, ["bridge0"]);
  assert.match(issues[0]!.message, /node count\) comes and goes/);
  assert.match(issues[0]!.fix, /Thunderbolt Bridge .*Configure IPv4: Manually/);
  // a link-local address is not a shared subnet or a route conflict
  assert.deepEqual(sharedSubnets(await load("mac_dhcp_bridge")), []);
  assert.deepEqual(competingRoutes(await load("mac_dhcp_bridge")), []);
});

Deno.test("two cables in one subnet are found once, with the subnet named", async () => {
  const issues = sharedSubnets(await load("mac_shared_subnet"));
  assert.equal(issues.length, 1);
  assert.deepEqual(issues[0]!.where, ["en2", "en3"]);
  assert.match(issues[0]!.message, /en2 and en3 are both in 10\.0\.0\.0\/24/);
  assert.match(issues[0]!.fix, /its own small subnet/);
  assert.deepEqual(
    diagnoseCabling(await load("mac_shared_subnet")).map((i) => i.code),
    ["shared-subnet"],
  );
});

Deno.test("Ethernet and Thunderbolt in overlapping subnets compete for the route", async () => {
  const issues = competingRoutes(await load("mac_competing_routes"));
  assert.equal(issues.length, 1);
  assert.deepEqual(issues[0]!.where, ["en0", "en2"]);
  assert.match(
    issues[0]!.message,
    /en0 and en2 \(Thunderbolt\) overlap in 192\.168\.1\.0\/24/,
  );
  // a wider LAN (/16) containing the link's /30 also competes
  const p = await load("mac_ok");
  p.interfaces.find((i: { name: string }) => i.name === "en0").ipv4_cidr = [
    "10.0.0.5/16",
  ];
  assert.deepEqual(competingRoutes(p).map((i) => i.where), [
    ["en0", "en2"],
    ["en0", "en3"],
  ]);
});

Deno.test("malformed or partial probes give no findings rather than errors", () => {
  for (
    const p of [null, 1, "x", {}, { native: { rdma: null, interfaces: "no" } }]
  ) {
    assert.deepEqual(diagnoseCabling(p), []);
  }
  assert.deepEqual(
    diagnoseCabling({
      interfaces: [{
        name: "en2",
        up: true,
        ipv4_cidr: ["300.1.1.1/24", "10.0.0.1/99"],
      }],
    }),
    [],
  );
});

Deno.test("this machine's real probe goes through the checks (prefixes are reported)", async () => {
  const r = await probe({ skipGpu: true });
  const lo = r.interfaces?.find((i) => i.loopback);
  assert.ok(
    lo?.ipv4_cidr?.some((c) => c.startsWith("127.")),
    JSON.stringify(lo),
  );
  assert.ok(Array.isArray(diagnoseCabling(r)));
});
