/**
 * The gateway's shared state and the lifecycle of one request (`Exchange`):
 * authenticate, resolve the model, admit against limits, and on the way out
 * settle the reservation, meter usage and count metrics exactly once.
 */
import type { Fleet } from "../fleet/types.ts";
import type { ModelKind } from "../protocol/engine.ts";
import { OpenAIError } from "../protocol/openai/errors.ts";
import type { AppDeps } from "../app.ts";
import {
  type Admission,
  Admitter,
  billedCost,
  QuotaUnavailableError,
  type RequestPrice,
  type Reservation,
} from "../store/quota/mod.ts";
import {
  type DispatcherOptions,
  WebhookDispatcher,
} from "../store/webhook_dispatch.ts";
import { rollupsOf } from "../store/usage_rollups.ts";
import { BudgetMonitor } from "./budget_monitor.ts";
import { PriceCache } from "./prices.ts";
import { SettledUse } from "./settled_use.ts";
import { GatewayInstance } from "../store/instances.ts";
import type { Scope } from "../store/schemas.ts";
import { newId } from "../store/ids.ts";
import { k } from "../store/kv_keys.ts";
import { activeSpan, withSpan } from "../lib/trace.ts";
import type { UsageRecord } from "../store/usage.ts";
import {
  type AuthContext,
  KeyCache,
  modelAllowed,
  presentedKey,
  requireScope,
} from "./auth.ts";
import { log, type Logger } from "../lib/log.ts";
import type { ReportedUsage, UsageBasis } from "./normalise.ts";
import { UsageWriter } from "./metering.ts";
import { GatewayMetrics } from "./metrics.ts";
import {
  type CapacityError,
  DEFAULT_QUEUE_TIMEOUT_MS,
  NodeRouter,
  type RouterOptions,
  type SlotGrant,
} from "./router.ts";
import { DEFAULT_PROXY, type ProxyOptions, Upstream } from "./upstream.ts";
import { promptUpper, type TemplateOverhead } from "./tokens.ts";
import type { ParsedRequest } from "./validate.ts";
import { quotaHeaders, rejectionError } from "./ratelimit_headers.ts";
import { startRetentionSweeper } from "../store/retention_sweep.ts";

/** Tunables of the gateway (tests shorten timeouts). */
export interface GatewayOptions {
  proxy?: Partial<ProxyOptions>;
  router?: RouterOptions;
  /** Key verification cache lifetime, ≤ 1000 ms. */
  keyCacheTtlMs?: number;
  logger?: Logger;
  /** Completion cap reserved when neither the client nor the model gives one. */
  defaultMaxTokens?: number;
  /** Extra time past the total timeout before a held reservation counts as crashed. */
  reservationGraceMs?: number;
  /**
   * This gateway instance's id (store/instances.ts): every reservation
   * records it, and `start()` reclaims what its previous incarnation held
   * and keeps its liveness record, so what a crashed gateway held is
   * reclaimed in seconds. Without one, only after its deadline.
   */
  instanceId?: string;
  /**
   * The webhook dispatcher's tunables (store/webhook_dispatch.ts; tests
   * shorten its intervals and inject a clock). It sends deliveries from
   * `start()` on; `false`: never (another process sends them).
   */
  webhooks?: Partial<DispatcherOptions> | false;
  /**
   * Sweep records past their tenant's retention (store/retention_sweep.ts)
   * hourly from `start()` on (default true; any gateway sharing the KV may).
   */
  retentionSweep?: boolean;
  /** Least time between two budget checks of one tenant (default 2 s). */
  budgetCheckMs?: number;
  /**
   * How long a request refused only for what requests in flight hold
   * (a day, month or budget quota they would leave room in once settled)
   * waits for them, admitted as soon as it fits, before its retryable
   * 429 (default 2000 ms; 0: answer at once).
   */
  heldWaitMs?: number;
  /**
   * Where usage records are journaled before they reach KV
   * (store/usage_journal.ts; main.ts: `<data dir>/usage-journal`); `start()`
   * replays what stopped gateways left there. Without one, a crash loses
   * the records still waiting to be written.
   */
  usageJournalDir?: string;
}

