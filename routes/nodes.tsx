/**
 * `/nodes` (platform admins only): every node with its state, engine,
 * models, load, memory, GPU, thermal state, RDMA ports and last heartbeat;
 * drain, undrain and remove; join tokens with the command to run; and
 * `/nodes/events`, server-sent events with live state every ~2 s.
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { streamSSE } from "hono/streaming";
import { fmtBytes } from "../components/dashboard.tsx";
import { Island } from "../components/Island.tsx";
import {
  Alert,
  Badge,
  Card,
  Field,
  fmtTime,
  PostForm,
  Table,
} from "../components/ui.tsx";
import ConfirmSubmit from "../islands/ConfirmSubmit.tsx";
import CopyButton from "../islands/CopyButton.tsx";
import NodesLive from "../islands/NodesLive.tsx";
import { joinCommand } from "../fleet/join_command.ts";
import { NotFoundError, ServiceError } from "../store/errors.ts";
import { createJoinToken } from "../store/join_tokens.ts";
import {
  listNodes,
  type NodeDetail,
  removeNode,
  setNodeDedication,
  setNodeDrain,
} from "../store/nodes.ts";
import { requirePlatform } from "../store/principal.ts";
import { listTenants } from "../store/tenants.ts";
import { confirmed, confirmPage } from "./_confirm.tsx";
import type { PortalEnv } from "./_env.ts";
import {
  ago,
  type FleetPagesDeps,
  type Hardware,
  hardwareOf,
} from "./_fleet.ts";
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

/** Models the node's engine lists but cannot serve now (shown as a count: Exo lists every model card it knows). */
function unservable(n: NodeDetail): number {
  return (n.status?.models ?? n.models).filter((m) => m.servable === false)
    .length;
}

const DONE: Record<string, string> = {
  drain:
    "Node is draining: it takes no new requests and finishes what it is doing.",
  undrain: "Node is back in service.",
  remove: "Node removed.",
};

/** Longest a live stream stays open; the browser reconnects after. */
const STREAM_MAX_MS = 10 * 60_000;

/** A node's tenant dedication: who it serves, and the form to change it. */
function dedication(
  n: NodeDetail,
  csrf: string,
  tenants: { id: string; name: string }[],
) {
  const to = n.dedicatedTo ?? "";
  return (
    <PostForm action={`/nodes/${n.id}/dedication`} csrf={csrf} class="row">
      <select
        name="tenantId"
        aria-label={`Dedicate ${n.name} to`}
        data-field="dedication"
      >
        <option value="" selected={to === ""}>shared</option>
        {tenants.map((t) => (
          <option key={t.id} value={t.id} selected={t.id === to}>
            {t.name} only
          </option>
        ))}
      </select>
      <button type="submit" class="small">Save</button>
    </PostForm>
  );
}

/** "QP 3 of 10 in use, MR ? of 100": the ceilings Exo/MLX and Orchard share. */
function headroomText(h: Hardware["headroom"][number]): string {
  const one = (what: string, used: number | null, max: number | null) =>
    max === null
      ? `${what} limit unknown`
      : used === null
      ? `${what} max ${max} (in use unknown)`
      : `${what} ${used} of ${max} in use`;
  return `${one("QP", h.qpInUse, h.maxQp)}, ${one("MR", h.mrInUse, h.maxMr)}`;
}

