/**
 * Where a reasoning effort (chat `reasoning_effort`, Responses
 * `reasoning.effort`, Anthropic `thinking` / `output_config.effort`) has a
 * meaning: a node that fronts an OpenAI-compatible engine (vLLM,
 * llama-server, …) takes `reasoning_effort` as chat does; a llama-engine
 * node reports, per model, the reasoning control its chat template has
 * (`enable_thinking` or `reasoning_effort`, node/llama/reasoning.ts) and
 * refuses the field for a model without one. The gateway sends an effort
 * only where every candidate node can take it; elsewhere it is a hint with
 * nothing to set, reported as such.
 */
import type { GatewayCore } from "./core.ts";

/** Whether every node that may serve `model` takes `reasoning_effort`. */
export function effortReaches(core: GatewayCore, model: string): boolean {
  const nodes = core.fleet.candidates(model);
  return nodes.length > 0 && nodes.every((n) =>
    n.engine === "openai" ||
    !!n.models.find((m) => m.id === model)?.reasoning?.control
  );
}