/** Everything the handlers share. */
export class GatewayCore {
  readonly keys: KeyCache;
  readonly admitter: Admitter;
  readonly router: NodeRouter;
  readonly upstream: Upstream;
  readonly metrics = new GatewayMetrics();
  readonly usage: UsageWriter;
  readonly log: Logger;
  readonly proxy: ProxyOptions;
  readonly defaultMaxTokens: number;
  /** See GatewayOptions.heldWaitMs. */
  readonly heldWaitMs: number;
  /** Wakes requests waiting for room held by requests in flight (see settlement()). */
  readonly #settleWaiters = new Set<() => void>();
  readonly reservationTtlMs: number;
  /** Liveness and reclaiming (null without `instanceId`). */
  readonly instance: GatewayInstance | null;
  /** Model prices, for money budgets. */
  readonly prices: PriceCache;
  /** Budget checks as usage lands, and the alerts they create. */
  readonly budgets: BudgetMonitor;
  /** What quota windows really used (rollups): tells a refusal by requests in flight from one by spent quota. */
  readonly settled: SettledUse;
  /** Sends queued webhook deliveries (from `start()`, unless disabled). */
  readonly webhooks: WebhookDispatcher;
  readonly #sendWebhooks: boolean;
  readonly #sweep: boolean;
  #sweeper: { stop(): Promise<void> } | null = null;
  readonly #unwatchUsage: () => void;
  readonly #pending = new Set<Promise<unknown>>();
  readonly #journalDir: string | null;

