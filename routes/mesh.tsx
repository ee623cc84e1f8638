/**
 * `/mesh` (platform admins only): the latest link test of every node pair
 * (transport, one-way latency, bandwidth, age) coloured against Thunderbolt
 * 5 thresholds, "test all pairs" with progress, what went wrong in words
 * (failures and TCP fallbacks), and cabling findings from each node's probe
 * (fleet/cabling.ts) with their fixes.
 */
import { Hono } from "hono";
import { diagnoseCabling } from "../fleet/cabling.ts";
import { Island } from "../components/Island.tsx";
import { Card, PostForm } from "../components/ui.tsx";
import MeshRunner from "../islands/MeshRunner.tsx";
import {
  type LinkTestRecord,
  listLinkTests,
  listNodes,
} from "../store/nodes.ts";
import { requirePlatform } from "../store/principal.ts";
import type { PortalEnv } from "./_env.ts";
import { ago, type FleetPagesDeps, linkCell } from "./_fleet.ts";
import { FlashMessages, redirectWithFlash, takeFlash } from "./_flash.tsx";
import { page } from "./_page.tsx";
import { InstancesCard } from "../components/instances.tsx";
import { listInstances } from "../store/spanning_instances.ts";

const LABEL = { ok: "healthy", warn: "degraded", bad: "poor" } as const;

