/**
 * The operator's model placement and model aliases (platform admins):
 * which models each node should serve and keep loaded (per node, or by
 * rules over the facts nodes report; fleet/placement.ts computes a node's
 * desired set), and client-facing names the gateway resolves to a model.
 * Both are one small value each, replaced whole under a versionstamp
 * check and audited.
 */
import { z } from "zod";
import {
  NO_PLACEMENT,
  type Placement,
  type PlacementRule,
  type SpanPlacement,
} from "../fleet/placement.ts";
import type { EngineModel } from "../protocol/engine.ts";
import { ENGINE_KINDS } from "../protocol/engine.ts";
import type { PlacedModel } from "../protocol/placement.ts";
import { addAudit } from "./audit.ts";
import { ConflictError, NotFoundError } from "./errors.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import { parse } from "./schemas.ts";
import type { Store } from "./store.ts";

/** Model ids and aliases: what node engines accept as an id. */
const modelId = z.string({ error: "must be a model id" }).trim()
  .regex(
    /^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$/,
    "must be a model id: letters, digits and . _ : / -, up to 200 characters",
  );

const placedSchema = z.object({
  id: modelId,
  pinned: z.boolean().optional().default(false),
}).strict();

/** The body of `PUT /nodes/{id}/placement`. */
export const nodePlacementSchema = z.object({
  models: z.array(placedSchema).max(64, "at most 64 models per node"),
}).strict();

/** The body of `POST /placement/rules`. */
export const ruleSchema = z.object({
  model: modelId,
  pinned: z.boolean().optional().default(false),
  minMemoryGb: z.number().min(0).max(100_000).optional(),
  engine: z.enum(ENGINE_KINDS).optional(),
  os: z.string().trim().min(1).max(40).optional(),
  arch: z.string().trim().min(1).max(40).optional(),
}).strict();

/** The body of `PUT /models/{id}/span`. */
export const spanSchema = z.object({
  nodes: z.array(z.string().min(1).max(64), {
    error: "must list the nodes: head first, then the workers",
  }).min(2, "must list at least two nodes: a head and a worker").max(
    16,
    "at most 16 nodes",
  ).refine((n) => new Set(n).size === n.length, "must not repeat a node"),
  split: z.array(z.number().min(0).max(1e6)).optional(),
}).strict().refine(
  (v) =>
    !v.split ||
    (v.split.length === v.nodes.length && v.split.some((x) => x > 0)),
  {
    message: "must give one share per node, not all zero",
    path: ["split"],
  },
);

/** The body of `PUT /model-aliases/{alias}`. */
export const aliasSchema = z.object({ model: modelId }).strict();

const MAX_RULES = 100;
const MAX_ALIASES = 500;

/** Reads the placement (empty when never set). */
export async function getPlacement(store: Store): Promise<Placement> {
  return (await store.kv.get<Placement>(k.placement())).value ?? NO_PLACEMENT;
}

async function updatePlacement(
  store: Store,
  p: Principal,
  action: string,
  target: { type: string; id: string; label?: string },
  change: (cur: Placement) => Placement,
): Promise<Placement> {
  requirePlatform(p);
  for (let attempt = 0; attempt < 5; attempt++) {
    const entry = await store.kv.get<Placement>(k.placement());
    const before = entry.value ?? NO_PLACEMENT;
    const next = change(before);
    if (JSON.stringify(next).length > 60_000) {
      throw new ConflictError("The placement is too large");
    }
    const op = store.kv.atomic().check(entry).set(k.placement(), next);
    addAudit(op, p, { action, target, tenantId: null, before, after: next });
    if ((await op.commit()).ok) return next;
  }
  throw new ConflictError("The placement changed meanwhile; try again");
}

/**
 * Sets the models a node should serve (an empty list: none of its own;
 * rules may still place some). Platform admins only, audited.
 */
