/**
 * Tracing through Deno's built-in OpenTelemetry (`OTEL_DENO=true`: spans for
 * `Deno.serve` and `fetch`, exported over OTLP; README says how). Orchard
 * adds its own spans with the official API package (`@opentelemetry/api`,
 * whose providers Deno registers), and carries the trace to nodes in a
 * `traceparent` header, since the gateway calls nodes over its own HTTP/1.1
 * client rather than `fetch`. Without `OTEL_DENO` the API is a no-op.
 * Attributes name tenants, keys, models and nodes, never prompts or secrets.
 */
import {
  type Attributes,
  context,
  type Span,
  SpanStatusCode,
  trace,
} from "@opentelemetry/api";

export type { Span };

const tracer = trace.getTracer("orchard");

/** Runs `fn` in a span, child of the active one (the span ends when `fn` settles; errors are recorded). */
export function withSpan<T>(
  name: string,
  attributes: Attributes,
  fn: (span: Span) => Promise<T>,
): Promise<T> {
  return tracer.startActiveSpan(name, { attributes }, async (span) => {
    try {
      return await fn(span);
    } catch (e) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: String(e) });
      throw e;
    } finally {
      span.end();
    }
  });
}

/** Starts a span, child of `parent` (default: the active span); the caller ends it. */
export function startSpan(
  name: string,
  attributes: Attributes = {},
  parent?: Span,
): Span {
  const ctx = parent
    ? trace.setSpan(context.active(), parent)
    : context.active();
  return tracer.startSpan(name, { attributes }, ctx);
}

/** The active span (Deno.serve's request span, or one of ours), if tracing is on. */
export function activeSpan(): Span | undefined {
  const s = trace.getActiveSpan();
  return s && trace.isSpanContextValid(s.spanContext()) ? s : undefined;
}

/** The W3C `traceparent` of the active span, or null when nothing is traced. */
export function traceparent(): string | null {
  const s = activeSpan();
  if (!s) return null;
  const c = s.spanContext();
  return `00-${c.traceId}-${c.spanId}-0${c.traceFlags & 1}`;
}
