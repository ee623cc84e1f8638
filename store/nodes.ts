/**
 * Nodes: enrollment (join token consumed in the same atomic write that
 * creates the node), heartbeat status, drain, removal and link-test
 * results. Records are written here only; the fleet registry reads them.
 */
import { z } from "zod";
import { jwkThumbprint } from "../lib/jwt.ts";
import {
  desiredModels,
  factsOf,
  type LinkView,
  NO_PLACEMENT,
  type Placement,
  spanAssignment,
  type SpanMemberView,
} from "../fleet/placement.ts";
import {
  type PlacedModel,
  type PlacementReport,
  rpcInstanceId,
  type SpanAssignment,
} from "../protocol/placement.ts";
import type { Reachability } from "../protocol/node_messages.ts";
import {
  ENGINE_KINDS,
  type EngineKind,
  type EngineModel,
  type EngineStats,
  INSTANCE_KINDS,
  INSTANCE_STATES,
  MODEL_KINDS,
  REASONING_CONTROLS,
} from "../protocol/engine.ts";
import { addAudit } from "./audit.ts";
import {
  ConflictError,
  NotFoundError,
  ServiceError,
  UnauthorizedError,
  ValidationError,
} from "./errors.ts";
import { newId } from "./ids.ts";
import { consumeJoinToken, type JoinRejection } from "./join_tokens.ts";
import { k } from "./kv_keys.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import { forgetNodePlacement } from "./placement.ts";
import { parse } from "./schemas.ts";
import type { Store } from "./store.ts";

/** A node as stored at enrollment (admin changes only `drain`). */
export interface NodeRecord {
  id: string;
  name: string;
  url: string;
  engine: EngineKind;
  publicJwk: JsonWebKey;
  keyThumbprint: string;
  drain: boolean;
  models: EngineModel[];
  enrolledAt: string;
  joinTokenId: string;
  version: string | null;
  /**
   * The tenant this node serves alone (platform admins set it): only that
   * tenant's requests reach it, and that tenant's requests go only to its
   * dedicated nodes (or overflow to shared ones: Tenant.overflowToShared).
   * Absent or null: shared by every tenant without dedicated nodes.
   */
  dedicatedTo?: string | null;
}

/** What a node reported in its last heartbeat. */
export interface NodeStatus {
  at: string;
  intervalMs: number;
  stats: EngineStats;
  memory: { totalBytes: number; freeBytes: number } | null;
  models: EngineModel[];
  drainState: "none" | "draining" | "drained";
  /** How its models compare with its placement (absent: none applies, or an older node). */
  placement?: PlacementReport | null;
}

/** A link-test result between two nodes (`orchard.linktest/1`). */
export interface LinkTestRecord {
  a: string;
  b: string;
  at: string;
  ok: boolean;
  result: unknown;
  error: string | null;
}

const MAX_VALUE_BYTES = 60 * 1024;
const name = z.string().trim().min(1).max(100);
const modelSchema = z.object({
  id: z.string().min(1).max(200),
  loaded: z.boolean(),
  kind: z.enum(MODEL_KINDS),
  contextLength: z.number().int().min(0).max(1e8).optional(),
  aliases: z.array(z.string().min(1).max(200)).max(8).optional(),
  embeddings: z.boolean().optional(),
  promptOverhead: z.object({
    fixed: z.number().int().min(0).max(1e6),
    perMessage: z.number().int().min(0).max(1e5),
    tools: z.number().int().min(0).max(1e6),
  }).optional(),
  reasoning: z.object({
    control: z.enum(REASONING_CONTROLS).nullable(),
    parses: z.boolean(),
  }).optional(),
  servable: z.literal(false).optional(),
  instance: z.object({
    id: z.string().min(1).max(300),
    kind: z.enum(INSTANCE_KINDS),
    members: z.array(z.object({
      nodeId: z.string().min(1).max(100).optional(),
      exoNodeId: z.string().min(1).max(200).optional(),
      addresses: z.array(z.string().min(1).max(200)).max(16).optional(),
      hostname: z.string().min(1).max(255).optional(),
      role: z.enum(["head", "worker"]).optional(),
      memoryBytes: z.number().min(0).max(1e15).optional(),
      transport: z.enum(["rdma", "tcp"]).nullable().optional(),
      self: z.boolean().optional(),
    })).min(1).max(32),
    serves: z.boolean(),
    state: z.enum(INSTANCE_STATES),
    detail: z.string().max(500).optional(),
  }).optional(),
  needs: z.object({
    weightsBytes: z.number().min(0),
    kvBytes: z.number().min(0),
  }).optional(),
});
const models = z.array(modelSchema).max(256);
const count = z.number().int().min(0).max(1e6);