export async function setNodePlacement(
  store: Store,
  p: Principal,
  nodeId: string,
  input: unknown,
): Promise<Placement> {
  requirePlatform(p);
  const { models } = parse(nodePlacementSchema, input);
  const node = nodeId.length <= 64
    ? (await store.kv.get<{ name: string }>(k.node(nodeId))).value
    : null;
  if (!node) throw new NotFoundError("Node");
  const unique = new Map<string, PlacedModel>();
  for (const m of models) {
    unique.set(m.id, {
      id: m.id,
      pinned: (unique.get(m.id)?.pinned ?? false) || m.pinned,
    });
  }
  return await updatePlacement(
    store,
    p,
    "placement.node",
    { type: "node", id: nodeId, label: node.name },
    (cur) => {
      const nodes = { ...cur.nodes };
      if (unique.size) nodes[nodeId] = [...unique.values()];
      else delete nodes[nodeId];
      return { ...cur, nodes };
    },
  );
}

/** Adds a placement rule. Platform admins only, audited. */
export async function addPlacementRule(
  store: Store,
  p: Principal,
  input: unknown,
): Promise<PlacementRule> {
  requirePlatform(p);
  const data = parse(ruleSchema, input);
  const rule: PlacementRule = { id: newId(), ...data };
  await updatePlacement(
    store,
    p,
    "placement.rule.add",
    { type: "placement_rule", id: rule.id, label: rule.model },
    (cur) => {
      if (cur.rules.length >= MAX_RULES) {
        throw new ConflictError(`At most ${MAX_RULES} placement rules`);
      }
      return { ...cur, rules: [...cur.rules, rule] };
    },
  );
  return rule;
}

/** Removes a placement rule; 404 when there is none. Platform admins only, audited. */
export async function removePlacementRule(
  store: Store,
  p: Principal,
  ruleId: string,
): Promise<void> {
  await updatePlacement(
    store,
    p,
    "placement.rule.remove",
    { type: "placement_rule", id: ruleId },
    (cur) => {
      if (!cur.rules.some((r) => r.id === ruleId)) {
        throw new NotFoundError("Placement rule");
      }
      return { ...cur, rules: cur.rules.filter((r) => r.id !== ruleId) };
    },
  );
}

const GiB = 2 ** 30;
const gib = (b: number) => `${(b / GiB).toFixed(2)} GiB`;

/**
 * Places a model across several nodes (head first, then workers): the head
 * loads it across its memory and the workers' through ggml RPC, as the
 * instance `rpc:<span id>`. Replaces the model's span; a node takes part in
 * one span at a time. Refused (409) when the head does not have the model,
 * or the members' free memory (last heartbeats) cannot hold its weights
 * and KV cache, saying how much is missing. Platform admins only, audited.
 */
export async function setModelSpan(
  store: Store,
  p: Principal,
  model: string,
  input: unknown,
): Promise<SpanPlacement> {
  requirePlatform(p);
  const id = parse(modelId, model);
  const data = parse(spanSchema, input);
  const recs = await store.kv.getMany<({ name: string } | NodeStatusLike)[]>(
    data.nodes.flatMap((n) => [k.node(n), k.nodeStatus(n)]),
  );
  let free = 0;
  const unknown: string[] = [];
  for (let i = 0; i < data.nodes.length; i++) {
    if (!recs[2 * i]!.value) unknown.push(data.nodes[i]!);
    const st = recs[2 * i + 1]!.value as NodeStatusLike | null;
    free += Math.max(0, st?.memory?.freeBytes ?? 0);
  }
  if (unknown.length) {
    throw new NotFoundError(`Node ${unknown.join(", ")}`);
  }
  const head = recs[1]!.value as NodeStatusLike | null;
  const m = head?.models.find((x) => x.id === id || x.aliases?.includes(id));
  if (!m) {
    throw new ConflictError(
      `The head node ${
        data.nodes[0]
      } does not have the model ${id}; the head needs its file (workers do not)`,
      "nodes",
    );
  }
  if (m.needs) {
    const need = m.needs.weightsBytes + m.needs.kvBytes;
    if (free < need) {
      throw new ConflictError(
        `These nodes cannot hold ${id}: it needs ${gib(need)} (weights ${
          gib(m.needs.weightsBytes)
        } + KV cache ${gib(m.needs.kvBytes)}), their free memory is ${
          gib(free)
        }: ${gib(need - free)} missing`,
        "nodes",
      );
    }
  }
  const span: SpanPlacement = {
    id: newId(),
    model: m.id,
    nodes: data.nodes,
    ...(data.split ? { split: data.split } : {}),
  };
  await updatePlacement(
    store,
    p,
    "placement.span.set",
    { type: "model", id: m.id, label: data.nodes.join(",") },
    (cur) => {
      const others = (cur.spans ?? []).filter((s) => s.model !== m.id);
      const taken = others.find((s) =>
        s.nodes.some((n) => data.nodes.includes(n))
      );
      if (taken) {
        throw new ConflictError(
          `Node ${
            taken.nodes.find((n) => data.nodes.includes(n))
          } already takes part in ${taken.model}'s span (rpc:${taken.id}); a node serves one span at a time`,
          "nodes",
        );
      }
      return { ...cur, spans: [...others, span] };
    },
  );
  return span;
}