function nodeRow(
  n: NodeDetail,
  csrf: string,
  now: number,
  tenants: { id: string; name: string }[],
) {
  const hw = hardwareOf(n.probe);
  const s = n.status?.stats;
  const mem = n.status?.memory;
  return (
    <tr key={n.id} data-node={n.id}>
      <td class="node-cell">
        <strong class="trunc" title={n.name}>{n.name}</strong>
        <div>
          <span class={`badge ${TONE[n.state]}`} data-field="state">
            {n.state}
          </span>{" "}
          <span class="muted">{n.engine}</span>
        </div>
        {hw.llama && (
          <div
            class="muted"
            data-field="llama-build"
            data-build={hw.llama.build}
            title={hw.llama.version ? `llama.cpp ${hw.llama.version}` : ""}
          >
            llama.cpp {hw.llama.tag ?? hw.llama.version ?? ""}{" "}
            {hw.llama.build === "built"
              ? `built, RPC${hw.llama.rdma ? " + RDMA" : ""}`
              : "prebuilt, no RPC"}
          </div>
        )}
        <div class="muted mono trunc" title={n.id}>{n.id}</div>
        <div class="muted mono trunc" title={n.url}>{n.url}</div>
        {n.reachable === false && (
          <div data-field="reachability">
            <Badge tone="danger">unreachable</Badge>{" "}
            <span class="muted">{n.reachability?.error}</span>
          </div>
        )}
      </td>
      <td class="models-cell">
        {(n.status?.models ?? n.models).filter((m) => m.servable !== false)
          .map((m) => (
            <div key={m.id} class="mono">
              <span class="trunc" title={m.id}>{m.id}</span>{" "}
              {m.loaded ? <Badge tone="ok">loaded</Badge> : null}
            </div>
          ))}
        {unservable(n) > 0 && (
          <div class="muted" data-field="unservable">
            {unservable(n)} more listed by its engine, not servable
          </div>
        )}
      </td>
      <td>
        <div class="load" data-field="load">
          {s ? `${s.inFlight} / ${s.slots} (+${s.queued} queued)` : "—"}
        </div>
        <div class="muted">
          <span class="num" data-field="tps">
            {s ? s.tokensPerSecond.toFixed(1) : "—"}
          </span>{" "}
          tokens/s
        </div>
      </td>
      <td>
        {mem
          ? `${fmtBytes(mem.freeBytes)} free of ${fmtBytes(mem.totalBytes)}`
          : "—"}
        {hw.memoryPressure && (
          <div class="muted">pressure {hw.memoryPressure}</div>
        )}
        <div>{hw.gpu ?? <span class="muted">no Metal GPU</span>}</div>
        {hw.cpu && <div class="muted">{hw.cpu}</div>}
        <div class="muted">thermal {hw.thermal ?? "—"}</div>
      </td>
      <td>
        {hw.ports.length === 0
          ? <span class="muted">{hw.rdma.reason ?? "no RDMA"}</span>
          : hw.ports.map((p) => (
            <div key={p.name}>
              <span class="mono">{p.name}</span> {p.usable
                ? <Badge tone="ok">usable</Badge>
                : <Badge tone="danger">unusable</Badge>}
              {p.reason && <div class="muted">{p.reason}</div>}
            </div>
          ))}
        {hw.headroom.map((h) => (
          <div
            key={h.device}
            class="muted"
            data-field="headroom"
            data-device={h.device}
          >
            <span class="mono">{h.device}</span>: {headroomText(h)}
          </div>
        ))}
      </td>
      <td class="time" data-field="heartbeat">
        {ago(n.status?.at ?? null, now)}
      </td>
      <td class="actions-cell">
        {dedication(n, csrf, tenants)}
        <div class="row" style="gap:6px;margin-top:6px">
          <PostForm
            action={`/nodes/${n.id}/${n.drain ? "undrain" : "drain"}`}
            csrf={csrf}
          >
            {n.drain
              ? (
                <button type="submit" class="small" data-action="undrain">
                  Undrain
                </button>
              )
              : (
                <Island
                  name="ConfirmSubmit"
                  component={ConfirmSubmit}
                  props={{
                    label: "Drain",
                    confirmLabel: "Yes, drain",
                    question: "It takes no new requests.",
                    action: "drain",
                  }}
                />
              )}
          </PostForm>
          <PostForm action={`/nodes/${n.id}/remove`} csrf={csrf}>
            <Island
              name="ConfirmSubmit"
              component={ConfirmSubmit}
              props={{
                label: "Remove",
                confirmLabel: "Yes, remove",
                question: "It must enroll again with a new join token.",
                action: "remove",
              }}
            />
          </PostForm>
        </div>
      </td>
    </tr>
  );
}

