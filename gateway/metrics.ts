/**
 * In-process Prometheus metrics: counters and histograms kept as plain
 * numbers, rendered in the text exposition format on `/metrics`.
 *
 * Besides the gateway's totals (by endpoint, model and status), requests,
 * tokens, latency and time to first token are kept per tenant (its slug),
 * per model and per node, so an operator can alert on "tenant X is
 * failing" or "node 3's p99 doubled". Label values are capped
 * (`LabelCap`): past the cap, new tenants, models or nodes count under
 * `_other`, so a flood of names cannot grow the scrape without bound.
 * Requests refused before authentication count under tenant `_none`.
 */
import type { Fleet, NodeView } from "../fleet/types.ts";

const BUCKETS_S = [
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
  30,
  60,
  120,
];

class Histogram {
  readonly counts = new Map<string, { b: number[]; sum: number; n: number }>();
  observe(labels: string, seconds: number): void {
    let h = this.counts.get(labels);
    if (!h) {
      this.counts.set(
        labels,
        h = { b: BUCKETS_S.map(() => 0), sum: 0, n: 0 },
      );
    }
    for (let i = 0; i < BUCKETS_S.length; i++) {
      if (seconds <= BUCKETS_S[i]!) h.b[i]!++;
    }
    h.sum += seconds;
    h.n++;
  }
  render(name: string, out: string[]): void {
    for (const [labels, h] of this.counts) {
      const sep = labels ? "," : "";
      BUCKETS_S.forEach((le, i) =>
        out.push(`${name}_bucket{${labels}${sep}le="${le}"} ${h.b[i]}`)
      );
      out.push(`${name}_bucket{${labels}${sep}le="+Inf"} ${h.n}`);
      out.push(
        `${name}_sum{${labels}} ${h.sum}`,
        `${name}_count{${labels}} ${h.n}`,
      );
    }
  }
}

/** Most distinct values of each capped label (tenant, model, node); the rest are `_other`. */
export const MAX_LABEL_VALUES = 500;
/** The label value of what is past a cap. */
export const OVERFLOW_LABEL = "_other";

/** Admits the first `max` distinct values of a label; later ones become OVERFLOW_LABEL. */
class LabelCap {
  readonly #seen = new Map<string, string>();
  constructor(readonly max: number) {}
  /** The escaped label value for `v`. */
  of(v: string): string {
    let l = this.#seen.get(v);
    if (l !== undefined) return l;
    if (this.#seen.size >= this.max) return OVERFLOW_LABEL;
    this.#seen.set(v, l = esc(v));
    return l;
  }
}

/** How a request ended, for the per-tenant, per-model and per-node counters. */
export type RequestResult =
  | "ok"
  | "limited"
  | "client_error"
  | "server_error"
  | "cancelled";

/** The result label of an HTTP status (and a stream's outcome: an error frame after a 200 is a server error). */
export function resultOf(
  status: number,
  outcome: "ok" | "error" | "cancelled" = "ok",
): RequestResult {
  if (outcome === "cancelled" || status === 499) return "cancelled";
  if (status === 429) return "limited";
  if (status >= 500 || (status < 400 && outcome === "error")) {
    return "server_error";
  }
  if (status >= 400) return "client_error";
  return "ok";
}

/** Escapes a Prometheus label value. */
function esc(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")
    .slice(0, 200);
}

/** A model's label sets; `requests` by endpoint, then status. */
interface ModelLabels {
  model: string;
  prompt: string;
  completion: string;
  requests: Map<string, Map<number, string>>;
}

/** Who and where a request was for: the per-dimension series' labels (null: not known). */
export interface RequestParties {
  /** The tenant's slug (null: refused before authentication). */
  tenant: string | null;
  /** The node that served it (null: none did). */
  node: string | null;
  /** How a stream ended after its 200 (default "ok"). */
  outcome?: "ok" | "error" | "cancelled";
}

/** Counters and latency/TTFT histograms of one dimension (tenant, model or node). */
class Dimension {
  readonly requests = new Map<string, number>();
  readonly tokens = new Map<string, number>();
  readonly latency = new Histogram();
  readonly ttft = new Histogram();
  readonly #cap: LabelCap;
  constructor(readonly label: string, maxValues: number) {
    this.#cap = new LabelCap(maxValues);
  }