/** Builds `/mesh` (mounted by orchard.ts with the link-test runner). */
export function createMeshPages(deps: FleetPagesDeps): Hono<PortalEnv> {
  return new Hono<PortalEnv>()
    .use("*", async (c, next) => {
      requirePlatform(c.get("principal")!);
      await next();
    })
    .get("/", async (c) => {
      const store = c.get("deps").store;
      const p = c.get("principal")!;
      const [nodes, tests, instances] = await Promise.all([
        listNodes(store, p),
        listLinkTests(store, p),
        listInstances(store, p),
      ]);
      const latest = new Map<string, LinkTestRecord>();
      for (const t of tests) {
        const id = [t.a, t.b].sort().join("|");
        const seen = latest.get(id);
        if (!seen || seen.at < t.at) latest.set(id, t);
      }
      const nameOf = new Map(nodes.map((n) => [n.id, n.name]));
      const pairName = (t: LinkTestRecord) =>
        `${nameOf.get(t.a) ?? t.a} ↔ ${nameOf.get(t.b) ?? t.b}`;
      const findings = [...latest.values()].flatMap((t) => {
        const fallback = (t.result as { fallback_reason?: unknown } | null)
          ?.fallback_reason;
        if (!t.ok) {
          return [{ pair: pairName(t), what: "failed", text: t.error ?? "" }];
        }
        return typeof fallback === "string" && fallback &&
            fallback !== "transport tcp requested"
          ? [{ pair: pairName(t), what: "fell back to TCP", text: fallback }]
          : [];
      });
      const cabling = nodes.map((n) => ({
        node: n.name,
        issues: diagnoseCabling(n.probe),
      })).filter((x) => x.issues.length > 0);
      const progress = deps.links.progress();
      const now = Date.now();
      const flash = await takeFlash(c);
      return page(
        c,
        "RDMA mesh",
        "/mesh",
        (
          <>
            <h1>RDMA mesh</h1>
            <p class="sub">
              Latest link test per node pair: transport, one-way latency (p50),
              bandwidth and age. Healthy: ≤ 10 µs and ≥ 7 GB/s (one TB5 cable);
              poor: above 25 µs or under 4 GB/s.
            </p>
            <FlashMessages flash={flash} />
            <Card>
              <div class="row" style="align-items:center">
                <PostForm action="/mesh/test-all" csrf={c.get("csrf")}>
                  <button
                    type="submit"
                    class="primary"
                    disabled={progress.running}
                  >
                    Test all pairs
                  </button>
                </PostForm>
                <div style="flex:1">
                  <Island
                    name="MeshRunner"
                    component={MeshRunner}
                    props={{
                      running: progress.running,
                      done: progress.done,
                      total: progress.total,
                      failed: progress.failed,
                    }}
                  />
                </div>
              </div>
            </Card>
            <Card>
              {nodes.length < 2
                ? <p class="muted">At least two nodes are needed for a mesh.</p>
                : (
                  <div class="table-wrap">
                    <table class="mesh" data-testid="mesh">
                      <thead>
                        <tr>
                          <th></th>
                          {nodes.map((n) => <th key={n.id}>{n.name}</th>)}
                        </tr>
                      </thead>
                      <tbody>
                        {nodes.map((a) => (
                          <tr key={a.id}>
                            <th>{a.name}</th>
                            {nodes.map((b) => {
                              if (a.id === b.id) {
                                return <td key={b.id} class="cell self">—</td>;
                              }
                              const rec = latest.get(
                                [a.id, b.id].sort().join("|"),
                              );
                              if (!rec) {
                                return (
                                  <td key={b.id} class="cell none">
                                    not tested
                                  </td>
                                );
                              }
                              const cell = linkCell(rec);
                              return (
                                <td
                                  key={b.id}
                                  class={`cell ${cell.health}`}
                                  data-pair={`${a.id}|${b.id}`}
                                  data-health={cell.health}
                                  title={cell.error ?? LABEL[cell.health]}
                                >
                                  {rec.ok
                                    ? (
                                      <>
                                        <div>{cell.transport ?? "?"}</div>
                                        <div>
                                          {cell.latencyUs === null
                                            ? "—"
                                            : `${cell.latencyUs.toFixed(1)} µs`}
                                        </div>
                                        <div>
                                          {cell.gbPerSec === null
                                            ? "— GB/s"
                                            : `${
                                              cell.gbPerSec.toFixed(2)
                                            } GB/s`}
                                        </div>
                                      </>
                                    )
                                    : <div>failed</div>}
                                  <div class="muted">{ago(cell.at, now)}</div>
                                </td>
                              );
                            })}
                          </tr>
                        ))}
                      </tbody>
                    </table>
                  </div>
                )}
              {findings.length > 0 && (
                <ul data-testid="link-findings">
                  {findings.map((f) => (
                    <li key={f.pair}>
                      <strong>{f.pair}</strong> {f.what}: {f.text}
                    </li>
                  ))}
                </ul>
              )}
            </Card>
            <Card>
              <h3>Cabling</h3>
              {cabling.length === 0
                ? (
                  <p class="muted">
                    No cabling problems found in the nodes' probes (Thunderbolt
                    5 links, no DHCP on Thunderbolt, one subnet per cable, no
                    overlap with Ethernet).
                  </p>
                )
                : (
                  <ul data-testid="cabling">
                    {cabling.flatMap((c) =>
                      c.issues.map((i) => (
                        <li
                          key={`${c.node}|${i.code}|${i.where.join(",")}`}
                          data-code={i.code}
                        >
                          <strong>{c.node}</strong>: {i.message}
                          <div class="muted">Fix: {i.fix}</div>
                        </li>
                      ))
                    )}
                  </ul>
                )}
            </Card>
            <InstancesCard instances={instances} names={nameOf} />
          </>
        ),
      );
    })
    .post("/test-all", async (c) => {
      const p = c.get("principal")!;
      const nodes = await listNodes(c.get("deps").store, p);
      const ids = nodes.filter((n) => n.state === "healthy").map((n) => n.id);
      if (!deps.links.startAll(p, ids)) {
        return await redirectWithFlash(c, "/mesh", {
          warn: "A run is already in progress.",
        });
      }
      return await redirectWithFlash(c, "/mesh", {
        ok: `Testing all pairs of ${ids.length} healthy nodes.`,
      });
    })
    .get("/test-all", (c) => c.redirect("/mesh", 303))
    .get("/progress", (c) => c.json(deps.links.progress()));
}
