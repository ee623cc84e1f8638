/**
 * Adapts liborchard's link test (node/native/linktest.ts) to the node
 * server's `LinkTester`: `listen` opens a one-shot listener on all
 * interfaces and returns its port; `connect` runs the measurement against
 * the host and port the gateway passes on and returns the
 * `orchard.linktest/1` result. Loaded lazily; null when the native module
 * or library is unavailable (the endpoints then answer 501).
 */
import { OpenAIError } from "../protocol/openai/errors.ts";
import type { LinkTester } from "./server.ts";

/** The subset of node/native/linktest.ts used here. */
interface NativeLinktest {
  startLinktestListener(
    opts: { host?: string; port?: number; [option: string]: unknown },
  ): Promise<{ port: number; [k: string]: unknown }>;
  runLinktestConnect(
    opts: { host: string; port: number; [option: string]: unknown },
  ): Promise<unknown>;
}

/** Options the gateway may forward (sizes, iterations, transport). */
function options(body: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(body)) {
    if (k === "host" || k === "port") continue;
    if (["string", "number", "boolean"].includes(typeof v)) out[k] = v;
  }
  return out;
}

/** The native link tester, or null when it cannot load. */
export async function createLinkTester(): Promise<LinkTester | null> {
  const spec = new URL("./native/linktest.ts", import.meta.url).href;
  const mod = await import(spec) as Partial<NativeLinktest>;
  const { startLinktestListener: listen, runLinktestConnect: connect } = mod;
  if (typeof listen !== "function" || typeof connect !== "function") {
    return null;
  }
  return {
    async listen(body) {
      const l = await listen({ ...options(body), host: "0.0.0.0", port: 0 });
      const { port, ...rest } = l;
      // Only JSON-safe fields go back to the gateway.
      const extra = Object.fromEntries(
        Object.entries(rest).filter(([, v]) =>
          ["string", "number", "boolean"].includes(typeof v)
        ),
      );
      return { ...extra, port };
    },
    async connect(body) {
      const host = String(body.host ?? "");
      const port = Number(body.port);
      if (!host || !Number.isInteger(port) || port < 1 || port > 65535) {
        throw new OpenAIError(
          400,
          "invalid_request",
          "host and port are required",
        );
      }
      return await connect({ ...options(body), host, port });
    },
  };
}