  add(
    value: string,
    result: RequestResult,
    prompt: number,
    completion: number,
    latencyS: number,
    ttftS: number | null,
  ): void {
    const l = `${this.label}="${this.#cap.of(value)}"`;
    const r = `${l},result="${result}"`;
    this.requests.set(r, (this.requests.get(r) ?? 0) + 1);
    if (prompt > 0) {
      const k = `${l},type="prompt"`;
      this.tokens.set(k, (this.tokens.get(k) ?? 0) + prompt);
    }
    if (completion > 0) {
      const k = `${l},type="completion"`;
      this.tokens.set(k, (this.tokens.get(k) ?? 0) + completion);
    }
    this.latency.observe(l, latencyS);
    if (ttftS !== null) this.ttft.observe(l, ttftS);
  }

  render(out: string[]): void {
    const n = this.label;
    out.push(
      `# HELP orchard_${n}_requests_total Requests by ${n} and result (ok, limited, client_error, server_error, cancelled).`,
      `# TYPE orchard_${n}_requests_total counter`,
    );
    for (const [l, v] of this.requests) {
      out.push(`orchard_${n}_requests_total{${l}} ${v}`);
    }
    out.push(
      `# HELP orchard_${n}_tokens_total Tokens billed, by ${n} and type.`,
      `# TYPE orchard_${n}_tokens_total counter`,
    );
    for (const [l, v] of this.tokens) {
      out.push(`orchard_${n}_tokens_total{${l}} ${v}`);
    }
    out.push(
      `# HELP orchard_${n}_request_duration_seconds Request latency by ${n}.`,
      `# TYPE orchard_${n}_request_duration_seconds histogram`,
    );
    this.latency.render(`orchard_${n}_request_duration_seconds`, out);
    out.push(
      `# HELP orchard_${n}_ttft_seconds Time to first token by ${n}.`,
      `# TYPE orchard_${n}_ttft_seconds histogram`,
    );
    this.ttft.render(`orchard_${n}_ttft_seconds`, out);
  }
}

/** The gateway's metrics. */
export class GatewayMetrics {
  readonly #tenants: Dimension;
  readonly #byModel: Dimension;
  readonly #nodes: Dimension;
  readonly #requests = new Map<string, number>();
  readonly #tokens = new Map<string, number>();
  readonly #rejections = new Map<string, number>();
  readonly #latency = new Histogram();
  readonly #ttft = new Histogram();
  /** Label strings by model, and by endpoint (see #labelsOf). */
  readonly #models = new Map<string, ModelLabels>();
  readonly #endpoints = new Map<string, string>();

  /** `maxLabelValues`: distinct tenants, models and nodes each before `_other` (default MAX_LABEL_VALUES). */
  constructor(opts: { maxLabelValues?: number } = {}) {
    const max = opts.maxLabelValues ?? MAX_LABEL_VALUES;
    this.#tenants = new Dimension("tenant", max);
    this.#byModel = new Dimension("model", max);
    this.#nodes = new Dimension("node", max);
  }

  #inc(m: Map<string, number>, labels: string, n = 1): void {
    m.set(labels, (m.get(labels) ?? 0) + n);
  }

