/**
 * Stored Responses (`POST /v1/responses` with `store`, OpenAI's default):
 * each response with the conversation that led to it (its input items:
 * the previous response's input and output, then the request's own
 * input), kept for the tenant's retention period (store/retention.ts, 30
 * days by default), so that a later request names it as `previous_response_id`
 * and `GET`/`DELETE /v1/responses/{id}` read or delete it.
 *
 * A conversation outgrows one KV value (64 KiB), so its JSON is cut into
 * parts of at most 60,000 bytes, written (8 a commit) before the head that
 * counts them: a response is readable once its head is written, and a
 * write cut short leaves parts no head names, which expire.
 */
import { k } from "./kv_keys.ts";
import type { Store } from "./store.ts";

/** One day in milliseconds (the unit of the configured lifetime). */
export const DAY_MS = 86_400_000;
/** Largest part of a stored response's JSON. */
const PART_BYTES = 60_000;
/** Parts written in one commit (well under a commit's 800 KiB). */
const PARTS_PER_COMMIT = 8;
/** Keys `getMany` reads at once. */
const READ_BATCH = 10;

/** A stored response: the response object and the items it answered. */
export interface StoredResponse {
  /** The response object, as `GET /v1/responses/{id}` returns it. */
  response: Record<string, unknown>;
  /**
   * The conversation's items before this response's output, in the
   * Responses shape (messages, `function_call`, `function_call_output`).
   */
  input: Record<string, unknown>[];
}

/** A stored response's head. */
export interface Head {
  parts: number;
  bytes: number;
  /** Epoch ms; KV deletes expired keys lazily, so reads check it too. */
  expiresAt: number;
  /** Epoch ms it was stored (absent on older heads): the retention sweeper's clock. */
  createdAt?: number;
}

/** Stores a response for `ttlMs`; throws when KV refuses a commit. */
export async function saveResponse(
  store: Store,
  tenantId: string,
  id: string,
  value: StoredResponse,
  ttlMs: number,
): Promise<void> {
  const bytes = new TextEncoder().encode(JSON.stringify(value));
  const parts = Math.max(1, Math.ceil(bytes.length / PART_BYTES));
  const now = Date.now();
  const head: Head = {
    parts,
    bytes: bytes.length,
    expiresAt: now + ttlMs,
    createdAt: now,
  };
  for (let i = 0; i < parts; i += PARTS_PER_COMMIT) {
    const op = store.kv.atomic();
    const last = Math.min(parts, i + PARTS_PER_COMMIT);
    for (let j = i; j < last; j++) {
      op.set(
        k.responsePart(tenantId, id, j),
        bytes.slice(j * PART_BYTES, (j + 1) * PART_BYTES),
        { expireIn: ttlMs },
      );
    }
    if (last === parts) {
      op.set(k.response(tenantId, id), head, { expireIn: ttlMs });
    }
    const r = await op.commit();
    if (!r.ok) throw new Error("the stored response was not committed");
  }
}

async function readHead(
  store: Store,
  tenantId: string,
  id: string,
): Promise<{ head: Head; versionstamp: string } | null> {
  const e = await store.kv.get<Head>(k.response(tenantId, id));
  return e.value && e.value.expiresAt > Date.now()
    ? { head: e.value, versionstamp: e.versionstamp }
    : null;
}

/** A tenant's stored response; null when there is none (unknown, another tenant's, expired or deleted). */
export async function loadResponse(
  store: Store,
  tenantId: string,
  id: string,
): Promise<StoredResponse | null> {
  const head = (await readHead(store, tenantId, id))?.head;
  if (!head) return null;
  const bytes = new Uint8Array(head.bytes);
  let at = 0;
  for (let i = 0; i < head.parts; i += READ_BATCH) {
    const keys = [];
    for (let j = i; j < Math.min(head.parts, i + READ_BATCH); j++) {
      keys.push(k.responsePart(tenantId, id, j));
    }
    for (const e of await store.kv.getMany<Uint8Array[]>(keys)) {
      const part = e.value;
      if (!(part instanceof Uint8Array) || at + part.length > bytes.length) {
        return null; // deleted or expired while read
      }
      bytes.set(part, at);
      at += part.length;
    }
  }
  if (at !== bytes.length) return null;
  return JSON.parse(new TextDecoder().decode(bytes)) as StoredResponse;
}

/** Deletes a tenant's stored response; false when there was none. */
export async function deleteResponse(
  store: Store,
  tenantId: string,
  id: string,
): Promise<boolean> {
  const found = await readHead(store, tenantId, id);
  if (!found) return false;
  const { head, versionstamp } = found;
  const batch = PARTS_PER_COMMIT * 4;
  // the head first (it is gone at once, or another delete won), its parts follow
  for (let i = 0; i < head.parts; i += batch) {
    const op = store.kv.atomic();
    if (i === 0) {
      const key = k.response(tenantId, id);
      op.check({ key, versionstamp }).delete(key);
    }
    for (let j = i; j < Math.min(head.parts, i + batch); j++) {
      op.delete(k.responsePart(tenantId, id, j));
    }
    if (!(await op.commit()).ok) return false;
  }
  return true;
}