/** The body of `POST /api/node/v1/enroll`. */
export const enrollSchema = z.object({
  token: z.string().min(1).max(200),
  publicJwk: z.object({
    kty: z.literal("OKP"),
    crv: z.literal("Ed25519"),
    x: z.string().regex(/^[A-Za-z0-9_-]{43}$/, "must be an Ed25519 key"),
  }),
  url: z.string().min(1).max(2000),
  name: name.optional(),
  engine: z.enum(ENGINE_KINDS),
  models: models.default([]),
  probe: z.record(z.string(), z.unknown()).nullable().default(null),
  version: z.string().max(100).nullable().default(null),
});

/** The body of `POST /api/node/v1/heartbeat`. */
export const heartbeatSchema = z.object({
  intervalMs: z.number().int().min(50).max(600_000),
  inFlight: count,
  queued: count,
  slots: count,
  tokensPerSecond: z.number().min(0).max(1e9),
  healthy: z.boolean(),
  detail: z.string().max(500).optional(),
  memory: z.object({ totalBytes: z.number().min(0), freeBytes: z.number() })
    .nullable().default(null),
  models,
  drainState: z.enum(["none", "draining", "drained"]),
  probe: z.record(z.string(), z.unknown()).optional(),
  /** The node's current URL, already validated by the caller. */
  url: z.string().min(1).max(2000).optional(),
  placement: z.object({
    desired: z.array(z.object({ id: z.string().max(200), pinned: z.boolean() }))
      .max(256),
    missing: z.array(z.string().max(200)).max(256),
    notLoaded: z.array(z.string().max(200)).max(256),
    extra: z.array(z.string().max(200)).max(256),
    errors: z.record(z.string().max(200), z.string().max(500)),
    mismatch: z.string().max(2000).nullable(),
  }).nullable().optional(),
});

function sizeCheck(value: unknown, what: string): void {
  if (JSON.stringify(value).length > MAX_VALUE_BYTES) {
    throw new ServiceError(413, "payload_too_large", `${what} is too large`);
  }
}

const REJECTION: Record<JoinRejection, string> = {
  malformed: "Join token is malformed",
  unknown: "Join token is not valid",
  expired: "Join token has expired",
  used: "Join token has no uses left",
};

/**
 * Enrolls a node: consumes a join token and creates the node, its key index
 * and its first status in one atomic write. `url` must be validated already.
 */
export async function enrollNode(
  store: Store,
  input: z.infer<typeof enrollSchema>,
  ip: string | null = null,
): Promise<NodeRecord> {
  const thumb = await jwkThumbprint(input.publicJwk);
  // A lost race on the token's use count is retried; a taken key is not.
  for (let attempt = 0; attempt < 8; attempt++) {
    const op = store.kv.atomic();
    const joined = await consumeJoinToken(store, input.token, op);
    if (!joined.ok) throw new UnauthorizedError(REJECTION[joined.reason]);
    const node: NodeRecord = {
      id: newId(),
      name: input.name ?? input.url,
      url: input.url,
      engine: input.engine,
      publicJwk: { kty: "OKP", crv: "Ed25519", x: input.publicJwk.x },
      keyThumbprint: thumb,
      drain: false,
      models: input.models,
      enrolledAt: new Date().toISOString(),
      joinTokenId: joined.token.id,
      version: input.version,
    };
    sizeCheck(node, "Node record");
    if (input.probe) sizeCheck(input.probe, "Probe");
    op.check({ key: k.nodeByKey(thumb), versionstamp: null })
      .set(k.node(node.id), node).set(k.nodeByKey(thumb), node.id);
    if (input.probe) op.set(k.nodeProbe(node.id), input.probe);
    const actor: Principal = {
      kind: "token",
      id: `join_token:${joined.token.id}`,
      label: "join token",
      role: "platform_admin",
      tenantId: null,
      ip,
    };
    const { publicJwk: _j, ...after } = node;
    addAudit(op, actor, {
      action: "node.enroll",
      target: { type: "node", id: node.id, label: node.name },
      tenantId: null,
      after,
    });
    if ((await op.commit()).ok) return node;
    if ((await store.kv.get(k.nodeByKey(thumb))).value) {
      throw new ConflictError(
        "This node key is already enrolled; restart the node without a join token",
      );
    }
  }
  throw new ConflictError("Join token is in heavy use; try again");
}

