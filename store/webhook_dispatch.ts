/**
 * Sends queued webhook deliveries (store/webhooks.ts), at least once: the
 * queue is in KV (`webhook_due`, by due time), so deliveries survive
 * restarts and any gateway process sharing the KV may send them. An
 * attempt first claims its delivery in one commit (its due entry moves
 * `claimMs` ahead: a sender that dies mid-attempt leaves it to be tried
 * again then), POSTs the body signed afresh, and records the outcome: on a
 * 2xx it is delivered; otherwise it is tried again after 1 min, 2, 4, … up
 * to `maxDelayMs` (24 h) between attempts, until `maxAttempts`. Redirects
 * are not followed, and a host that resolves to a private address is
 * refused unless the operator allows it. Nothing here logs a body or a
 * secret.
 */
import { type Logger, silentLogger } from "../lib/log.ts";
import { k } from "./kv_keys.ts";
import type { Store } from "./store.ts";
import {
  DELIVERY_TTL_MS,
  openSecret,
  signatureHeader,
  type WebhookDelivery,
  type WebhookEndpoint,
} from "./webhooks.ts";
import {
  fetchPinned,
  publicAddress,
  resolveDns,
  type Resolver,
} from "./webhook_url.ts";

/** Tunables of a dispatcher (tests shorten the intervals and inject a clock). */
export interface DispatcherOptions {
  /** Send to private and loopback hosts (ORCHARD_ALLOW_PRIVATE_WEBHOOK_URLS). */
  allowPrivate: boolean;
  /** The clock (epoch ms) for due times and signature timestamps. */
  now?: () => number;
  /**
   * Sends a request (default: fetch, connected to `address`, the checked
   * address of the URL's host, when there is one).
   */
  fetch?: (
    url: string,
    init: RequestInit,
    address: string | null,
  ) => Promise<Response>;
  /** Looks up a host's addresses (default: DNS A and AAAA records). */
  resolve?: Resolver;
  /** Delay after the first failed attempt; doubles each time (default 60 s). */
  baseDelayMs?: number;
  /** Longest delay between attempts (default 24 h). */
  maxDelayMs?: number;
  /** Attempts before a delivery fails for good (default 20: about a week). */
  maxAttempts?: number;
  /** How long an attempt may take (default 10 s). */
  timeoutMs?: number;
  /** How often due deliveries are looked for (default 1 s). */
  pollMs?: number;
  /** How long a claimed attempt holds its delivery (default 60 s). */
  claimMs?: number;
  /** Most attempts in flight at once (default 16). */
  batch?: number;
  log?: Logger;
}

/** The delay before attempt `attempts + 1`, after `attempts` failures. */
export function backoffMs(
  attempts: number,
  baseMs: number,
  maxMs: number,
): number {
  return Math.min(maxMs, baseMs * 2 ** Math.max(0, attempts - 1));
}

/** Sends due deliveries: a loop (`start`), or a pass on demand (`runOnce`). */
export class WebhookDispatcher {
  readonly #store: Store;
  readonly #o: Required<Omit<DispatcherOptions, "log">> & { log: Logger };
  #timer: ReturnType<typeof setInterval> | undefined;
  #running: Promise<number> | null = null;
  #again = false;
  #closed = false;

