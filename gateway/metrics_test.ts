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
