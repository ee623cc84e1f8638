import * as assert from "node:assert/strict";
import type { Fleet } from "../fleet/types.ts";
import { GatewayMetrics } from "./metrics.ts";

const noNodes = { servedModels: () => [] } as unknown as Fleet;

Deno.test("GatewayMetrics counts requests and tokens per endpoint, model and status, with escaped labels", () => {
  const m = new GatewayMetrics();
  m.request("chat", "m1", 200, 7, 3, 12, 5);
  m.request("chat", "m1", 200, 1, 2, 30, null);
  m.request("chat", "m1", 429, 0, 0, 1, null);
  m.request("embeddings", "m1", 200, 4, 0, 2, null);
  m.request("chat", 'we"ird\\', 200, 5, 0, 3, 1);
  const text = m.render(noNodes, () => 0, 0);
  const line = (s: string) =>
    assert.ok(text.split("\n").includes(s), `missing: ${s}\n${text}`);
  line(
    'orchard_gateway_requests_total{endpoint="chat",model="m1",status="200"} 2',
  );
  line(
    'orchard_gateway_requests_total{endpoint="chat",model="m1",status="429"} 1',
  );
  line(
    'orchard_gateway_requests_total{endpoint="embeddings",model="m1",status="200"} 1',
  );
  line(
    'orchard_gateway_requests_total{endpoint="chat",model="we\\"ird\\\\",status="200"} 1',
  );
  line('orchard_gateway_tokens_total{model="m1",type="prompt"} 12');
  line('orchard_gateway_tokens_total{model="m1",type="completion"} 5');
  line('orchard_gateway_tokens_total{model="we\\"ird\\\\",type="prompt"} 5');
  line('orchard_gateway_request_duration_seconds_count{endpoint="chat"} 4');
  line(
    'orchard_gateway_request_duration_seconds_bucket{endpoint="chat",le="0.025"} 3',
  );
  line('orchard_gateway_ttft_seconds_count{endpoint="chat"} 2');
  line(
    'orchard_gateway_request_duration_seconds_count{endpoint="embeddings"} 1',
  );
});

Deno.test("GatewayMetrics keeps requests, tokens and latency per tenant, model and node, with an _other label past the cap", () => {
  const m = new GatewayMetrics({ maxLabelValues: 2 });
  m.request("chat", "m1", 200, 7, 3, 120, 40, { tenant: "acme", node: "n1" });
  m.request("chat", "m1", 502, 7, 0, 30, null, { tenant: "acme", node: "n1" });
  m.request("chat", "m1", 200, 1, 1, 10, 5, {
    tenant: "acme",
    node: "n1",
    outcome: "error",
  });
  m.request("chat", "m1", 429, 0, 0, 1, null, { tenant: "beta", node: null });
  m.request("chat", "-", 401, 0, 0, 1, null, { tenant: null, node: null });
  m.request("chat", "m2", 200, 2, 2, 10, 5, { tenant: "gamma", node: "n2" });
  const text = m.render(noNodes, () => 0, 0);
  const line = (s: string) =>
    assert.ok(text.split("\n").includes(s), `missing: ${s}\n${text}`);
  line('orchard_tenant_requests_total{tenant="acme",result="ok"} 1');
  line('orchard_tenant_requests_total{tenant="acme",result="server_error"} 2');
  line('orchard_tenant_requests_total{tenant="beta",result="limited"} 1');
  // The cap (2): "_none" and "gamma" come after acme and beta.
  line(
    'orchard_tenant_requests_total{tenant="_other",result="client_error"} 1',
  );
  line('orchard_tenant_requests_total{tenant="_other",result="ok"} 1');
  line('orchard_tenant_tokens_total{tenant="acme",type="prompt"} 15');
  line('orchard_model_requests_total{model="m1",result="server_error"} 2');
  line('orchard_node_requests_total{node="n1",result="ok"} 1');
  line('orchard_node_request_duration_seconds_count{node="n1"} 3');
  line('orchard_node_ttft_seconds_count{node="n1"} 2');
  line(
    'orchard_tenant_request_duration_seconds_bucket{tenant="acme",le="0.25"} 3',
  );
});