  /** Counts a finished request with its tokens, latency and TTFT. */
  request(
    endpoint: string,
    model: string,
    status: number,
    prompt: number,
    completion: number,
    latencyMs: number,
    ttftMs: number | null,
    parties: RequestParties = { tenant: null, node: null },
  ): void {
    const result = resultOf(status, parties.outcome);
    const latencyS = latencyMs / 1000;
    const ttftS = ttftMs === null ? null : ttftMs / 1000;
    this.#tenants.add(
      parties.tenant ?? "_none",
      result,
      prompt,
      completion,
      latencyS,
      ttftS,
    );
    if (model !== "-") {
      this.#byModel.add(model, result, prompt, completion, latencyS, ttftS);
    }
    if (parties.node !== null) {
      this.#nodes.add(
        parties.node,
        result,
        prompt,
        completion,
        latencyS,
        ttftS,
      );
    }
    const l = this.#labelsOf(model);
    let byStatus = l.requests.get(endpoint);
    if (!byStatus) l.requests.set(endpoint, byStatus = new Map());
    let requests = byStatus.get(status);
    if (requests === undefined) {
      requests = `endpoint="${endpoint}",model="${l.model}",status="${status}"`;
      byStatus.set(status, requests);
    }
    this.#inc(this.#requests, requests);
    if (prompt > 0) this.#inc(this.#tokens, l.prompt, prompt);
    if (completion > 0) this.#inc(this.#tokens, l.completion, completion);
    let e = this.#endpoints.get(endpoint);
    if (e === undefined) {
      this.#endpoints.set(endpoint, e = `endpoint="${endpoint}"`);
    }
    this.#latency.observe(e, latencyMs / 1000);
    if (ttftMs !== null) this.#ttft.observe(e, ttftMs / 1000);
  }

  /**
   * A model's label strings, made once: escaping the name and building
   * three label sets per request showed in the gateway's profile.
   */
  #labelsOf(model: string): ModelLabels {
    let l = this.#models.get(model);
    if (l === undefined) {
      if (this.#models.size >= 1000) this.#models.clear(); // a bound, not a cache policy
      const m = esc(model);
      l = {
        model: m,
        prompt: `model="${m}",type="prompt"`,
        completion: `model="${m}",type="completion"`,
        requests: new Map(),
      };
      this.#models.set(model, l);
    }
    return l;
  }

  /** Counts a request refused before reaching a node (auth, limits, validation). */
  rejected(reason: string, status: number): void {
    this.#inc(this.#rejections, `reason="${esc(reason)}",status="${status}"`);
  }

  /** Renders every metric, with node health and load from the fleet. */
  render(
    fleet: Fleet,
    inFlight: (nodeId: string) => number,
    queued: number,
  ): string {
    const out: string[] = [];
    const counter = (name: string, help: string, m: Map<string, number>) => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} counter`);
      for (const [l, v] of m) out.push(`${name}{${l}} ${v}`);
    };
    counter(
      "orchard_gateway_requests_total",
      "Requests served, by endpoint, model and status.",
      this.#requests,
    );
    counter(
      "orchard_gateway_tokens_total",
      "Tokens billed, by model and type.",
      this.#tokens,
    );
    counter(
      "orchard_gateway_rejections_total",
      "Requests refused before a node, by reason.",
      this.#rejections,
    );
    out.push(
      "# HELP orchard_gateway_request_duration_seconds Request latency.",
      "# TYPE orchard_gateway_request_duration_seconds histogram",
    );
    this.#latency.render("orchard_gateway_request_duration_seconds", out);
    out.push(
      "# HELP orchard_gateway_ttft_seconds Time to first token.",
      "# TYPE orchard_gateway_ttft_seconds histogram",
    );
    this.#ttft.render("orchard_gateway_ttft_seconds", out);
    this.#tenants.render(out);
    this.#byModel.render(out);
    this.#nodes.render(out);
    // Every enrolled node, healthy or not, with the load its heartbeat reports.
    type Row = { id: string; up: boolean; stats: NodeView["stats"] | null };
    const rows: Row[] = fleet.nodes
      ? fleet.nodes().map((n) => ({
        id: n.id,
        up: n.state === "healthy",
        stats: n.stats,
      }))
      : [...new Set(fleet.servedModels().flatMap((m) => m.nodeIds))].map((
        id,
      ) => ({ id, up: true, stats: null }));
    const gauge = (
      name: string,
      help: string,
      v: (n: Row) => number | null | undefined,
    ) => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`);
      for (const n of rows) {
        const x = v(n);
        if (typeof x === "number") {
          out.push(`${name}{node="${esc(n.id)}"} ${x}`);
        }
      }
    };
    gauge(
      "orchard_node_up",
      "Whether a node is healthy and serving (1) or not (0: unhealthy, draining, drained).",
      (n) => n.up ? 1 : 0,
    );
    gauge(
      "orchard_node_in_flight",
      "Requests in flight from this gateway.",
      (n) => inFlight(n.id),
    );
    gauge(
      "orchard_node_slots",
      "Concurrent sequences the node serves (its last heartbeat).",
      (n) => n.stats?.slots,
    );
    gauge(
      "orchard_node_busy",
      "Sequences the node's engine is generating (its last heartbeat, all gateways).",
      (n) => n.stats?.inFlight,
    );
    gauge(
      "orchard_node_queued",
      "Requests waiting in the node's own queue (its last heartbeat).",
      (n) => n.stats?.queued,
    );
    out.push(
      "# HELP orchard_gateway_queued Requests waiting for a node slot.",
      "# TYPE orchard_gateway_queued gauge",
      `orchard_gateway_queued ${queued}`,
    );
    return out.join("\n") + "\n";
  }
}
