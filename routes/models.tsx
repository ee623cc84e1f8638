/**
 * `/models` (platform admins only): where each model runs (its replicas,
 * their health, loaded and pinned), nodes whose models differ from their
 * placement, the aliases clients may use; and the forms that place models
 * on nodes (per node, or by rule over the facts nodes report) and set the
 * operator's aliases. Forms are POST/redirect/GET (routes/_flash.tsx).
 */
import { type Context, Hono } from "hono";
import { Alert, Badge, Card, PostForm, Table } from "../components/ui.tsx";
import type { PlacementRule } from "../fleet/placement.ts";
import { ENGINE_KINDS } from "../protocol/engine.ts";
import type { PlacedModel } from "../protocol/placement.ts";
import { ServiceError } from "../store/errors.ts";
import { type ModelsView, modelsView } from "../store/model_overview.ts";
import {
  addPlacementRule,
  removeModelSpan,
  removePlacementRule,
  setModelAlias,
  setModelSpan,
  setNodePlacement,
} from "../store/placement.ts";
import { requirePlatform } from "../store/principal.ts";
import type { PortalEnv } from "./_env.ts";
import type { FleetPagesDeps } from "./_fleet.ts";
import {
  type Flash,
  FlashMessages,
  redirectWithFlash,
  takeFlash,
} from "./_flash.tsx";
import { portalMessage } from "./_messages.ts";
import { page, str } from "./_page.tsx";
import { InstancesCard } from "../components/instances.tsx";
import { listInstances } from "../store/spanning_instances.ts";

type C = Context<PortalEnv>;

const TONE = {
  healthy: "ok",
  draining: "warn",
  drained: "warn",
  unhealthy: "danger",
} as const;

/** "a, b" from a form field: model ids, trimmed, without empties. */
function ids(raw: string): string[] {
  return raw.split(/[\s,]+/).map((s) => s.trim()).filter(Boolean);
}

function placedText(list: PlacedModel[] | null | undefined): string {
  if (!list) return "—";
  if (!list.length) return "nothing";
  return list.map((m) => m.pinned ? `${m.id} (pinned)` : m.id).join(", ");
}

function ruleText(r: PlacementRule): string {
  const when = [
    r.minMemoryGb !== undefined ? `memory ≥ ${r.minMemoryGb} GB` : null,
    r.engine ? `engine ${r.engine}` : null,
    r.os ? `os ${r.os}` : null,
    r.arch ? `arch ${r.arch}` : null,
  ].filter(Boolean);
  return `${when.length ? `every node with ${when.join(", ")}` : "every node"}`;
}

function modelsTable(v: ModelsView) {
  return (
    <Table
      head={["Model", "Kind", "Aliases", "Context", "Replicas", "Where"]}
      rows={v.models.length}
      empty="No node serves a model yet."
    >
      {v.models.map((r) => (
        <tr key={r.id} data-model={r.id}>
          <td class="mono">{r.id}</td>
          <td>{r.kind ?? "—"}</td>
          <td class="mono" data-field="aliases">
            {r.aliases.join(", ") || "—"}
          </td>
          <td>{r.contextLength ?? "—"}</td>
          <td data-field="replicas">
            <Badge tone={r.healthyReplicas ? "ok" : "danger"}>
              {r.healthyReplicas} healthy
            </Badge>{" "}
            of {r.replicas.length}
          </td>
          <td>
            {r.replicas.map((x) => (
              <div key={x.nodeId} data-replica={x.nodeId}>
                {x.nodeName} <Badge tone={TONE[x.state]}>{x.state}</Badge>{" "}
                {!x.servable
                  ? (
                    <Badge tone="warn">
                      {x.placed === false ? "not placed here" : "not servable"}
                    </Badge>
                  )
                  : x.loaded
                  ? <Badge tone="ok">loaded</Badge>
                  : <Badge>not loaded</Badge>}
                {x.pinned && <Badge>pinned</Badge>}
                {x.problem && <span class="muted">{x.problem}</span>}
              </div>
            ))}
          </td>
        </tr>
      ))}
    </Table>
  );
}

