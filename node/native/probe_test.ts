import assert from "node:assert/strict";
import { ensureNativeBuilt } from "./build.ts";
import { probe, type ProbeResult } from "./probe.ts";

const paths = await ensureNativeBuilt({ tests: true });

const SECTIONS = [
  "os",
  "machine",
  "cpu",
  "memory",
  "gpu",
  "thermal",
  "rdma",
  "interfaces",
] as const;

function assertShape(r: ProbeResult): void {
  assert.equal(r.schema, "orchard.probe/1");
  assert.equal(r.liborchard.abi, 1);
  for (const s of SECTIONS) {
    assert.ok(s in r, `section ${s} missing`);
    if (r[s] === null) {
      assert.ok(
        r.errors.some((e) => e.section === s),
        `section ${s} is null without an errors[] entry`,
      );
    }
  }
  assert.ok(Array.isArray(r.errors));
  assert.ok(r.duration_ms >= 0);
}

Deno.test("probe() returns orchard.probe/1 on Linux with RDMA reported unavailable, not as an error", async () => {
  const r = await probe();
  assertShape(r);
  assert.equal(r.os?.name, Deno.build.os === "darwin" ? "macOS" : "Linux");
  assert.ok((r.cpu?.logical_cores ?? 0) >= 1);
  assert.ok((r.memory?.total_bytes ?? 0) > 0);
  assert.ok(r.interfaces?.some((i) => i.loopback));
  if (Deno.build.os === "linux") {
    assert.equal(r.gpu, null);
    assert.deepEqual(
      r.errors.find((e) => e.section === "gpu")?.code,
      "unsupported",
    );
    assert.ok(r.rdma, "rdma section must be present");
    assert.equal(r.rdma.available, false);
    assert.equal(r.rdma.usable, false);
    assert.ok(r.rdma.reason);
    assert.equal(r.rdma.rdma_ctl, null);
    assert.ok(!r.errors.some((e) => e.section.startsWith("rdma")));
  }
});

Deno.test("probe({ isolate: true }) runs in the orchard-linktest child and returns the same schema", async () => {
  const r = await probe({ isolate: true, timeoutMs: 3000 });
  assertShape(r);
});

Deno.test("probe() rejects a bad timeout before doing work", async () => {
  await assert.rejects(() => probe({ timeoutMs: 0 }), RangeError);
});

Deno.test("repeated probes keep resident memory bounded", async () => {
  for (let i = 0; i < 20; i++) await probe(); // warm up allocators and caches
  const before = Deno.memoryUsage().rss;
  for (let i = 0; i < 1000; i++) await probe();
  const grown = Deno.memoryUsage().rss - before;
  // A leaked 2-3 KB probe document per call would add 2-3 MiB here.
  assert.ok(
    grown < 2 * 1024 * 1024,
    `RSS grew ${grown} bytes over 1000 probes`,
  );
});

const hasDouble = await Deno.stat(paths.fakeVerbs).then(
  () => true,
  () => false,
);

Deno.test({
  name:
    "probe() applies the usable rules to the fake verbs provider's Apple-like devices (test double)",
  ignore: !hasDouble,
}, async () => {
  const prior = Deno.env.get("ORCHARD_VERBS_LIB");
  Deno.env.set("ORCHARD_VERBS_LIB", paths.fakeVerbs);
  let r: ProbeResult;
  try {
    r = await probe();
  } finally {
    if (prior === undefined) Deno.env.delete("ORCHARD_VERBS_LIB");
    else Deno.env.set("ORCHARD_VERBS_LIB", prior);
  }
  assertShape(r);
  const rdma = r.rdma!;
  assert.equal(rdma.library.status, "loaded");
  assert.equal(rdma.library.source, "env ORCHARD_VERBS_LIB");
  assert.equal(rdma.library.link_test_capable, true);
  assert.equal(rdma.available, true);
  assert.equal(rdma.usable, true);
  const byName = new Map(rdma.devices.map((d) => [d.name, d]));
  const en2 = byName.get("rdma_en2")!, en3 = byName.get("rdma_en3")!;
  assert.equal(en2.transport, 100);
  assert.equal(en2.qp_type, "UC");
  assert.equal(en2.interface, "en2");
  assert.equal(en2.limits?.max_qp, 10);
  const p2 = en2.ports[0]!;
  assert.equal(p2.state, "ACTIVE");
  assert.equal(p2.active_mtu, 1024);
  assert.deepEqual(p2.gids?.map((g) => g.kind), ["link-local", "link-local"]);
  assert.equal(p2.usable, false);
  assert.equal(
    p2.reason,
    "no IPv4-mapped GID: give en2 its own IPv4 address or remove it from the Thunderbolt bridge",
  );
  const p3 = en3.ports[0]!;
  assert.equal(p3.usable, true);
  assert.equal(p3.reason, null);
  assert.equal(p3.gid_index, 1);
  assert.deepEqual(p3.gids?.[1], {
    index: 1,
    gid: "::ffff:10.0.0.2",
    kind: "ipv4-mapped",
    ipv4: "10.0.0.2",
  });
  const p4 = byName.get("rdma_en4")!.ports[0]!;
  assert.equal(p4.usable, false);
  assert.match(p4.reason ?? "", /not active/);
});
