/**
 * In-process Prometheus metrics: counters and histograms kept as plain
 * numbers, rendered in the text exposition format on `/metrics`.
 */
import type { Fleet } from "../fleet/types.ts";

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

/** The gateway's metrics. */
export class GatewayMetrics {
  readonly #requests = new Map<string, number>();
  readonly #tokens = new Map<string, number>();
  readonly #rejections = new Map<string, number>();
  readonly #latency = new Histogram();
  readonly #ttft = new Histogram();
  /** Label strings by model, and by endpoint (see #labelsOf). */
  readonly #models = new Map<string, ModelLabels>();
  readonly #endpoints = new Map<string, string>();

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
  ): void {
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
    out.push(
      "# HELP orchard_node_up Whether a node is healthy and serving (1) or not (0).",
      "# TYPE orchard_node_up gauge",
      "# HELP orchard_node_in_flight Requests in flight from this gateway.",
      "# TYPE orchard_node_in_flight gauge",
    );
    const seen = new Set<string>();
    for (const m of fleet.servedModels()) {
      for (const id of m.nodeIds) {
        if (seen.has(id)) continue;
        seen.add(id);
        out.push(
          `orchard_node_up{node="${esc(id)}"} 1`,
          `orchard_node_in_flight{node="${esc(id)}"} ${inFlight(id)}`,
        );
      }
    }
    out.push(
      "# HELP orchard_gateway_queued Requests waiting for a node slot.",
      "# TYPE orchard_gateway_queued gauge",
      `orchard_gateway_queued ${queued}`,
    );
    return out.join("\n") + "\n";
  }
}
