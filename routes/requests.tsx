/**
 * `/tenants/:id/requests`: the tenant's request log (store/request_log.ts),
 * newest first, filterable by key, status class, model, node and time
 * (UTC). Tenant admins and viewers see their own tenant's; platform admins
 * any tenant's. Never prompt text or secrets: the records hold neither.
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { fmtInt } from "../components/dashboard.tsx";
import {
  Alert,
  Badge,
  Card,
  FilterRangeAndButtons,
  Pager,
  Table,
} from "../components/ui.tsx";
import { listApiKeys } from "../store/api_keys.ts";
import { ServiceError } from "../store/errors.ts";
import { isPlatform } from "../store/principal.ts";
import {
  getRequestLogSettings,
  listRequestLog,
  parseRequestLogQuery,
  type RequestLogPage,
  STATUS_CLASSES,
} from "../store/request_log.ts";
import { getTenant } from "../store/tenants.ts";
import type { UsageRecord } from "../store/usage.ts";
import type { PortalEnv } from "./_env.ts";
import { portalMessage } from "./_messages.ts";
import { page } from "./_page.tsx";

type C = Context<PortalEnv>;

const FILTERS = ["key", "status", "model", "node", "from", "to"] as const;

function time(iso: string): string {
  return iso.slice(0, 19).replace("T", " ");
}

function ms(v: number | null): string {
  return v === null
    ? "—"
    : v < 10_000
    ? `${v} ms`
    : `${(v / 1000).toFixed(1)} s`;
}

function StatusBadge(props: { r: UsageRecord }) {
  const s = props.r.status;
  const tone = s >= 500
    ? "danger"
    : s >= 400
    ? "warn"
    : props.r.outcome === "ok"
    ? "ok"
    : "danger";
  return <Badge tone={tone}>{s}</Badge>;
}

async function view(c: C) {
  const store = c.get("deps").store;
  const p = c.get("principal")!;
  const tenant = await getTenant(store, p, c.req.param("id")!);
  const q = c.req.query();
  const raw: Record<string, string> = {};
  for (const f of FILTERS) raw[f] = (q[f] ?? "").slice(0, 300);
  let data: RequestLogPage = {
    items: [],
    cursor: null,
    partial: false,
    searchedTo: null,
  };
  let error: string | null = null;
  try {
    data = await listRequestLog(
      store,
      p,
      tenant.id,
      parseRequestLogQuery({ ...raw, cursor: q.cursor, limit: "50" }),
    );
  } catch (err) {
    if (!(err instanceof ServiceError) || err.status !== 400) throw err;
    error = portalMessage(err);
  }
  const [keys, settings] = await Promise.all([
    listApiKeys(store, p, tenant.id, { limit: 200 }),
    getRequestLogSettings(store),
  ]);
  const keyNames = new Map(keys.items.map((k) => [k.id, k.name]));
  const models = [...new Set(data.items.map((r) => r.model).filter(Boolean))];
  const nodes = [
    ...new Set(data.items.flatMap((r) => r.nodeId ? [r.nodeId] : [])),
  ];
  const qs = new URLSearchParams();
  for (const f of FILTERS) if (raw[f]) qs.set(f, raw[f]!);
  const base = `/tenants/${tenant.id}/requests`;
  const next = data.cursor
    ? `${base}?${new URLSearchParams([...qs, ["cursor", data.cursor]])}`
    : null;
  const filterLink = (name: string, value: string) => {
    const u = new URLSearchParams(qs);
    u.set(name, value);
    return `${base}?${u}`;
  };
  return page(
    c,
    `Requests · ${tenant.name}`,
    isPlatform(p) ? "/tenants" : `/tenants/${tenant.id}`,
    (
      <>
        <h1>Request log</h1>
        <p class="sub">
          <a href={`/tenants/${tenant.id}`}>{tenant.name}</a>{" "}
          · recent requests, newest first, kept {settings.retentionDays}{" "}
          days. Times are UTC; no prompt text is ever logged.
        </p>
        <Card>
          <form
            method="get"
            action={base}
            class="row"
            id="log-filter"
            style="align-items:flex-end"
          >
            <div class="field">
              <label for="l-key">API key</label>
              <select id="l-key" name="key">
                <option value="">All keys</option>
                {keys.items.map((k) => (
                  <option key={k.id} value={k.id} selected={k.id === raw.key}>
                    {k.name}
                  </option>
                ))}
              </select>
            </div>
            <div class="field">
              <label for="l-status">Status</label>
              <select id="l-status" name="status">
                <option value="">Any</option>
                {STATUS_CLASSES.map((s) => (
                  <option key={s} value={s} selected={s === raw.status}>
                    {s}
                  </option>
                ))}
              </select>
            </div>
            <div class="field">
              <label for="l-model">Model</label>
              <input
                id="l-model"
                name="model"
                list="l-models"
                value={raw.model}
              />
              <datalist id="l-models">
                {models.map((m) => <option key={m} value={m} />)}
              </datalist>
            </div>
            <div class="field">
              <label for="l-node">Node id</label>
              <input id="l-node" name="node" list="l-nodes" value={raw.node} />
              <datalist id="l-nodes">
                {nodes.map((n) => <option key={n} value={n} />)}
              </datalist>
            </div>
            <FilterRangeAndButtons
              idPrefix="l"
              from={raw.from}
              to={raw.to}
              clearHref={base}
            />
          </form>
          {error && <Alert tone="error">{error}</Alert>}
          <Table
            head={[
              "Time",
              "Key",
              "Status",
              "Model",
              "Node",
              "Tokens in / out",
              "Latency / first byte",
              "Error / notes",
            ]}
            rows={data.items.length}
            empty={qs.size > 0
              ? "No requests match these filters."
              : "No requests yet."}
          >
            {data.items.map((r) => (
              <tr key={r.id} data-request={r.requestId} data-status={r.status}>
                <td class="mono nowrap" title={r.requestId}>{time(r.at)}</td>
                <td>
                  <a href={filterLink("key", r.keyId)}>
                    {keyNames.get(r.keyId) ?? r.keyId.slice(0, 8)}
                  </a>
                </td>
                <td>
                  <StatusBadge r={r} />
                </td>
                <td class="mono">
                  {r.model
                    ? <a href={filterLink("model", r.model)}>{r.model}</a>
                    : "—"}
                </td>
                <td class="mono" title={r.nodeId ?? ""}>
                  {r.nodeId
                    ? (
                      <a href={filterLink("node", r.nodeId)}>
                        {r.nodeId.slice(-8)}
                      </a>
                    )
                    : "—"}
                </td>
                <td class="mono nowrap">
                  {fmtInt(r.promptTokens)} / {fmtInt(r.completionTokens)}
                </td>
                <td class="mono nowrap">{ms(r.latencyMs)} / {ms(r.ttftMs)}</td>
                <td class="mono" data-error>
                  {r.errorCode || r.errorType
                    ? `${r.errorCode ?? ""}${
                      r.errorCode && r.errorType ? " · " : ""
                    }${r.errorType ?? ""}`
                    : r.outcome === "cancelled"
                    ? "cancelled"
                    : "—"}
                  {r.notes && (
                    <div class="muted" data-notes>
                      {Object.entries(r.notes).map(([k, v]) => (
                        <div key={k}>{k}: {v}</div>
                      ))}
                    </div>
                  )}
                </td>
              </tr>
            ))}
          </Table>
          {data.partial && (
            <p class="muted" data-testid="log-partial">
              Searched back to {data.searchedTo ? time(data.searchedTo) : "—"}
              {" "}
              UTC without filling the page; the next page searches further.
            </p>
          )}
          <Pager next={next} />
        </Card>
      </>
    ),
    error ? 400 : 200,
  );
}

/** `/tenants/:id/requests` (mounted under `/tenants`). */
export const requestLogRoutes = new Hono<PortalEnv>()
  .get("/:id/requests", (c) => view(c));
