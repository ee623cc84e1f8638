import assert from "node:assert/strict";
import { idlePart, type NodeUse, tenantPart } from "./allocation.ts";
import { toCents } from "./money.ts";
import type { ClusterCost } from "./pricing.ts";

/** 3,600 over 36 months = 100 a month; 60 W busy, 10 W idle, 0.30 per kWh. */
const CLUSTER: ClusterCost = {
  hardwarePricePerNode: 3_600_000_000,
  amortisationMonths: 36,
  idleWatts: 10,
  busyWatts: 60,
  tariffPerKwh: 300_000,
  allocation: "busy_time",
};
const HOUR = 3_600_000;
const MONTH_HOURS = 720;

/** A node enrolled all month, busy 4 h: A 3 h and 250k tokens, B 1 h and 750k. */
const NODE: NodeUse = {
  enrolledHours: 720,
  busyMs: 4 * HOUR,
  tokens: 1_000_000,
  dedicatedTo: null,
};
const A = { tenantId: "a", busyMs: 3 * HOUR, tokens: 250_000 };
const B = { tenantId: "b", busyMs: 1 * HOUR, tokens: 750_000 };

/** A part as the statement prints it: hours, kWh, energy and hardware in cents. */
function cents(p: ReturnType<typeof tenantPart>) {
  return [
    Math.round(p.hours * 1000) / 1000,
    Math.round(p.kwh * 1000) / 1000,
    toCents(p.energyMicro),
    toCents(p.hardwareMicro),
  ];
}

Deno.test("tenantPart() by busy time: each tenant pays its share of the node's busy hours at hardware and busy-power rates", () => {
  const rule = "busy_time";
  // 3 h × 0.1389 = 0.42 hardware; 3 h × 60 W = 0.18 kWh × 0.30 = 0.054 → 0.05
  assert.deepEqual(cents(tenantPart(CLUSTER, rule, MONTH_HOURS, NODE, A)), [
    3,
    0.18,
    50_000,
    420_000,
  ]);
  assert.deepEqual(cents(tenantPart(CLUSTER, rule, MONTH_HOURS, NODE, B)), [
    1,
    0.06,
    20_000,
    140_000,
  ]);
});

Deno.test("tenantPart() by tokens: the same busy hours are split by share of tokens", () => {
  const rule = "tokens";
  assert.deepEqual(cents(tenantPart(CLUSTER, rule, MONTH_HOURS, NODE, A)), [
    1,
    0.06,
    20_000,
    140_000,
  ]);
  assert.deepEqual(cents(tenantPart(CLUSTER, rule, MONTH_HOURS, NODE, B)), [
    3,
    0.18,
    50_000,
    420_000,
  ]);
  // a node that processed no tokens (only failed requests): by busy time
  const noTokens = { ...NODE, tokens: 0 };
  assert.equal(
    tenantPart(CLUSTER, rule, MONTH_HOURS, noTokens, { ...A, tokens: 0 })
      .share,
    0.75,
  );
});

Deno.test("idlePart() is the provider's: the enrolled hours nobody kept busy, at hardware and idle-power rates; tenants' parts and idle add up to the node's cost", () => {
  const idle = idlePart(CLUSTER, MONTH_HOURS, NODE);
  // 716 h × 0.1389 = 99.44; 716 h × 10 W = 7.16 kWh × 0.30 = 2.148 → 2.15
  assert.deepEqual(cents(idle), [716, 7.16, 2_150_000, 99_440_000]);
  for (const rule of ["busy_time", "tokens"] as const) {
    const a = tenantPart(CLUSTER, rule, MONTH_HOURS, NODE, A);
    const b = tenantPart(CLUSTER, rule, MONTH_HOURS, NODE, B);
    const micro = (p: typeof a) => p.energyMicro + p.hardwareMicro;
    // 100.00 hardware + (0.24 kWh busy + 7.16 kWh idle) × 0.30 = 102.22
    assert.ok(Math.abs(micro(a) + micro(b) + micro(idle) - 102_220_000) < 1e-3);
    assert.equal(a.hours + b.hours + idle.hours, 720);
  }
});

Deno.test("tenantPart() caps busy hours at the enrolled hours, and a node enrolled mid-month costs only from then", () => {
  // enrolled 2 h, its requests add up to 8 h of request-time: 2 h are busy
  const node: NodeUse = { ...NODE, enrolledHours: 2, busyMs: 8 * HOUR };
  const a = tenantPart(CLUSTER, "busy_time", MONTH_HOURS, node, {
    ...A,
    busyMs: 6 * HOUR,
  });
  assert.equal(a.hours, 1.5);
  assert.equal(idlePart(CLUSTER, MONTH_HOURS, node).hours, 0);
});

Deno.test("a dedicated node's whole cost is its tenant's, busy or idle; other tenants and idle capacity get nothing", () => {
  const node: NodeUse = { ...NODE, dedicatedTo: "a" };
  for (const rule of ["busy_time", "tokens"] as const) {
    // 100.00 hardware; 0.24 + 7.16 = 7.4 kWh × 0.30 = 2.22 energy
    assert.deepEqual(cents(tenantPart(CLUSTER, rule, MONTH_HOURS, node, A)), [
      720,
      7.4,
      2_220_000,
      100_000_000,
    ]);
    assert.equal(tenantPart(CLUSTER, rule, MONTH_HOURS, node, B).share, 0);
  }
  assert.deepEqual(cents(idlePart(CLUSTER, MONTH_HOURS, node)), [0, 0, 0, 0]);
});
