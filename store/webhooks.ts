/**
 * Webhook endpoints (a tenant's, or the provider's own) and their
 * deliveries. Each endpoint has a signing secret (`whsec_…`) shown once, at
 * creation; it is kept encrypted (AES-GCM, under a key derived from the
 * server pepper) because every delivery is signed with it:
 *
 *     Orchard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>
 *
 * as Stripe signs its webhooks (README: how to verify). An event becomes
 * one delivery per endpoint, queued in KV in the same commit as what it
 * tells (store/budget_alerts.ts), and sent by the gateway's dispatcher
 * (store/webhook_dispatch.ts) at least once: retried with backoff, its
 * attempts logged. Bodies carry ids, names and numbers: never prompts,
 * keys or secrets.
 */
import { z } from "zod";
import { fromBase64Url, hmac, safeEqual, toBase64Url } from "../lib/crypto.ts";
import { addAudit } from "./audit.ts";
import { ConflictError, NotFoundError, ValidationError } from "./errors.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { type Page, type PageOptions, pageSize } from "./pagination.ts";
import {
  type Principal,
  requirePlatform,
  requireTenantRead,
  requireTenantWrite,
} from "./principal.ts";
import { parse } from "./schemas.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";
import { validateWebhookUrl } from "./webhook_url.ts";

/** Most endpoints per tenant (and for the provider). */
export const MAX_ENDPOINTS = 10;

/** How long deliveries (and their log) are kept after their last change. */
export const DELIVERY_TTL_MS = 30 * 86_400_000;

/** A webhook endpoint as stored. */
export interface WebhookEndpoint {
  id: string;
  /** The tenant it belongs to; null: the provider's own (every tenant's events). */
  tenantId: string | null;
  url: string;
  description: string;
  /** The signing secret, encrypted. */
  secretBox: { iv: string; data: string };
  /** The secret's last 4 characters, to tell secrets apart. */
  secretLast4: string;
  createdAt: string;
  createdBy: string;
}

/** An endpoint as shown (never its secret). */
export type WebhookView = Omit<WebhookEndpoint, "secretBox">;

/** One attempt to deliver. */
export interface DeliveryAttempt {
  at: string;
  /** The receiver's HTTP status; null when none came (network error, timeout, refused URL). */
  status: number | null;
  error: string | null;
  ms: number;
}

/** One event on its way to one endpoint. */
export interface WebhookDelivery {
  id: string;
  endpointId: string;
  /** Its endpoint's owner: a tenant, or null for the provider. */
  tenantId: string | null;
  url: string;
  /** The event's id, the same for every endpoint and attempt: receivers deduplicate by it. */
  eventId: string;
  eventType: string;
  /** The JSON body sent (the same bytes every attempt). */
  body: string;
  status: "pending" | "delivered" | "failed";
  attempts: number;
  /** When it is tried next (epoch ms); null once delivered or failed. */
  nextAttemptAt: number | null;
  lastStatus: number | null;
  lastError: string | null;
  createdAt: string;
  deliveredAt: string | null;
  /** The latest attempts, oldest first (at most 10). */
  log: DeliveryAttempt[];
}

/** An event as delivered (the body's shape). */
export interface WebhookEvent {
  /** Idempotency id: the same on every endpoint and every retry. */
  id: string;
  type: string;
  /** Unix seconds. */
  created: number;
  data: unknown;
}

/** The owner part of KV keys: a tenant id, or "provider". */
export const ownerOf = (tenantId: string | null) => tenantId ?? "provider";

/** The body that adds a webhook endpoint. */
export const webhookCreateSchema = z.object({
  url: z.string({ error: "must be a string" }),
  description: z.string({ error: "must be a string" }).trim().max(
    200,
    "must be at most 200 characters",
  ).optional().default(""),
}).strict();

const encoder = new TextEncoder();
const boxKeys = new WeakMap<Store, Promise<CryptoKey>>();

/** The AES-GCM key secrets are kept under, derived from the server pepper. */
function boxKey(store: Store): Promise<CryptoKey> {
  let key = boxKeys.get(store);
  if (!key) {
    key = hmac(store.secrets.pepper, "orchard webhook secrets v1").then((b) =>
      crypto.subtle.importKey(
        "raw",
        fromBase64Url(b) as BufferSource,
        { name: "AES-GCM" },
        false,
        ["encrypt", "decrypt"],
      )
    );
    boxKeys.set(store, key);
  }
  return key;
}

async function seal(
  store: Store,
  secret: string,
): Promise<WebhookEndpoint["secretBox"]> {
  const iv = crypto.getRandomValues(new Uint8Array(12));
  const data = await crypto.subtle.encrypt(
    { name: "AES-GCM", iv },
    await boxKey(store),
    encoder.encode(secret),
  );
  return { iv: toBase64Url(iv), data: toBase64Url(new Uint8Array(data)) };
}

