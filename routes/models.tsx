/**
 * `/models` (platform admins only): which node serves which model, whether
 * it is loaded (or listed by its engine but not servable: the gateway
 * answers 503 for it), and the aliases clients may use.
 */
import { Hono } from "hono";
import { Badge, Card, Table } from "../components/ui.tsx";
import type { EngineModel } from "../node/engine.ts";
import { listNodes, type NodeDetail } from "../store/nodes.ts";
import { requirePlatform } from "../store/principal.ts";
import type { PortalEnv } from "./_env.ts";
import { page } from "./_page.tsx";

interface ModelRow {
  id: string;
  kind: EngineModel["kind"];
  aliases: Set<string>;
  contextLength: number | null;
  nodes: { node: NodeDetail; loaded: boolean; servable: boolean }[];
}

const TONE = {
  healthy: "ok",
  draining: "warn",
  drained: "warn",
  unhealthy: "danger",
} as const;

/** `/models`. */
export const modelsRoutes = new Hono<PortalEnv>().get("/", async (c) => {
  const p = c.get("principal")!;
  requirePlatform(p);
  const nodes = await listNodes(c.get("deps").store, p);
  const rows = new Map<string, ModelRow>();
  for (const n of nodes) {
    for (const m of n.status?.models ?? n.models) {
      let r = rows.get(m.id);
      if (!r) {
        r = {
          id: m.id,
          kind: m.kind,
          aliases: new Set(),
          contextLength: m.contextLength ?? null,
          nodes: [],
        };
        rows.set(m.id, r);
      }
      for (const a of m.aliases ?? []) r.aliases.add(a);
      r.nodes.push({
        node: n,
        loaded: m.loaded,
        servable: m.servable !== false,
      });
    }
  }
  const list = [...rows.values()].sort((a, b) => a.id.localeCompare(b.id));
  return page(
    c,
    "Models",
    "/models",
    (
      <>
        <h1>Models</h1>
        <p class="sub">
          Clients call a model by its id or an alias; the gateway routes to a
          healthy, undrained node serving it.
        </p>
        <Card>
          <Table
            head={["Model", "Kind", "Aliases", "Context", "Served by"]}
            rows={list.length}
            empty="No node serves a model yet."
          >
            {list.map((r) => (
              <tr key={r.id} data-model={r.id}>
                <td class="mono">{r.id}</td>
                <td>{r.kind}</td>
                <td class="mono">{[...r.aliases].join(", ") || "—"}</td>
                <td>{r.contextLength ?? "—"}</td>
                <td>
                  {r.nodes.map(({ node, loaded, servable }) => (
                    <div key={node.id}>
                      {node.name}{" "}
                      <Badge tone={TONE[node.state]}>{node.state}</Badge>{" "}
                      {!servable
                        ? <Badge tone="warn">listed, not servable</Badge>
                        : loaded
                        ? <Badge tone="ok">loaded</Badge>
                        : <Badge>not loaded</Badge>}
                    </div>
                  ))}
                </td>
              </tr>
            ))}
          </Table>
        </Card>
      </>
    ),
  );
});