/** Removes a model's span; 404 when it has none. Platform admins only, audited. */
export async function removeModelSpan(
  store: Store,
  p: Principal,
  model: string,
): Promise<void> {
  const id = parse(modelId, model);
  await updatePlacement(
    store,
    p,
    "placement.span.remove",
    { type: "model", id },
    (cur) => {
      if (!(cur.spans ?? []).some((s) => s.model === id)) {
        throw new NotFoundError("Span placement");
      }
      return { ...cur, spans: (cur.spans ?? []).filter((s) => s.model !== id) };
    },
  );
}

/** The parts of a node's last heartbeat a span placement reads. */
interface NodeStatusLike {
  memory: { totalBytes: number; freeBytes: number } | null;
  models: EngineModel[];
}

/** Drops a removed node's entries (called with its removal). */
export async function forgetNodePlacement(
  store: Store,
  p: Principal,
  nodeId: string,
): Promise<void> {
  const cur = await getPlacement(store);
  const spanned = (cur.spans ?? []).some((s) => s.nodes.includes(nodeId));
  if (!cur.nodes[nodeId] && !spanned) return;
  await updatePlacement(store, p, "placement.node", {
    type: "node",
    id: nodeId,
  }, (c) => {
    const nodes = { ...c.nodes };
    delete nodes[nodeId];
    // a span without one of its nodes cannot load: it goes too
    const spans = (c.spans ?? []).filter((s) => !s.nodes.includes(nodeId));
    return { ...c, nodes, ...(c.spans ? { spans } : {}) };
  });
}

/** Operator-defined aliases: client-facing name → model id. */
export type ModelAliases = Record<string, string>;

/** Reads the operator's model aliases. */
export async function getModelAliases(store: Store): Promise<ModelAliases> {
  return (await store.kv.get<ModelAliases>(k.modelAliases())).value ?? {};
}

/**
 * Sets an alias (`model` a model id) or removes it (`model` null; 404 when
 * there is none). An alias cannot name another alias. Platform admins
 * only, audited.
 */
export async function setModelAlias(
  store: Store,
  p: Principal,
  alias: string,
  input: unknown,
): Promise<ModelAliases> {
  requirePlatform(p);
  const name = parse(modelId, alias);
  const model = input === null ? null : parse(aliasSchema, input).model;
  if (model === name) {
    throw new ConflictError("An alias cannot name itself", "model");
  }
  for (let attempt = 0; attempt < 5; attempt++) {
    const entry = await store.kv.get<ModelAliases>(k.modelAliases());
    const before = entry.value ?? {};
    const next = { ...before };
    if (model === null) {
      if (!(name in next)) throw new NotFoundError("Alias");
      delete next[name];
    } else {
      if (model in next) {
        throw new ConflictError(
          `${model} is itself an alias; name the model it stands for`,
          "model",
        );
      }
      if (!(name in next) && Object.keys(next).length >= MAX_ALIASES) {
        throw new ConflictError(`At most ${MAX_ALIASES} aliases`);
      }
      next[name] = model;
    }
    const op = store.kv.atomic().check(entry).set(k.modelAliases(), next);
    addAudit(op, p, {
      action: model === null ? "model_alias.remove" : "model_alias.set",
      target: { type: "model_alias", id: name },
      tenantId: null,
      before: before[name] ?? null,
      after: model,
    });
    if ((await op.commit()).ok) return next;
  }
  throw new ConflictError("The aliases changed meanwhile; try again");
}
