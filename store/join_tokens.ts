/**
 * Join tokens for node enrollment: `id.secret`, stored as a keyed hash,
 * TTL ≤ 24 h, single use by default (or N uses). Consumption is atomic, so
 * concurrent enrollments can never overspend a token.
 */
import { hmac, randomBase62, safeEqual } from "../lib/crypto.ts";
import { addAudit } from "./audit.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import { listPage, type Page, type PageOptions } from "./pagination.ts";
import { type Principal, requirePlatform } from "./principal.ts";
import { joinTokenCreateSchema, parse } from "./schemas.ts";
import type { Store } from "./store.ts";

/** A stored join token (never the secret). */
export interface JoinToken {
  id: string;
  hash: string;
  usesLeft: number;
  uses: number;
  expiresAt: string;
  createdAt: string;
  createdBy: string;
}

/** A join token as listed. */
export type JoinTokenView = Omit<JoinToken, "hash">;

/** Creates a join token (platform admins only); `token` is shown once. */
export async function createJoinToken(
  store: Store,
  p: Principal,
  input: unknown,
): Promise<{ token: string; joinToken: JoinTokenView }> {
  requirePlatform(p);
  const data = parse(joinTokenCreateSchema, input ?? {});
  const id = newId();
  const secret = randomBase62(32);
  const ttlMs = data.ttlSeconds * 1000;
  const record: JoinToken = {
    id,
    hash: await hmac(store.secrets.pepper, secret),
    usesLeft: data.uses,
    uses: data.uses,
    expiresAt: new Date(Date.now() + ttlMs).toISOString(),
    createdAt: new Date().toISOString(),
    createdBy: p.id,
  };
  const { hash: _h, ...view } = record;
  const op = store.kv.atomic().set(k.joinToken(id), record, {
    expireIn: ttlMs,
  });
  addAudit(op, p, {
    action: "join_token.create",
    target: { type: "join_token", id },
    tenantId: null,
    after: view,
  });
  await op.commit();
  return { token: `${id}.${secret}`, joinToken: view };
}

/** Lists live join tokens (platform admins only). */
export function listJoinTokens(
  store: Store,
  p: Principal,
  opts: PageOptions = {},
): Promise<Page<JoinTokenView>> {
  requirePlatform(p);
  return listPage<JoinToken, JoinTokenView>(
    store.kv,
    { prefix: k.joinTokenPrefix() },
    opts,
    ({ hash: _h, ...v }) => Date.parse(v.expiresAt) > Date.now() ? v : null,
  );
}

/** Why a join token was refused. */
export type JoinRejection = "malformed" | "unknown" | "expired" | "used";

/**
 * Checks a join token and, in `op`, consumes one use (the caller commits
 * `op` together with the node it creates, so both happen or neither).
 */
export async function consumeJoinToken(
  store: Store,
  raw: string,
  op: Deno.AtomicOperation,
  now = Date.now(),
): Promise<
  { ok: true; token: JoinTokenView } | { ok: false; reason: JoinRejection }
> {
  const [id, secret, extra] = raw.split(".");
  if (
    !id || !secret || extra !== undefined || id.length > 64 ||
    secret.length > 64
  ) {
    return { ok: false, reason: "malformed" };
  }
  const entry = await store.kv.get<JoinToken>(k.joinToken(id));
  const t = entry.value;
  if (!t || !safeEqual(t.hash, await hmac(store.secrets.pepper, secret))) {
    return { ok: false, reason: "unknown" };
  }
  if (Date.parse(t.expiresAt) <= now) return { ok: false, reason: "expired" };
  if (t.usesLeft <= 0) return { ok: false, reason: "used" };
  op.check(entry);
  if (t.usesLeft === 1) op.delete(k.joinToken(id));
  else {
    op.set(k.joinToken(id), { ...t, usesLeft: t.usesLeft - 1 }, {
      expireIn: Math.max(1, Date.parse(t.expiresAt) - now),
    });
  }
  const { hash: _h, ...view } = t;
  return { ok: true, token: { ...view, usesLeft: t.usesLeft - 1 } };
}
