/**
 * OpenTelemetry traces across real processes: a gateway and a node
 * (`openai` engine in front of the scripted upstream) started with Deno's
 * OpenTelemetry on, exporting OTLP/HTTP JSON to a receiver in this test.
 */
import assert from "node:assert/strict";
import { startFakeUpstream, until } from "./_fleet.ts";
import { startCluster } from "./fixtures/cluster.ts";
import { readSSE } from "../gateway/_testing.ts";

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  attributes?: { key: string; value: Record<string, unknown> }[];
}

/** An OTLP/HTTP (JSON) receiver: every span it got, with its service's name. */
function otlpReceiver() {
  const spans: (OtlpSpan & { service: string })[] = [];
  const bodies: string[] = [];
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    async (req) => {
      const text = await req.text();
      if (new URL(req.url).pathname === "/v1/traces") {
        bodies.push(text);
        const json = JSON.parse(text) as {
          resourceSpans?: {
            resource?: { attributes?: OtlpSpan["attributes"] };
            scopeSpans?: { spans?: OtlpSpan[] }[];
          }[];
        };
        for (const rs of json.resourceSpans ?? []) {
          const service = String(
            rs.resource?.attributes?.find((a) => a.key === "service.name")
              ?.value.stringValue ?? "",
          );
          for (const ss of rs.scopeSpans ?? []) {
            for (const s of ss.spans ?? []) spans.push({ ...s, service });
          }
        }
      }
      return Response.json({});
    },
  );
  return {
    url: `http://127.0.0.1:${server.addr.port}`,
    spans,
    bodies,
    close: () => server.shutdown(),
  };
}

const otel = (url: string, service: string) => ({
  OTEL_DENO: "true",
  OTEL_DENO_CONSOLE: "ignore",
  OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
  OTEL_EXPORTER_OTLP_ENDPOINT: url,
  OTEL_SERVICE_NAME: service,
  OTEL_BSP_SCHEDULE_DELAY: "200",
});

Deno.test("a streamed request is one trace across gateway and node: authentication, admission, queue, node call, engine queue, prefill and decode, with no prompt text", async () => {
  const receiver = otlpReceiver();
  const up = startFakeUpstream();
  const prompt = `secret prompt ${crypto.randomUUID()}`;
  try {
    await using cluster = await startCluster({
      openai: { upstreamUrl: up.url, models: ["tiny-chat"] },
      gatewayEnv: otel(receiver.url, "orchard-gateway"),
      nodeEnv: otel(receiver.url, "orchard-node"),
    });
    const res = await fetch(`${cluster.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${cluster.apiKey}`,
        "content-type": "application/json",
      },
      body: JSON.stringify({
        model: "tiny-chat",
        stream: true,
        messages: [{ role: "user", content: prompt }],
      }),
    });
    assert.equal(res.status, 200);
    const requestId = res.headers.get("x-request-id")!;
    const sse = await readSSE(res);
    assert.equal(sse.data.at(-1), "[DONE]");
    const ours = () => {
      const root = receiver.spans.find((s) =>
        s.service === "orchard-gateway" &&
        s.attributes?.some((a) =>
          a.key === "orchard.request_id" && a.value.stringValue === requestId
        )
      );
      return root
        ? receiver.spans.filter((s) => s.traceId === root.traceId)
        : [];
    };
    const wanted = [
      ["orchard-gateway", "orchard.authenticate"],
      ["orchard-gateway", "orchard.admission"],
      ["orchard-gateway", "orchard.queue"],
      ["orchard-gateway", "orchard.node_call"],
      ["orchard-node", "orchard.engine.queue"],
      ["orchard-node", "orchard.engine.prefill"],
      ["orchard-node", "orchard.engine.decode"],
    ];
    const missing = () =>
      wanted.filter(([svc, name]) =>
        !ours().some((s) => s.service === svc && s.name === name)
      );
    await until(
      "the trace's spans to arrive",
      () => Promise.resolve(missing().length === 0),
      15_000,
    ).catch(() => {
      throw new Error(
        `missing ${JSON.stringify(missing())}; got ${
          JSON.stringify(receiver.spans.map((s) => [s.service, s.name]))
        }`,
      );
    });
    const trace = ours();
    // The node's request span is a child of the gateway's node call.
    const call = trace.find((s) => s.name === "orchard.node_call")!;
    const nodeRoot = trace.find((s) =>
      s.service === "orchard-node" && s.parentSpanId === call.spanId
    );
    assert.ok(nodeRoot, "the node's span hangs under the gateway's node call");
    const root = trace.find((s) =>
      s.attributes?.some((a) => a.key === "orchard.request_id")
    )!;
    const attr = (k: string) =>
      root.attributes!.find((a) => a.key === k)?.value.stringValue;
    assert.equal(attr("orchard.tenant"), "acme");
    assert.equal(attr("orchard.model"), "tiny-chat");
    assert.ok(attr("orchard.node"));
    assert.ok(
      receiver.bodies.every((b) => !b.includes(prompt)),
      "no prompt text in any export",
    );
  } finally {
    await up.close();
    await receiver.close();
  }
});