async function view(
  c: C,
  flash: Flash = {},
  error?: string,
  queued: number | null = null,
) {
  const p = c.get("principal")!;
  const nodes = await listNodes(c.get("deps").store, p);
  const instances = await listInstances(c.get("deps").store, p);
  const tenants = (await listTenants(c.get("deps").store, p, { limit: 200 }))
    .items.map((t) => ({ id: t.id, name: t.name }));
  const csrf = c.get("csrf");
  const now = Date.now();
  return page(
    c,
    "Nodes",
    "/nodes",
    (
      <>
        <h1>Nodes</h1>
        <p class="sub row" style="justify-content:space-between">
          <span>
            The Macs serving models, their hardware and load.
            {queued !== null && (
              <span data-field="gateway-queue" style="margin-left:6px">
                Waiting for a slot at this gateway: <strong>{queued}</strong>
                {queued > 0 &&
                  " (more nodes or slots would serve them sooner)"}.
              </span>
            )}
          </span>
          <Island
            name="NodesLive"
            component={NodesLive}
            props={{ src: "/nodes/events" }}
          />
        </p>
        <FlashMessages flash={flash} />
        <Card id="nodes">
          <FlashMessages flash={flash} section="nodes" />
          <div class="nodes-table">
            <Table
              head={[
                "Node",
                "Models",
                "Load",
                "Memory, GPU",
                "RDMA ports",
                "Heartbeat",
                "Serves, actions",
              ]}
              rows={nodes.length}
              empty="No nodes yet. Create a join token below and run the command on a Mac."
            >
              {nodes.map((n) => nodeRow(n, csrf, now, tenants))}
            </Table>
          </div>
        </Card>
        <InstancesCard
          instances={instances}
          names={new Map(nodes.map((n) => [n.id, n.name]))}
        />
        <Card title="Add a node" id="join">
          <FlashMessages flash={flash} section="join" />
          {error && <Alert tone="error">{error}</Alert>}
          {flash.command && (
            <>
              <Alert tone="warn">
                Run this on the new Mac, in a copy of Orchard with Deno
                installed (README, Nodes). It joins, then installs the node as a
                service. The token is shown only once and expires{" "}
                {fmtTime(flash.expires)}.
              </Alert>
              {flash.warn && <Alert tone="warn">{flash.warn}</Alert>}
              <div class="row" style="align-items:center;margin-bottom:14px">
                <code
                  class="cmd"
                  id="secret-value"
                  data-testid="join-command"
                  style="flex:1"
                >
                  {flash.command}
                </code>
                <Island
                  name="CopyButton"
                  component={CopyButton}
                  props={{ text: flash.command, label: "Copy command" }}
                />
              </div>
            </>
          )}
          <PostForm action="/nodes/join-tokens" csrf={csrf} class="row">
            <Field label="Uses" name="uses" type="number" min={1} value={1} />
            <Field
              label="Valid for (minutes)"
              name="ttlMinutes"
              type="number"
              min={1}
              value={60}
              hint="at most 1440"
            />
            <div class="field" style="flex:0">
              <button type="submit" class="primary">Create join token</button>
            </div>
          </PostForm>
        </Card>
      </>
    ),
    error ? 400 : 200,
  );
}