/** Reads a node record, or null. */
export async function getNodeRecord(
  store: Store,
  id: string,
): Promise<NodeRecord | null> {
  return (await store.kv.get<NodeRecord>(k.node(id))).value;
}

/**
 * Stores a heartbeat (and a changed URL, validated by the caller) and
 * returns whether the node should drain, its URL now, and the models it
 * should serve (null: no placement applies). Throws 401 when the node no
 * longer exists (it was removed).
 */
export async function recordHeartbeat(
  store: Store,
  nodeId: string,
  input: unknown,
): Promise<
  {
    drain: boolean;
    url: string;
    placement: PlacedModel[] | null;
    span: SpanAssignment | null;
  }
> {
  const hb = parse(heartbeatSchema, input);
  const status: NodeStatus = {
    at: new Date().toISOString(),
    intervalMs: hb.intervalMs,
    stats: {
      inFlight: hb.inFlight,
      queued: hb.queued,
      slots: hb.slots,
      tokensPerSecond: hb.tokensPerSecond,
      healthy: hb.healthy,
      ...(hb.detail ? { detail: hb.detail } : {}),
    },
    memory: hb.memory,
    models: hb.models,
    drainState: hb.drainState,
    ...(hb.placement !== undefined ? { placement: hb.placement } : {}),
  };
  sizeCheck(status, "Heartbeat");
  if (hb.probe) sizeCheck(hb.probe, "Probe");
  // The check on the node makes a removal win: no status outlives its node.
  for (let attempt = 0; attempt < 5; attempt++) {
    const [entry, placed, stored] = await store.kv.getMany<
      [NodeRecord, Placement, Record<string, unknown>]
    >([k.node(nodeId), k.placement(), k.nodeProbe(nodeId)]);
    if (!entry.value) throw new UnauthorizedError("Node is not enrolled");
    const facts = factsOf(
      entry.value.engine,
      hb.memory,
      hb.probe ?? stored.value,
    );
    const placement = desiredModels(
      placed.value ?? NO_PLACEMENT,
      nodeId,
      facts,
    );
    const span = await spanOf(
      store,
      placed.value ?? NO_PLACEMENT,
      nodeId,
      status,
    );
    const op = store.kv.atomic().check(entry).set(k.nodeStatus(nodeId), status);
    if (hb.probe) op.set(k.nodeProbe(nodeId), hb.probe);
    const url = hb.url ?? entry.value.url;
    if (url !== entry.value.url) {
      op.set(k.node(nodeId), { ...entry.value, url });
    }
    if ((await op.commit()).ok) {
      return { drain: entry.value.drain, url, placement, span };
    }
  }
  throw new ConflictError("Node changed concurrently; try again");
}

/**
 * A node's part in a spanning placement (fleet/placement.ts
 * spanAssignment), from its members' last heartbeats and link tests.
 */
async function spanOf(
  store: Store,
  placement: Placement,
  nodeId: string,
  own: NodeStatus,
): Promise<SpanAssignment | null> {
  const span = (placement.spans ?? []).find((s) => s.nodes.includes(nodeId));
  if (!span) return null;
  const others = span.nodes.filter((n) => n !== nodeId);
  const got = await store.kv.getMany<(NodeRecord | NodeStatus)[]>(
    others.flatMap((n) => [k.node(n), k.nodeStatus(n)]),
  );
  const views = new Map<string, SpanMemberView>();
  const instance = rpcInstanceId(span.id);
  const viewOf = (
    id: string,
    rec: NodeRecord | null,
    st: NodeStatus | null,
  ): SpanMemberView => {
    const m = st?.models.find((x) => x.instance?.id === instance);
    const me = m?.instance?.members.find((x) => x.nodeId === id);
    let urlHost: string | null = null;
    try {
      urlHost = rec ? new URL(rec.url).hostname.replace(/^\[|\]$/g, "") : null;
    } catch { /* not a URL */ }
    return {
      online: !!rec && isOnline(st),
      endpoint: m?.instance?.state === "ready"
        ? me?.addresses?.[0] ?? null
        : null,
      urlHost,
    };
  };
  others.forEach((id, i) => {
    views.set(
      id,
      viewOf(
        id,
        got[2 * i]!.value as NodeRecord | null,
        got[2 * i + 1]!.value as NodeStatus | null,
      ),
    );
  });
  const self = (await store.kv.get<NodeRecord>(k.node(nodeId))).value;
  views.set(nodeId, viewOf(nodeId, self, own));
  const links: LinkView[] = [];
  for (const other of others) {
    for (const [a, b] of [[nodeId, other], [other, nodeId]]) {
      const l = (await store.kv.get<LinkTestRecord>(k.linkTest(a!, b!))).value;
      if (l) links.push(l);
    }
  }
  links.sort((x, y) =>
    ((y as LinkTestRecord).at ?? "").localeCompare(
      (x as LinkTestRecord).at ?? "",
    )
  );
  return spanAssignment(
    placement,
    nodeId,
    (id) => views.get(id) ?? { online: false, endpoint: null, urlHost: null },
    links,
  );
}