function placementCard(v: ModelsView, csrf: string) {
  return (
    <Card title="Placement" id="placement">
      <p class="muted">
        Which models each node serves. Pinned models are loaded at once and
        never unloaded when idle; on a llama node, models not placed are
        unloaded and not served. A node that fronts another engine cannot load
        or unload: it reports the difference. Without any entry or matching
        rule, a node serves every model it has.
      </p>
      <Table
        head={["Node", "Its own entries", "Desired (entries and rules)"]}
        rows={v.nodes.length}
        empty="No node has joined yet."
      >
        {v.nodes.map((n) => {
          const own = v.placement.nodes[n.id] ?? [];
          return (
            <tr key={n.id} data-placement-node={n.id}>
              <td>
                {n.name} <span class="muted">{n.engine}</span>
              </td>
              <td>
                <PostForm
                  action={`/models/nodes/${n.id}/placement`}
                  csrf={csrf}
                  class="row"
                >
                  <input
                    name="models"
                    aria-label={`Models ${n.name} serves`}
                    placeholder="model ids"
                    value={own.map((m) => m.id).join(", ")}
                    maxLength={4000}
                  />
                  <input
                    name="pinned"
                    aria-label={`Models ${n.name} keeps loaded`}
                    placeholder="pinned"
                    value={own.filter((m) => m.pinned).map((m) => m.id)
                      .join(", ")}
                    maxLength={4000}
                  />
                  <button type="submit" class="small">Save</button>
                </PostForm>
              </td>
              <td data-field="desired">{placedText(v.desired[n.id])}</td>
            </tr>
          );
        })}
      </Table>
      <h3>Rules</h3>
      <Table
        head={["Model", "Where", ""]}
        rows={v.placement.rules.length}
        empty="No rules."
      >
        {v.placement.rules.map((r) => (
          <tr key={r.id} data-rule={r.id}>
            <td class="mono">
              {r.model} {r.pinned && <Badge>pinned</Badge>}
            </td>
            <td>{ruleText(r)}</td>
            <td>
              <PostForm action={`/models/rules/${r.id}/remove`} csrf={csrf}>
                <button type="submit" class="small">Remove</button>
              </PostForm>
            </td>
          </tr>
        ))}
      </Table>
      <PostForm action="/models/rules" csrf={csrf} class="row">
        <input name="model" aria-label="Rule model" placeholder="model id" />
        <input
          name="minMemoryGb"
          type="number"
          min={0}
          step="any"
          aria-label="Least memory, GB"
          placeholder="memory ≥ GB"
        />
        <select name="engine" aria-label="Engine">
          <option value="">any engine</option>
          {ENGINE_KINDS.map((e) => <option key={e} value={e}>{e}</option>)}
        </select>
        <label>
          <input type="checkbox" name="pinned" value="1" /> pinned
        </label>
        <button type="submit" class="small">Add rule</button>
      </PostForm>
    </Card>
  );
}