  constructor(
    readonly deps: AppDeps & { fleet: Fleet },
    opts: GatewayOptions = {},
  ) {
    this.log = opts.logger ?? log;
    this.proxy = { ...DEFAULT_PROXY, ...opts.proxy };
    this.keys = new KeyCache(deps.store, { ttlMs: opts.keyCacheTtlMs });
    this.admitter = new Admitter(deps.store, {
      // denokv's protocol documents at most 10 checks per atomic write.
      maxChecks: deps.config.kvUrl ? 10 : 100,
      owner: opts.instanceId,
      reclaimDueMs: () => this.instance?.reclaimDueMs() ?? 0,
      onReclaimed: (count) =>
        this.log.info("reclaimed expired reservations", { count }),
    });
    this.instance = opts.instanceId
      ? new GatewayInstance(deps.store, opts.instanceId, {
        reclaim: async (owners) => {
          if (this.#journalDir) {
            await this.usage.replayJournals(
              this.#journalDir,
              (i) => owners.has(i),
            ).catch((e) => this.#replayFailed(e));
          }
          const n = await this.admitter.reclaimOwned(owners);
          if (n > 0) {
            this.log.info("reclaimed what stopped gateways held", {
              instances: [...owners],
              count: n,
            });
          }
          return n;
        },
        onLost: () => {
          this.log.warn(
            "this gateway's liveness lapsed and another reclaimed its reservations; its leases are dropped",
            { instance: opts.instanceId },
          );
          this.admitter.dropLeases();
        },
      })
      : null;
    this.router = new NodeRouter(deps.fleet, {
      queueTimeoutMs: deps.config.queueTimeoutMs,
      queueTimeoutByModel: deps.config.queueTimeoutByModel,
      ...opts.router,
    });
    this.upstream = new Upstream(deps.fleet, this.router, this.proxy);
    this.usage = new UsageWriter(deps.store, this.log);
    this.prices = new PriceCache(deps.store);
    this.settled = new SettledUse(deps.store);
    this.#sendWebhooks = opts.webhooks !== false;
    this.#sweep = opts.retentionSweep ?? true;
    this.webhooks = new WebhookDispatcher(deps.store, {
      allowPrivate: deps.config.allowPrivateWebhookUrls,
      log: this.log,
      ...(opts.webhooks || {}),
    });
    this.budgets = new BudgetMonitor(deps.store, {
      minIntervalMs: opts.budgetCheckMs,
      log: this.log,
      onAlerts: () => {
        if (this.#sendWebhooks) this.webhooks.kick();
      },
    });
    this.#unwatchUsage = rollupsOf(deps.store).onWritten((tenants) =>
      this.budgets.written(tenants)
    );
    this.#journalDir = opts.usageJournalDir ?? null;
    this.defaultMaxTokens = opts.defaultMaxTokens ?? 4096;
    this.heldWaitMs = opts.heldWaitMs ?? 2000;
    this.reservationTtlMs = this.proxy.totalTimeoutMs +
      (opts.reservationGraceMs ?? 60_000) +
      Math.max(
        opts.router?.queueTimeoutMs ?? deps.config.queueTimeoutMs ??
          DEFAULT_QUEUE_TIMEOUT_MS,
        ...Object.values(
          opts.router?.queueTimeoutByModel ??
            deps.config.queueTimeoutByModel ?? {},
        ),
      );
  }

  /**
   * Whether a day, month or spend refusal is only for what requests in
   * flight hold: what the window really used (the rollups) leaves room
   * for what the request needs, so it fits once they settle.
   */
  async heldOnly(
    a: Extract<Admission, { ok: false }>,
    tenantId: string,
  ): Promise<boolean> {
    if (a.reason !== "quota" || a.needed === undefined) return false;
    const fits = (spent: number) => a.rule.limit - spent >= a.needed!;
    try {
      if (!fits(await this.settled.of(a.rule, tenantId))) return false;
      // The rollups may not hold this gateway's finished requests yet
      // (they are written every few seconds): write them, read again.
      const asked = Date.now();
      await this.usage.flush();
      return fits(await this.settled.of(a.rule, tenantId, asked));
    } catch (e) {
      this.log.warn("cannot read the window's usage; refused as spent", {
        error: String(e),
      });
      return false;
    }
  }

  /**
   * Resolves when this gateway next lands a settlement (room may have
   * freed), or after `ms` (another gateway's settlement frees room
   * unannounced).
   */
  settlement(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.#settleWaiters.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.#settleWaiters.add(wake);
    });
  }

  /** Wakes every request waiting in settlement(). */
  wakeSettled(): void {
    for (const wake of [...this.#settleWaiters]) wake();
  }

  get fleet(): Fleet {
    return this.deps.fleet;
  }

  /** A journal that could not be replayed stays for the next try (start or lapse). */
  #replayFailed(e: unknown): void {
    this.log.warn("the usage journal of a stopped gateway was not replayed", {
      error: String(e),
    });
  }

  /** Tracks background work so `close()` can wait for it. */
  track(p: Promise<unknown>): void {
    this.#pending.add(p);
    p.finally(() => this.#pending.delete(p)).catch(() => {});
  }

  /**
   * Registers this instance, reclaiming what its previous incarnation held,
   * and starts its heartbeat (nothing without `instanceId`); with a remote
   * KV, watches the auth epoch so other instances' revocations apply at
   * once. Call before serving.
   */
  async start(): Promise<void> {
    const dir = this.#journalDir;
    if (dir) {
      // Journals of this instance's earlier incarnations, and of other
      // instances that have no liveness record (those that do are replayed
      // when their record lapses: see `reclaim`).
      const kv = this.deps.store.kv;
      const self = this.instance?.id ?? null;
      await this.usage.replayJournals(dir, async (i) =>
        i === self ||
        (await kv.get(k.gatewayInstance(i))).value === null).catch((e) =>
          this.#replayFailed(e)
        );
      await this.usage.startJournal(dir, self ?? newId());
    }
    await this.instance?.start();
    if (this.deps.config.kvUrl) this.keys.watch();
    if (this.#sendWebhooks) this.webhooks.start();
    if (this.#sweep) {
      this.#sweeper = startRetentionSweeper(this.deps.store, {
        onError: (err) =>
          this.log.warn("retention sweep failed", { error: String(err) }),
      });
    }
  }

  /**
   * Waits until idle, stops the admitter (and its reclaim timer), then
   * stops the heartbeat and deletes this instance's record.
   */
  async close(): Promise<void> {
    await this.idle();
    await this.usage.close();
    await this.budgets.close();
    this.#unwatchUsage();
    await this.webhooks.close();
    await this.#sweeper?.stop();
    await this.admitter.close();
    this.keys.close();
    await this.instance?.close();
  }

  /**
   * Waits for settlements and usage writes in progress, and closes the
   * idle connections to nodes (opened again when needed).
   */
  async idle(): Promise<void> {
    await this.admitter.flush();
    while (this.#pending.size > 0) await Promise.allSettled([...this.#pending]);
    await this.usage.flush();
    await this.budgets.idle();
    await this.webhooks.idle();
    await this.upstream.idle();
    this.upstream.client.closeIdle();
  }

  /** Authenticates a request's key (401/403; 503 when KV is unreachable). */
  async authenticate(req: Request, scope: Scope | null): Promise<AuthContext> {
    let ctx: AuthContext;
    try {
      ctx = await this.keys.authenticate(presentedKey(req.headers));
    } catch (e) {
      if (e instanceof OpenAIError) throw e;
      throw storeDown(e);
    }
    if (scope) requireScope(ctx, scope);
    return ctx;
  }

  /** Resolves a model name for a key: its id and context length; 404 when unknown or not allowed. */
  resolveModel(
    ctx: AuthContext,
    named: string,
    kind: ModelKind,
  ): ResolvedModel {
    const id = this.fleet.resolveModel(named);
    const served = this.fleet.servedModels().find((m) => m.id === id);
    if (
      !served && modelAllowed(ctx, id, named) && this.fleet.knownModel(named)
    ) {
      // a spanning instance says why: a member drains, is down, or dedication mixes
      const why = this.fleet.instances?.().find((i) =>
        i.model === id && !i.available && i.reason
      )?.reason?.slice(0, 300) ?? "its nodes are draining, unhealthy or down";
      throw new OpenAIError(
        503,
        "model_unavailable",
        `No node can serve the model \`${
          named.slice(0, 256)
        }\` right now (${why}); retry shortly`,
        { type: "server_error", headers: { "retry-after": "5" } },
      );
    }
    if (
      !served || !modelAllowed(ctx, id, named) ||
      (kind === "embedding"
        ? served.kind !== "embedding" && !served.embeddings
        : served.kind === "embedding")
    ) {
      throw new OpenAIError(
        404,
        "model_not_found",
        `The model \`${
          named.slice(0, 256)
        }\` does not exist or you do not have access to it.`,
        { param: "model", type: "invalid_request_error" },
      );
    }
    return {
      id,
      contextLength: served.contextLength ?? null,
      promptOverhead: served.promptOverhead ?? null,
    };
  }
}

/** A model as the gateway routes and bounds it. */
export interface ResolvedModel {
  id: string;
  contextLength: number | null;
  /** What its chat template adds around the messages, when its nodes say. */
  promptOverhead: TemplateOverhead | null;
}

/** 503 for an unreachable store: fail closed. */
export function storeDown(cause: unknown): OpenAIError {
  const e = new OpenAIError(
    503,
    "service_unavailable",
    "The gateway cannot reach its store; retry shortly",
    {
      type: "server_error",
      headers: { "retry-after": "1" },
    },
  );
  e.cause = cause;
  return e;
}

/** One request's lifecycle and meter. */
export class Exchange {
  readonly t0 = performance.now();
  readonly startedAt = Date.now();
  ctx: AuthContext | null = null;
  /** The authenticated key's tenant slug (set before validation, for metrics). */
  tenantSlug: string | null = null;
  model = "";
  nodeId: string | null = null;
  reservation: Reservation | null = null;
  /** The prompt's upper bound; billed prompt tokens never exceed it. */
  promptUpper = 0;
  promptEstimate = 0;
  /** Completion tokens may not be billed past this. */
  completionCap = 0;
  promptTokens = 0;
  completionTokens = 0;
  /** Prompt tokens the node served from its prefix cache, when it says. */
  cachedTokens: number | null = null;
  /** Its prices, when its key's plan has a money budget. */
  price: RequestPrice | null = null;
  /** How usage was made when the engine reported none (null: reported). */
  usageBasis: UsageBasis | null = null;
  ttftMs: number | null = null;
  /** How long it waited for a node slot, ms. */
  queueMs = 0;
  /** Its node's slot count when routed (null: not routed). */
  slots: number | null = null;
  /** The other members of the spanning instance it was routed to (empty: none). */
  members: string[] = [];
  /** Why it was refused for lack of capacity (null: it was not). */
  refused: UsageRecord["refused"] | null = null;
  /** The `x-orchard-*` reports of how hints were taken (see UsageRecord.notes). */
  notes: Record<string, string> = {};
  status = 200;
  outcome: UsageRecord["outcome"] = "ok";
  /** The error the client got (code and type), for the request log. */
  error: { code: string | null; type: string } | null = null;
  headers: Record<string, string> = {};
  #done = false;
  /** The request's span (Deno.serve's, when tracing is on: lib/trace.ts). */
  readonly #span = activeSpan();

  constructor(
    readonly core: GatewayCore,
    readonly requestId: string,
    readonly endpoint: UsageRecord["endpoint"],
  ) {}

  /** Admits the request against every limit (429 or 503 when refused), setting rate-limit headers. */
  admit(
    ctx: AuthContext,
    p: ParsedRequest,
    model: Pick<ResolvedModel, "contextLength" | "promptOverhead"> | null,
  ): Promise<number> {
    return withSpan("orchard.admission", {}, () => this.#admit(ctx, p, model));
  }

  async #admit(
    ctx: AuthContext,
    p: ParsedRequest,
    model: Pick<ResolvedModel, "contextLength" | "promptOverhead"> | null,
  ): Promise<number> {
    this.ctx = ctx;
    this.promptUpper = promptUpper(p.prompt, model?.promptOverhead ?? null);
    this.promptEstimate = p.prompt.estimate;
    const cap = p.endpoint === "embeddings"
      ? 0
      : p.maxTokens ?? model?.contextLength ?? this.core.defaultMaxTokens;
    const worst = this.promptUpper + cap;
    let a: Admission;
    let held = false;
    try {
      if (ctx.priced) {
        // A money budget counts its worst case at the model's prices.
        this.price = {
          prompt: this.promptUpper,
          ...await this.core.prices.of(this.model).catch((e) => {
            throw new QuotaUnavailableError("Cannot read the prices", {
              cause: e,
            });
          }),
        };
      }
      const request = {
        plan: ctx.plan,
        tokens: worst,
        minTokens: p.maxTokens !== null || cap === 0
          ? worst
          : this.promptUpper + 1,
        reclaimTokens: p.prompt.estimate,
        ttlMs: this.core.reservationTtlMs,
        ...(this.price ? { price: this.price } : {}),
      };
      a = await this.core.admitter.admit(request);
      // Refused only for what requests in flight hold: wait briefly for
      // them to settle, admitted as soon as it fits.
      const until = performance.now() + this.core.heldWaitMs;
      while (!a.ok && (held = await this.core.heldOnly(a, ctx.tenant.id))) {
        const left = until - performance.now();
        if (left <= 0) break;
        await this.core.settlement(Math.min(250, left));
        a = await this.core.admitter.admit(request);
      }
    } catch (e) {
      if (e instanceof QuotaUnavailableError) throw storeDown(e);
      throw e;
    }
    this.headers = quotaHeaders(a.view);
    if (!a.ok) {
      // a budget reached (not one only held, nor a request too large for
      // it) alerts as reaching its thresholds
      if (a.rule.budget && a.reason === "quota" && !held) {
        this.core.budgets.refused(ctx.tenant.id, a.rule);
      }
      throw rejectionError(a, this.headers, {
        held,
        model: this.model,
        currency: ctx.priced
          ? await this.core.prices.currency().catch(() => null)
          : null,
      });
    }
    this.reservation = a.reservation;
    const granted = a.reservation?.tokens ?? worst;
    this.completionCap = Math.max(0, granted - this.promptUpper);
    return this.completionCap;
  }

  /**
   * Reports how the request's hints were taken: `x-orchard-*` headers the
   * client gets, kept in its usage record (the request log) too.
   */
  report(headers: Record<string, string>): void {
    for (const [k, v] of Object.entries(headers)) {
      this.headers[k] = v;
      if (k.startsWith("x-orchard-")) {
        this.notes[k.slice("x-orchard-".length)] = v.slice(0, 512);
      }
    }
  }

  /** Notes the node slot the request got, how long it waited for it, and the node headers the client gets (`notes`). */
  routed(slot: SlotGrant, notes: Record<string, string> = {}): void {
    this.report(notes); // node headers passed on to the client
    this.nodeId = slot.node.id;
    this.queueMs = slot.queuedMs;
    const pool = slot.node.pool;
    this.slots = Math.max(1, pool?.slots ?? slot.node.stats?.slots ?? 1);
    this.members = (pool?.members ?? []).filter((id) => id !== slot.node.id);
  }

  /** Notes a refusal for lack of capacity (every slot busy: queue full or timed out). */
  refusedFor(e: CapacityError): void {
    this.refused = e.reason;
    this.queueMs = e.waitedMs;
  }

  /** Records the first token's time (once). */
  firstToken(): void {
    if (this.ttftMs !== null) return;
    this.ttftMs = Math.round(performance.now() - this.t0);
    this.#span?.addEvent("orchard.first_token");
  }

  /** Sets billed usage from the node's report (may be null) and what was counted. */
  bill(
    reported: ReportedUsage | null,
    counted: number,
    countedChunks: number,
  ): void {
    this.cachedTokens = reported?.cached ?? null;
    this.usageBasis = reported ? reported.basis ?? null : "estimated";
    const promptCap = this.promptUpper;
    this.promptTokens = reported
      ? Math.min(reported.prompt, promptCap)
      : Math.min(this.promptEstimate, promptCap);
    const completion = reported
      ? Math.min(reported.completion, counted)
      : countedChunks;
    this.completionTokens = Math.max(
      0,
      Math.min(completion, this.completionCap),
    );
  }

  /**
   * Settles the reservation to the billed usage, off the client's path (the
   * admitter batches settlements; it lands them before refusing anyone).
   */
  #settle(): void {
    const r = this.reservation;
    if (!r) return;
    this.reservation = null;
    const money = this.price
      ? billedCost(this.price, this.promptTokens, this.completionTokens)
      : 0;
    this.core.track(
      this.core.admitter.settle(
        r,
        this.promptTokens + this.completionTokens,
        money,
      )
        .then(() => this.core.wakeSettled())
        .catch((e) =>
          this.core.log.warn(
            "settlement failed; the reservation will be reclaimed",
            { requestId: this.requestId, error: String(e) },
          )
        ),
    );
  }

  /** Authenticates the request's key (see GatewayCore.authenticate), noting its tenant. */
  authenticate(req: Request, scope: Scope | null): Promise<AuthContext> {
    return withSpan("orchard.authenticate", {}, async () => {
      const ctx = await this.core.authenticate(req, scope);
      this.tenantSlug = ctx.tenant.slug;
      this.ctx = ctx; // a refusal from here on is in the tenant's request log
      return ctx;
    });
  }

  /** Ends the exchange: settles, meters and counts. Idempotent. */
  finish(): void {
    if (this.#done) return;
    this.#done = true;
    this.#settle();
    const latencyMs = Math.round(performance.now() - this.t0);
    const ctx = this.ctx;
    this.#span?.setAttributes({
      "orchard.request_id": this.requestId,
      "orchard.endpoint": this.endpoint,
      "orchard.tenant": this.tenantSlug ?? "",
      "orchard.key_id": ctx?.key.id ?? "",
      "orchard.model": this.model,
      "orchard.node": this.nodeId ?? "",
      "orchard.status": this.status,
      "orchard.outcome": this.outcome,
      "orchard.prompt_tokens": this.promptTokens,
      "orchard.completion_tokens": this.completionTokens,
    });
    this.core.metrics.request(
      this.endpoint,
      this.model || "-",
      this.status,
      this.promptTokens,
      this.completionTokens,
      latencyMs,
      this.ttftMs,
      {
        tenant: this.tenantSlug,
        node: this.nodeId,
        outcome: this.outcome,
      },
    );
    // Refused before its model was known: logged (model ""), in no rollup.
    if (!ctx) return;
    if (ctx.budgeted && this.model) this.core.budgets.watch(ctx.tenant.id);
    this.core.usage.add({
      id: newId(),
      at: new Date(this.startedAt).toISOString(),
      requestId: this.requestId,
      tenantId: ctx.tenant.id,
      keyId: ctx.key.id,
      model: this.model,
      nodeId: this.nodeId,
      endpoint: this.endpoint,
      promptTokens: this.promptTokens,
      completionTokens: this.completionTokens,
      latencyMs,
      ttftMs: this.ttftMs,
      status: this.status,
      outcome: this.outcome,
      ...(this.usageBasis ? { usageBasis: this.usageBasis } : {}),
      ...(this.error
        ? { errorCode: this.error.code, errorType: this.error.type }
        : {}),
      ...(this.queueMs > 0 ? { queueMs: this.queueMs } : {}),
      ...(this.slots !== null ? { slots: this.slots } : {}),
      ...(this.members.length > 0 ? { members: this.members } : {}),
      ...(this.refused ? { refused: this.refused } : {}),
      ...(Object.keys(this.notes).length > 0 ? { notes: this.notes } : {}),
    });
  }
}