/** A node with its status, probe and computed state, as admins see it. */
export interface NodeDetail extends Omit<NodeRecord, "publicJwk"> {
  state: "healthy" | "unhealthy" | "draining" | "drained";
  online: boolean;
  status: NodeStatus | null;
  probe: Record<string, unknown> | null;
  /**
   * Whether the gateway reached the node at its URL when it last checked
   * (null: not checked yet, or the URL changed since).
   */
  reachable: boolean | null;
  /** That check: the URL, when, and why it failed. */
  reachability: Reachability | null;
}

/** Missed heartbeats after which a node is unhealthy. */
export const MISSED_HEARTBEATS = 3;
/**
 * The least silence after which a node is unhealthy, whatever its
 * interval: gateways read node status every 500 ms (fleet/registry.ts), so
 * with 250 ms heartbeats, 3 missed (750 ms) flagged live nodes as down and
 * their requests got 503s.
 */
export const MIN_SILENCE_MS = 2000;

/** Whether the last heartbeat is recent (fewer than 3 intervals missed, and at least MIN_SILENCE_MS). */
export function isOnline(status: NodeStatus | null, now = Date.now()): boolean {
  if (!status) return false;
  return now - Date.parse(status.at) <=
    Math.max(status.intervalMs * MISSED_HEARTBEATS, MIN_SILENCE_MS);
}

/** The lifecycle state of a node from its record and last heartbeat. */
export function nodeState(
  node: Pick<NodeRecord, "drain">,
  status: NodeStatus | null,
  now = Date.now(),
): NodeDetail["state"] {
  const online = isOnline(status, now);
  if (node.drain) {
    if (status?.drainState === "drained") return "drained";
    return online ? "draining" : "unhealthy";
  }
  if (!online || !status!.stats.healthy) return "unhealthy";
  // Undrained but the node has not heard yet: it still refuses work.
  return status!.drainState === "none" ? "healthy" : "draining";
}

async function detail(
  store: Store,
  node: NodeRecord,
  now: number,
): Promise<NodeDetail> {
  const [s, probe, reach] = await store.kv.getMany<
    [NodeStatus, Record<string, unknown>, Reachability]
  >([k.nodeStatus(node.id), k.nodeProbe(node.id), k.nodeReach(node.id)]);
  const { publicJwk: _j, ...rest } = node;
  const reachability = reach.value?.url === node.url ? reach.value : null;
  return {
    ...rest,
    state: nodeState(node, s.value, now),
    online: isOnline(s.value, now),
    status: s.value,
    probe: probe.value,
    reachable: reachability?.ok ?? null,
    reachability,
  };
}

/** Lists every node with its state (platform admins only). */
export async function listNodes(
  store: Store,
  p: Principal,
): Promise<NodeDetail[]> {
  requirePlatform(p);
  const now = Date.now();
  const out: NodeDetail[] = [];
  for await (const e of store.kv.list<NodeRecord>({ prefix: k.nodePrefix() })) {
    out.push(await detail(store, e.value, now));
  }
  return out;
}

/** One node with its state (platform admins only); 404 when missing. */
export async function getNode(
  store: Store,
  p: Principal,
  id: string,
): Promise<NodeDetail> {
  requirePlatform(p);
  const node = await getNodeRecord(store, id);
  if (!node) throw new NotFoundError("Node");
  return await detail(store, node, Date.now());
}