  constructor(store: Store, opts: DispatcherOptions) {
    this.#store = store;
    this.#o = {
      allowPrivate: opts.allowPrivate,
      now: opts.now ?? Date.now,
      fetch: opts.fetch ??
        ((url, init, address) =>
          address ? fetchPinned(url, init, address) : fetch(url, init)),
      resolve: opts.resolve ?? resolveDns,
      baseDelayMs: opts.baseDelayMs ?? 60_000,
      maxDelayMs: opts.maxDelayMs ?? 86_400_000,
      maxAttempts: opts.maxAttempts ?? 20,
      timeoutMs: opts.timeoutMs ?? 10_000,
      pollMs: opts.pollMs ?? 1000,
      claimMs: opts.claimMs ?? 60_000,
      batch: opts.batch ?? 16,
      log: opts.log ?? silentLogger,
    };
  }

  /** Looks for due deliveries every `pollMs` until `close()`. */
  start(): void {
    if (this.#timer !== undefined || this.#closed) return;
    this.#timer = setInterval(() => this.kick(), this.#o.pollMs);
    Deno.unrefTimer(this.#timer);
    this.kick();
  }

  /** Runs a pass now (or right after the one running). */
  kick(): void {
    if (this.#closed) return;
    if (this.#running) {
      this.#again = true;
      return;
    }
    this.#running = this.#loop().finally(() => this.#running = null);
  }

  async #loop(): Promise<number> {
    let n = 0;
    do {
      this.#again = false;
      n += await this.runOnce().catch((e) => {
        this.#o.log.warn("webhook dispatch failed", { error: String(e) });
        return 0;
      });
    } while (this.#again && !this.#closed);
    return n;
  }

  /** Resolves once the pass in progress (if any) is done. */
  async idle(): Promise<void> {
    await this.#running;
  }

  /** Stops the loop, waiting for attempts in flight. */
  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#timer);
    this.#timer = undefined;
    await this.#running;
  }

  /**
   * One pass: every delivery due by now, attempted (up to `batch` at once,
   * in due order). Resolves with how many attempts were made.
   */
  async runOnce(): Promise<number> {
    const kv = this.#store.kv;
    let made = 0;
    for (;;) {
      const now = this.#o.now();
      const due: Deno.KvEntry<string>[] = [];
      const iter = kv.list<string>({
        start: k.webhookDuePrefix(),
        end: [...k.webhookDuePrefix(), now + 1],
      }, { limit: this.#o.batch });
      for await (const e of iter) due.push(e);
      if (due.length === 0) return made;
      const done = await Promise.all(due.map((e) => this.#attempt(e)));
      made += done.filter(Boolean).length;
      if (due.length < this.#o.batch) return made;
    }
  }

  /** Claims, sends and records one delivery; false when not attempted. */
  async #attempt(due: Deno.KvEntry<string>): Promise<boolean> {
    const kv = this.#store.kv;
    const o = this.#o;
    const id = due.value;
    const d = await kv.get<WebhookDelivery>(k.webhookDelivery(id));
    if (!d.value || d.value.status !== "pending") {
      await kv.atomic().check(due).delete(due.key).commit();
      return false;
    }
    const claimedAt = o.now();
    const claimUntil = claimedAt + o.claimMs;
    const claim = await kv.atomic().check(due).check(d)
      .delete(due.key)
      .set(k.webhookDue(claimUntil, id), id)
      .set(
        k.webhookDelivery(id),
        { ...d.value, nextAttemptAt: claimUntil },
        { expireIn: DELIVERY_TTL_MS },
      )
      .commit();
    if (!claim.ok) return false; // another sender took it
    const delivery = d.value;
    const endpoint = (await kv.get<WebhookEndpoint>(
      k.webhook(delivery.endpointId),
    )).value;
    const t0 = performance.now();
    let status: number | null = null;
    let error: string | null = null;
    let final = false;
    if (!endpoint) {
      error = "the endpoint was deleted";
      final = true;
    } else {
      const { why, address } = o.allowPrivate
        ? { why: null, address: null }
        : await publicAddress(endpoint.url, o.resolve);
      if (why) error = `refused: ${why}`;
      else {
        try {
          const ts = Math.floor(o.now() / 1000);
          const secret = await openSecret(this.#store, endpoint);
          const res = await o.fetch(endpoint.url, {
            method: "POST",
            headers: {
              "content-type": "application/json",
              "user-agent": "Orchard-Webhooks/1",
              "orchard-signature": await signatureHeader(
                secret,
                ts,
                delivery.body,
              ),
              "orchard-event-id": delivery.eventId,
            },
            body: delivery.body,
            redirect: "manual",
            signal: AbortSignal.timeout(o.timeoutMs),
          }, address);
          status = res.status;
          await res.body?.cancel().catch(() => {});
          if (status < 200 || status >= 300) error = `HTTP ${status}`;
        } catch (e) {
          error = e instanceof DOMException && e.name === "TimeoutError"
            ? `no answer within ${o.timeoutMs} ms`
            : String((e as Error)?.message ?? e).slice(0, 200);
        }
      }
    }
    const now = o.now();
    const attempts = delivery.attempts + 1;
    const ok = error === null;
    final ||= !ok && attempts >= o.maxAttempts;
    const next = ok || final
      ? null
      : now + backoffMs(attempts, o.baseDelayMs, o.maxDelayMs);
    const after: WebhookDelivery = {
      ...delivery,
      status: ok ? "delivered" : final ? "failed" : "pending",
      attempts,
      nextAttemptAt: next,
      lastStatus: status,
      lastError: error,
      deliveredAt: ok ? new Date(now).toISOString() : null,
      log: [...delivery.log, {
        at: new Date(claimedAt).toISOString(),
        status,
        error,
        ms: Math.round(performance.now() - t0),
      }].slice(-10),
    };
    const op = kv.atomic()
      .check({ key: k.webhookDelivery(id), versionstamp: claim.versionstamp })
      .delete(k.webhookDue(claimUntil, id))
      .set(k.webhookDelivery(id), after, { expireIn: DELIVERY_TTL_MS });
    if (next !== null) op.set(k.webhookDue(next, id), id);
    await op.commit();
    const fields = {
      delivery: id,
      endpoint: delivery.endpointId,
      event: delivery.eventId,
      attempts,
      status,
    };
    if (ok) o.log.info("webhook delivered", fields);
    else {
      o.log.warn(
        final ? "webhook delivery failed for good" : "webhook delivery failed",
        { ...fields, error, retryAt: next && new Date(next).toISOString() },
      );
    }
    return true;
  }
}