/** Builds `/nodes` (mounted by orchard.ts with the fleet). */
export function createNodesPages(deps: FleetPagesDeps): Hono<PortalEnv> {
  const interval = deps.liveIntervalMs ?? 2000;
  const QUESTION = {
    drain: "It takes no new requests and finishes what it is doing.",
    remove: "It must enroll again with a new join token.",
  };
  const action = (
    name: "drain" | "undrain" | "remove",
    fn: (c: C) => Promise<unknown>,
  ) =>
  async (c: C) => {
    const p = c.get("principal")!;
    requirePlatform(p);
    if (name !== "undrain" && !(await confirmed(c))) {
      const id = c.req.param("id")!;
      const n = (await listNodes(c.get("deps").store, p)).find((n) =>
        n.id === id
      );
      if (!n) throw new NotFoundError("Node");
      const verb = name === "drain" ? "Drain" : "Remove";
      return confirmPage(c, {
        title: `${verb} ${n.name}?`,
        question: QUESTION[name],
        confirmLabel: `Yes, ${name}`,
        action: `/nodes/${n.id}/${name}`,
        back: "/nodes#nodes",
        active: "/nodes",
      });
    }
    await fn(c);
    await deps.fleet.refresh();
    return await redirectWithFlash(c, "/nodes#nodes", {
      section: "nodes",
      ok: DONE[name],
    });
  };
  const toPage = (section: string) => (c: C) =>
    c.redirect(`/nodes#${section}`, 303);
  return new Hono<PortalEnv>()
    .use("*", async (c, next) => {
      requirePlatform(c.get("principal")!);
      await next();
    })
    .get(
      "/",
      async (c) =>
        view(c, await takeFlash(c), undefined, deps.queued?.() ?? null),
    )
    .get("/:id/drain", toPage("nodes"))
    .get("/:id/undrain", toPage("nodes"))
    .get("/:id/remove", toPage("nodes"))
    .get("/:id/dedication", toPage("nodes"))
    .post("/:id/dedication", async (c) => {
      const body = await c.req.parseBody();
      const tenantId = str(body.tenantId) || null;
      const n = await setNodeDedication(
        c.get("deps").store,
        c.get("principal")!,
        c.req.param("id")!,
        tenantId,
      );
      await deps.fleet.refresh();
      return await redirectWithFlash(c, "/nodes#nodes", {
        section: "nodes",
        ok: tenantId
          ? `${n.name} now serves that tenant alone.`
          : `${n.name} is shared again.`,
      });
    })
    .get("/join-tokens", toPage("join"))
    .post(
      "/:id/drain",
      action(
        "drain",
        (c) =>
          setNodeDrain(
            c.get("deps").store,
            c.get("principal")!,
            c.req.param("id")!,
            true,
          ),
      ),
    )
    .post(
      "/:id/undrain",
      action(
        "undrain",
        (c) =>
          setNodeDrain(
            c.get("deps").store,
            c.get("principal")!,
            c.req.param("id")!,
            false,
          ),
      ),
    )
    .post(
      "/:id/remove",
      action(
        "remove",
        (c) =>
          removeNode(
            c.get("deps").store,
            c.get("principal")!,
            c.req.param("id")!,
          ),
      ),
    )
    .post("/join-tokens", async (c) => {
      const body = await c.req.parseBody();
      const uses = Number(str(body.uses) || "1");
      const minutes = Number(str(body.ttlMinutes) || "60");
      try {
        const { token, joinToken } = await createJoinToken(
          c.get("deps").store,
          c.get("principal")!,
          { uses, ttlSeconds: Math.round(minutes * 60) },
        );
        const join = joinCommand(
          c.get("deps").config.publicUrl,
          token,
          c.req.url,
        );
        return await redirectWithFlash(c, "/nodes#join", {
          section: "join",
          ok: "Join token created.",
          command: join.command,
          warn: join.warning,
          expires: joinToken.expiresAt,
        });
      } catch (err) {
        if (!(err instanceof ServiceError) || err.status !== 400) throw err;
        const msg = /^ttlSeconds\b/.test(err.field ?? "")
          ? "Valid for: must be 1 to 1440 minutes"
          : /^uses\b/.test(err.field ?? "")
          ? "Uses: must be a whole number from 1 to 1000"
          : portalMessage(err);
        return await view(c, {}, msg);
      }
    })
    .get("/events", (c) =>
      streamSSE(c, async (stream) => {
        let open = true;
        stream.onAbort(() => {
          open = false;
        });
        const until = Date.now() + STREAM_MAX_MS;
        while (open && Date.now() < until) {
          const now = Date.now();
          const nodes = deps.fleet.nodes().map((n) => ({
            id: n.id,
            state: n.state,
            inFlight: n.stats.inFlight,
            queued: n.stats.queued,
            slots: n.stats.slots,
            tokensPerSecond: n.stats.tokensPerSecond,
            lastHeartbeat: ago(n.lastHeartbeatAt, now),
          }));
          await stream.writeSSE({
            event: "nodes",
            data: JSON.stringify(nodes),
          });
          await stream.sleep(interval);
        }
      }));
}
