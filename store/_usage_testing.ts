/** Test fixtures for usage metering (not used by the application). */
import type { UsageRecord } from "./usage.ts";

/** A usage record with test defaults (tenant `ta`, key `ka`, model `m1`, node `n1`). */
export function usageRecord(over: Partial<UsageRecord> = {}): UsageRecord {
  return {
    id: crypto.randomUUID(),
    at: "2026-11-22T10:15:00.000Z",
    requestId: "r",
    tenantId: "ta",
    keyId: "ka",
    model: "m1",
    nodeId: "n1",
    endpoint: "chat",
    promptTokens: 10,
    completionTokens: 5,
    latencyMs: 120,
    ttftMs: 40,
    status: 200,
    outcome: "ok",
    ...over,
  };
}