/** Sets or clears the drain flag (platform admins only). */
export async function setNodeDrain(
  store: Store,
  p: Principal,
  id: string,
  drain: boolean,
): Promise<NodeDetail> {
  requirePlatform(p);
  for (let attempt = 0; attempt < 5; attempt++) {
    const entry = await store.kv.get<NodeRecord>(k.node(id));
    if (!entry.value) throw new NotFoundError("Node");
    const next = { ...entry.value, drain };
    const op = store.kv.atomic().check(entry).set(k.node(id), next);
    addAudit(op, p, {
      action: drain ? "node.drain" : "node.undrain",
      target: { type: "node", id, label: next.name },
      tenantId: null,
      before: { drain: entry.value.drain },
      after: { drain },
    });
    if ((await op.commit()).ok) return await detail(store, next, Date.now());
  }
  throw new ConflictError("Node changed concurrently; try again");
}

/**
 * Dedicates a node to a tenant, or shares it again (`tenantId` null);
 * platform admins only, audited. Gateways route by it from their next
 * fleet read (at most 500 ms; this instance's admin API reads at once).
 */
export async function setNodeDedication(
  store: Store,
  p: Principal,
  id: string,
  tenantId: string | null,
): Promise<NodeDetail> {
  requirePlatform(p);
  if (tenantId !== null) {
    if (typeof tenantId !== "string" || tenantId.length > 64) {
      throw new ValidationError(
        "tenantId must be a tenant id or null",
        "tenantId",
      );
    }
    if (!(await store.kv.get(k.tenant(tenantId))).value) {
      throw new NotFoundError("Tenant");
    }
  }
  for (let attempt = 0; attempt < 5; attempt++) {
    const entry = await store.kv.get<NodeRecord>(k.node(id));
    if (!entry.value) throw new NotFoundError("Node");
    const before = entry.value.dedicatedTo ?? null;
    const next = { ...entry.value, dedicatedTo: tenantId };
    const op = store.kv.atomic().check(entry).set(k.node(id), next);
    addAudit(op, p, {
      action: tenantId ? "node.dedicate" : "node.share",
      target: { type: "node", id, label: next.name },
      tenantId: tenantId ?? before,
      before: { dedicatedTo: before },
      after: { dedicatedTo: tenantId },
    });
    if ((await op.commit()).ok) return await detail(store, next, Date.now());
  }
  throw new ConflictError("Node changed concurrently; try again");
}

/** Removes a node and everything about it: status, probe, key index, link tests. */
export async function removeNode(
  store: Store,
  p: Principal,
  id: string,
): Promise<void> {
  requirePlatform(p);
  const entry = await store.kv.get<NodeRecord>(k.node(id));
  if (!entry.value) throw new NotFoundError("Node");
  const node = entry.value;
  const op = store.kv.atomic().check(entry)
    .delete(k.node(id)).delete(k.nodeStatus(id)).delete(k.nodeProbe(id))
    .delete(k.nodeReach(id)).delete(k.nodeByKey(node.keyThumbprint));
  const { publicJwk: _j, ...before } = node;
  addAudit(op, p, {
    action: "node.remove",
    target: { type: "node", id, label: node.name },
    tenantId: null,
    before,
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("Node changed concurrently; try again");
  }
  await forgetNodePlacement(store, p, id);
  // Link tests are many keys; removed after the node so none can be re-added.
  for await (const e of store.kv.list({ prefix: k.linkTestPrefix() })) {
    if (e.key[1] === id || e.key[2] === id) await store.kv.delete(e.key);
  }
}

/** Stores a link-test result for the pair (a, b), audited as `p`'s action. */
export async function saveLinkTest(
  store: Store,
  p: Principal,
  rec: LinkTestRecord,
): Promise<void> {
  requirePlatform(p);
  sizeCheck(rec, "Link test result");
  const [a, b] = await store.kv.getMany([k.node(rec.a), k.node(rec.b)]);
  if (!a.value || !b.value) return; // a node was removed meanwhile
  const op = store.kv.atomic().check(a).check(b).set(
    k.linkTest(rec.a, rec.b),
    rec,
  );
  addAudit(op, p, {
    action: "link.test",
    target: { type: "link", id: `${rec.a}:${rec.b}` },
    tenantId: null,
    after: { ok: rec.ok, error: rec.error },
  });
  await op.commit();
}

/** Lists every link-test result (platform admins only). */
export async function listLinkTests(
  store: Store,
  p: Principal,
): Promise<LinkTestRecord[]> {
  requirePlatform(p);
  const out: LinkTestRecord[] = [];
  const it = store.kv.list<LinkTestRecord>({ prefix: k.linkTestPrefix() });
  for await (const e of it) out.push(e.value);
  return out;
}