/** An endpoint's signing secret (the dispatcher's, to sign). */
export async function openSecret(
  store: Store,
  e: WebhookEndpoint,
): Promise<string> {
  const data = await crypto.subtle.decrypt(
    { name: "AES-GCM", iv: fromBase64Url(e.secretBox.iv) as BufferSource },
    await boxKey(store),
    fromBase64Url(e.secretBox.data) as BufferSource,
  );
  return new TextDecoder().decode(data);
}

function hex(bytes: ArrayBuffer): string {
  return [...new Uint8Array(bytes)].map((b) => b.toString(16).padStart(2, "0"))
    .join("");
}

/** HMAC-SHA256 of `<timestamp>.<body>` under the secret, hex. */
async function sign(
  secret: string,
  timestamp: number,
  body: string,
): Promise<string> {
  const key = await crypto.subtle.importKey(
    "raw",
    encoder.encode(secret),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  return hex(
    await crypto.subtle.sign(
      "HMAC",
      key,
      encoder.encode(`${timestamp}.${body}`),
    ),
  );
}

/** The `Orchard-Signature` header of a body sent at `timestamp` (unix seconds). */
export async function signatureHeader(
  secret: string,
  timestamp: number,
  body: string,
): Promise<string> {
  return `t=${timestamp},v1=${await sign(secret, timestamp, body)}`;
}

/**
 * Verifies an `Orchard-Signature` header as a receiver does (the README's
 * recipe): a `v1` signature of `<t>.<body>` matches, and `t` is within
 * `toleranceSec` of `now` (replays of old deliveries are refused).
 */
export async function verifySignature(
  secret: string,
  header: string | null,
  body: string,
  toleranceSec = 300,
  now = Date.now(),
): Promise<boolean> {
  if (!header) return false;
  const parts = header.split(",").map((p) => p.trim().split("="));
  const t = Number(parts.find(([n]) => n === "t")?.[1]);
  if (!Number.isInteger(t) || Math.abs(now / 1000 - t) > toleranceSec) {
    return false;
  }
  const want = await sign(secret, t, body);
  return parts.some(([n, v]) =>
    n === "v1" && typeof v === "string" && safeEqual(v, want)
  );
}

function view(e: WebhookEndpoint): WebhookView {
  const { secretBox: _s, ...rest } = e;
  return rest;
}

/** Who may manage `tenantId`'s endpoints (null: the provider's, platform admins only). */
async function requireOwner(
  store: Store,
  p: Principal,
  tenantId: string | null,
  write: boolean,
): Promise<void> {
  if (tenantId === null) {
    requirePlatform(p);
    return;
  }
  if (write) requireTenantWrite(p, tenantId);
  else requireTenantRead(p, tenantId);
  if (!(await getTenantRaw(store, tenantId))) throw new NotFoundError("Tenant");
}

/**
 * Creates an endpoint for a tenant (its admins, or platform admins) or,
 * with `tenantId` null, for the provider (platform admins). The result's
 * `secret` is the only time it is seen.
 */
export async function createWebhook(
  store: Store,
  p: Principal,
  tenantId: string | null,
  input: unknown,
  allowPrivate: boolean,
): Promise<{ secret: string; webhook: WebhookView }> {
  await requireOwner(store, p, tenantId, true);
  const data = parse(webhookCreateSchema, input);
  const url = validateWebhookUrl(data.url, allowPrivate);
  const owner = ownerOf(tenantId);
  const existing = await endpointsOf(store, tenantId);
  if (existing.length >= MAX_ENDPOINTS) {
    throw new ValidationError(
      `url: at most ${MAX_ENDPOINTS} webhook endpoints; delete one first`,
      "url",
    );
  }
  const secret = `whsec_${
    toBase64Url(crypto.getRandomValues(new Uint8Array(32)))
  }`;
  const endpoint: WebhookEndpoint = {
    id: newId(),
    tenantId,
    url,
    description: data.description,
    secretBox: await seal(store, secret),
    secretLast4: secret.slice(-4),
    createdAt: new Date().toISOString(),
    createdBy: p.label,
  };
  const op = store.kv.atomic()
    .check({ key: k.webhook(endpoint.id), versionstamp: null })
    .set(k.webhook(endpoint.id), endpoint)
    .set(k.webhookByOwner(owner, endpoint.id), endpoint.id);
  addAudit(op, p, {
    action: "webhook.create",
    target: { type: "webhook", id: endpoint.id, label: url },
    tenantId,
    after: view(endpoint),
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The webhook changed meanwhile; try again");
  }
  return { secret, webhook: view(endpoint) };
}

/** The endpoints of a tenant, or the provider's (no access checks). */
export async function endpointsOf(
  store: Store,
  tenantId: string | null,
): Promise<WebhookEndpoint[]> {
  const ids: string[] = [];
  const iter = store.kv.list<string>({
    prefix: k.webhookByOwnerPrefix(ownerOf(tenantId)),
  });
  for await (const e of iter) ids.push(e.value);
  const out: WebhookEndpoint[] = [];
  for (let i = 0; i < ids.length; i += 10) {
    const got = await store.kv.getMany<WebhookEndpoint[]>(
      ids.slice(i, i + 10).map((id) => k.webhook(id)),
    );
    for (const g of got) if (g.value) out.push(g.value);
  }
  return out;
}

/** Lists the endpoints of a tenant, or (null) the provider's. */
export async function listWebhooks(
  store: Store,
  p: Principal,
  tenantId: string | null,
): Promise<WebhookView[]> {
  await requireOwner(store, p, tenantId, false);
  return (await endpointsOf(store, tenantId)).map(view);
}

/** Deletes an endpoint; its pending deliveries fail ("endpoint deleted"). */
export async function deleteWebhook(
  store: Store,
  p: Principal,
  tenantId: string | null,
  id: string,
): Promise<WebhookView> {
  await requireOwner(store, p, tenantId, true);
  const entry = id.length <= 64
    ? await store.kv.get<WebhookEndpoint>(k.webhook(id))
    : null;
  if (!entry?.value || entry.value.tenantId !== tenantId) {
    throw new NotFoundError("Webhook");
  }
  const op = store.kv.atomic().check(entry).delete(k.webhook(id))
    .delete(k.webhookByOwner(ownerOf(tenantId), id));
  addAudit(op, p, {
    action: "webhook.delete",
    target: { type: "webhook", id, label: entry.value.url },
    tenantId,
    before: view(entry.value),
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError("The webhook changed meanwhile; try again");
  }
  return view(entry.value);
}

/**
 * Adds one delivery of `event` per endpoint to `op`, due now (the
 * dispatcher sends it). Three mutations an endpoint.
 */
export function enqueueDeliveries(
  op: Deno.AtomicOperation,
  endpoints: readonly WebhookEndpoint[],
  event: WebhookEvent,
  now = Date.now(),
): number {
  const body = JSON.stringify(event);
  for (const e of endpoints) {
    const d: WebhookDelivery = {
      id: newId(),
      endpointId: e.id,
      tenantId: e.tenantId,
      url: e.url,
      eventId: event.id,
      eventType: event.type,
      body,
      status: "pending",
      attempts: 0,
      nextAttemptAt: now,
      lastStatus: null,
      lastError: null,
      createdAt: new Date(now).toISOString(),
      deliveredAt: null,
      log: [],
    };
    const ttl = { expireIn: DELIVERY_TTL_MS };
    op.set(k.webhookDelivery(d.id), d, ttl)
      .set(k.webhookDeliveryByOwner(ownerOf(e.tenantId), d.id), d.id, ttl)
      .set(k.webhookDue(now, d.id), d.id);
  }
  return endpoints.length;
}

/** A delivery as listed: the body left out (its event id and type say what it was). */
export type DeliveryView = Omit<WebhookDelivery, "body">;

/** The deliveries of a tenant's endpoints, or (null) the provider's, newest first. */
export async function listDeliveries(
  store: Store,
  p: Principal,
  tenantId: string | null,
  opts: PageOptions = {},
): Promise<Page<DeliveryView>> {
  await requireOwner(store, p, tenantId, false);
  const limit = pageSize(opts.limit);
  const iter = store.kv.list<string>(
    { prefix: k.webhookDeliveryByOwnerPrefix(ownerOf(tenantId)) },
    {
      reverse: true,
      limit,
      cursor: opts.cursor && /^[A-Za-z0-9_\-+/=]{1,1024}$/.test(opts.cursor)
        ? opts.cursor
        : undefined,
    },
  );
  const ids: string[] = [];
  try {
    for await (const e of iter) ids.push(e.value);
  } catch {
    throw new ValidationError("cursor is invalid", "cursor");
  }
  const items: DeliveryView[] = [];
  for (let i = 0; i < ids.length; i += 10) {
    const got = await store.kv.getMany<WebhookDelivery[]>(
      ids.slice(i, i + 10).map((id) => k.webhookDelivery(id)),
    );
    for (const g of got) {
      if (!g.value) continue;
      const { body: _b, ...rest } = g.value;
      items.push(rest);
    }
  }
  return {
    items,
    cursor: ids.length === limit ? iter.cursor || null : null,
  };
}