/** Models placed across several nodes (ggml RPC): the list and the form. */
function spansCard(v: ModelsView, csrf: string) {
  const spans = v.placement.spans ?? [];
  const name = (id: string) => v.nodes.find((n) => n.id === id)?.name ?? id;
  return (
    <Card title="Across several nodes" id="spans">
      <p class="muted">
        A model too big for one node: the head (it needs the model's file) loads
        it across its own memory and the workers' through llama.cpp's RPC
        backend, and serves every request; the workers lend their memory only
        while placed. The gateway refuses nodes whose free memory cannot hold
        the weights and the KV cache.
      </p>
      <Table
        head={["Model", "Instance", "Head", "Workers", "Split", ""]}
        rows={spans.length}
        empty="No model spans several nodes."
      >
        {spans.map((sp) => (
          <tr key={sp.id} data-span={sp.model}>
            <td class="mono">{sp.model}</td>
            <td class="mono">rpc:{sp.id}</td>
            <td>{name(sp.nodes[0]!)}</td>
            <td>{sp.nodes.slice(1).map(name).join(", ")}</td>
            <td>{sp.split ? sp.split.join(" : ") : "by free memory"}</td>
            <td>
              <PostForm action="/models/spans/remove" csrf={csrf}>
                <input type="hidden" name="model" value={sp.model} />
                <button type="submit" class="small">Remove</button>
              </PostForm>
            </td>
          </tr>
        ))}
      </Table>
      <PostForm action="/models/spans" csrf={csrf} class="row">
        <input name="model" aria-label="Span model" placeholder="model id" />
        <select name="head" aria-label="Head node">
          <option value="">head node</option>
          {v.nodes.map((n) => <option key={n.id} value={n.id}>{n.name}
          </option>)}
        </select>
        <select
          name="workers"
          multiple
          aria-label="Worker nodes"
          size={Math.min(4, Math.max(2, v.nodes.length))}
        >
          {v.nodes.map((n) => <option key={n.id} value={n.id}>{n.name}
          </option>)}
        </select>
        <input
          name="split"
          aria-label="Split"
          placeholder="split, e.g. 2,1 (optional)"
        />
        <button type="submit" class="small">Place across</button>
      </PostForm>
    </Card>
  );
}

function aliasesCard(v: ModelsView, csrf: string) {
  const list = Object.entries(v.aliases).sort(([a], [b]) => a < b ? -1 : 1);
  return (
    <Card title="Aliases" id="aliases">
      <p class="muted">
        A name clients may use for a model: the gateway resolves it and lists it
        in <span class="mono">/v1/models</span>.
      </p>
      <Table head={["Alias", "Model", ""]} rows={list.length} empty="None.">
        {list.map(([alias, model]) => (
          <tr key={alias} data-alias={alias}>
            <td class="mono">{alias}</td>
            <td class="mono">{model}</td>
            <td>
              <PostForm action="/models/aliases/remove" csrf={csrf}>
                <input type="hidden" name="alias" value={alias} />
                <button type="submit" class="small">Remove</button>
              </PostForm>
            </td>
          </tr>
        ))}
      </Table>
      <PostForm action="/models/aliases" csrf={csrf} class="row">
        <input name="alias" aria-label="Alias" placeholder="alias" />
        <input name="model" aria-label="Alias model" placeholder="model id" />
        <button type="submit" class="small">Set alias</button>
      </PostForm>
    </Card>
  );
}

async function view(c: C, flash: Flash = {}, error?: string) {
  const v = await modelsView(c.get("deps").store, c.get("principal")!);
  const instances = await listInstances(
    c.get("deps").store,
    c.get("principal")!,
  );
  const csrf = c.get("csrf");
  return page(
    c,
    "Models",
    "/models",
    <>
      <h1>Models</h1>
      <p class="sub">
        Clients call a model by its id or an alias; the gateway routes to a
        healthy, undrained node serving it.
      </p>
      <FlashMessages flash={flash} />
      {error && <Alert tone="error">{error}</Alert>}
      {v.mismatches.length > 0 && (
        <Card title="Placement mismatches" id="mismatches">
          {v.mismatches.map((m) => (
            <Alert key={m.nodeId} tone="warn">
              <strong>{m.nodeName}</strong> ({m.engine}):{" "}
              <span data-mismatch={m.nodeId}>{m.mismatch}</span>
            </Alert>
          ))}
        </Card>
      )}
      <Card>{modelsTable(v)}</Card>
      <InstancesCard instances={instances} />
      {placementCard(v, csrf)}
      {spansCard(v, csrf)}
      {aliasesCard(v, csrf)}
    </>,
    error ? 400 : 200,
  );
}

/** `/models` and its forms. */
export function createModelsPages(deps: Pick<FleetPagesDeps, "fleet">) {
  /** Runs a change, then redirects with its message; a 400/404/409 renders the page with it. */
  const act = (
    section: string,
    fn: (c: C, body: Record<string, string>) => Promise<string>,
  ) =>
  async (c: C) => {
    const raw = await c.req.parseBody();
    const body: Record<string, string> = {};
    for (const [k, v] of Object.entries(raw)) body[k] = str(v);
    try {
      const ok = await fn(c, body);
      await deps.fleet.refresh();
      return await redirectWithFlash(c, `/models#${section}`, { ok });
    } catch (err) {
      if (!(err instanceof ServiceError) || err.status >= 500) throw err;
      if (err.status === 401 || err.status === 403) throw err;
      return await view(c, {}, portalMessage(err));
    }
  };
  const toPage = (section: string) => (c: C) =>
    c.redirect(`/models#${section}`, 303);
  return new Hono<PortalEnv>()
    .use("*", async (c, next) => {
      requirePlatform(c.get("principal")!);
      await next();
    })
    .get("/", async (c) => view(c, await takeFlash(c)))
    .get("/nodes/:id/placement", toPage("placement"))
    .post(
      "/nodes/:id/placement",
      act("placement", async (c, b) => {
        const pinned = new Set(ids(b.pinned ?? ""));
        const models = [...new Set([...ids(b.models ?? ""), ...pinned])];
        await setNodePlacement(
          c.get("deps").store,
          c.get("principal")!,
          c.req.param("id")!,
          { models: models.map((id) => ({ id, pinned: pinned.has(id) })) },
        );
        return "Placement saved; the node applies it with its next heartbeat.";
      }),
    )
    .get("/rules", toPage("placement"))
    .post(
      "/rules",
      act("placement", async (c, b) => {
        await addPlacementRule(c.get("deps").store, c.get("principal")!, {
          model: b.model ?? "",
          pinned: b.pinned === "1",
          ...(b.minMemoryGb ? { minMemoryGb: Number(b.minMemoryGb) } : {}),
          ...(b.engine ? { engine: b.engine } : {}),
        });
        return "Rule added.";
      }),
    )
    .get("/rules/:id/remove", toPage("placement"))
    .post(
      "/rules/:id/remove",
      act("placement", async (c) => {
        await removePlacementRule(
          c.get("deps").store,
          c.get("principal")!,
          c.req.param("id")!,
        );
        return "Rule removed.";
      }),
    )
    .get("/spans", toPage("spans"))
    .post("/spans", async (c) => {
      // several workers: a multiple select sends the field once per choice
      const raw = await c.req.parseBody({ all: true });
      const workers = [raw.workers ?? []].flat().map((w) => str(w));
      return await act("spans", async (c, b) => {
        const split = ids(b.split ?? "").map(Number);
        await setModelSpan(
          c.get("deps").store,
          c.get("principal")!,
          b.model ?? "",
          {
            nodes: [b.head ?? "", ...workers].filter(Boolean),
            ...(split.length ? { split } : {}),
          },
        );
        return `${b.model} placed across ${
          1 + workers.length
        } nodes; the head loads it once every worker listens.`;
      })(c);
    })
    .get("/spans/remove", toPage("spans"))
    .post(
      "/spans/remove",
      act("spans", async (c, b) => {
        await removeModelSpan(
          c.get("deps").store,
          c.get("principal")!,
          b.model ?? "",
        );
        return `${b.model} no longer spans several nodes.`;
      }),
    )
    .get("/aliases", toPage("aliases"))
    .post(
      "/aliases",
      act("aliases", async (c, b) => {
        await setModelAlias(
          c.get("deps").store,
          c.get("principal")!,
          b.alias ?? "",
          { model: b.model ?? "" },
        );
        return `Alias ${b.alias} set.`;
      }),
    )
    .get("/aliases/remove", toPage("aliases"))
    .post(
      "/aliases/remove",
      act("aliases", async (c, b) => {
        await setModelAlias(
          c.get("deps").store,
          c.get("principal")!,
          b.alias ?? "",
          null,
        );
        return `Alias ${b.alias} removed.`;
      }),
    );
}
