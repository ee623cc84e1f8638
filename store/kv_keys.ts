/**
 * The only place KV key tuples are spelled. Every other module builds keys
 * through `k`, so a key layout change is one edit here.
 */
export const k = {
  // configuration and secrets
  secrets: () => ["config", "secrets"] as const,
  setupToken: () => ["config", "setup_token"] as const,
  /** Rewritten by every change that affects key verification (revoke, suspend, limits). */
  authEpoch: () => ["config", "auth_epoch"] as const,
  settings: (name: string) => ["config", "settings", name] as const,

  // tenants
  tenant: (id: string) => ["tenant", id] as const,
  tenantPrefix: () => ["tenant"] as const,
  tenantBySlug: (slug: string) => ["tenant_by_slug", slug] as const,
  tenantByName: (nameLower: string, id: string) =>
    ["tenant_by_name", nameLower, id] as const,
  tenantByNamePrefix: () => ["tenant_by_name"] as const,
  tenantLimits: (tenantId: string) => ["tenant_limits", tenantId] as const,
  /** A tenant's retention choices per kind (store/retention.ts). */
  tenantRetention: (tenantId: string) =>
    ["tenant_retention", tenantId] as const,

  // users, invites, sessions, login throttling
  user: (id: string) => ["user", id] as const,
  userPrefix: () => ["user"] as const,
  userByEmail: (email: string) => ["user_by_email", email] as const,
  tenantUser: (tenantId: string, userId: string) =>
    ["tenant_user", tenantId, userId] as const,
  tenantUserPrefix: (tenantId: string) => ["tenant_user", tenantId] as const,
  invite: (id: string) => ["invite", id] as const,
  invitePrefix: () => ["invite"] as const,
  session: (sid: string) => ["session", sid] as const,
  userSession: (userId: string, sid: string) =>
    ["user_session", userId, sid] as const,
  userSessionPrefix: (userId: string) => ["user_session", userId] as const,
  /** When the user last signed in (written with the session). */
  userLastSignIn: (userId: string) => ["user_last_sign_in", userId] as const,
  /** A one-time password reset link (store/password_resets.ts). */
  passwordReset: (id: string) => ["password_reset", id] as const,
  /** The user's live password reset, if any (a new one replaces it). */
  userPasswordReset: (userId: string) =>
    ["user_password_reset", userId] as const,
  loginFailures: (scope: "ip" | "account", subject: string, window: string) =>
    ["login_fail", scope, subject, window] as const,
  /** A portal form's one-time token, claimed by its first post (store/form_once.ts). */
  formOnce: (scope: string, token: string) =>
    ["form_once", scope, token] as const,
  /** A tenant's pending invite (index; the invite is `invite`). */
  tenantInvite: (tenantId: string, inviteId: string) =>
    ["tenant_invite", tenantId, inviteId] as const,
  tenantInvitePrefix: (tenantId: string) =>
    ["tenant_invite", tenantId] as const,
  /** The pending invite for an email (a new invite replaces it). */
  inviteByEmail: (email: string) => ["invite_by_email", email] as const,

  // single sign-on (store/sso_providers.ts, store/sso_sign_in.ts,
  // store/sign_in_policy.ts)
  /** An OIDC provider's configuration (its client secret sealed). */
  ssoProvider: (id: string) => ["sso_provider", id] as const,
  ssoProviderPrefix: () => ["sso_provider"] as const,
  /** The user an identity provider's subject (`sub`) signs in as. */
  userBySso: (providerId: string, subject: string) =>
    ["user_by_sso", providerId, subject] as const,
  userBySsoPrefix: (providerId: string) => ["user_by_sso", providerId] as const,
  /** Marks a sign-in attempt (by its state's hash) as used: each works once. */
  ssoAttemptUsed: (stateHash: string) =>
    ["sso_attempt_used", stateHash] as const,
  /** Present when a tenant's users may not sign in with a password. */
  tenantPasswordOff: (tenantId: string) =>
    ["tenant_password_off", tenantId] as const,
  tenantPasswordOffPrefix: () => ["tenant_password_off"] as const,

  // client API keys and admin API tokens
  apiKey: (id: string) => ["api_key", id] as const,
  apiKeyLastUsed: (id: string) => ["api_key_last_used", id] as const,
  tenantApiKey: (tenantId: string, keyId: string) =>
    ["tenant_api_key", tenantId, keyId] as const,
  tenantApiKeyPrefix: (tenantId: string) =>
    ["tenant_api_key", tenantId] as const,
  adminToken: (id: string) => ["admin_token", id] as const,
  adminTokenPrefix: () => ["admin_token"] as const,
  adminTokenLastUsed: (id: string) => ["admin_token_last_used", id] as const,
  tenantAdminToken: (tenantId: string, tokenId: string) =>
    ["tenant_admin_token", tenantId, tokenId] as const,
  tenantAdminTokenPrefix: (tenantId: string) =>
    ["tenant_admin_token", tenantId] as const,

  // nodes and enrollment
  joinToken: (id: string) => ["join_token", id] as const,
  joinTokenPrefix: () => ["join_token"] as const,
  node: (id: string) => ["node", id] as const,
  nodePrefix: () => ["node"] as const,
  nodeByKey: (publicKeyThumbprint: string) =>
    ["node_by_key", publicKeyThumbprint] as const,
  nodeStatus: (id: string) => ["node_status", id] as const,
  nodeStatusPrefix: () => ["node_status"] as const,
  nodeProbe: (id: string) => ["node_probe", id] as const,
  nodeProbePrefix: () => ["node_probe"] as const,
  /** The gateway's last check of the node's advertised URL (fleet/reachability.ts). */
  nodeReach: (id: string) => ["node_reach", id] as const,
  linkTest: (a: string, b: string) => ["link_test", a, b] as const,
  /** The operator's model placement: per-node entries and rules (store/placement.ts). */
  placement: () => ["config", "placement"] as const,
  /** Operator-defined model aliases, client-facing name → model id (store/placement.ts). */
  modelAliases: () => ["config", "model_aliases"] as const,
  linkTestPrefix: () => ["link_test"] as const,

  // audit log (append-only; ids are time-ordered)
  audit: (id: string) => ["audit", id] as const,
  auditPrefix: () => ["audit"] as const,
  auditByTenant: (tenantId: string, id: string) =>
    ["audit_by_tenant", tenantId, id] as const,
  auditByTenantPrefix: (tenantId: string) =>
    ["audit_by_tenant", tenantId] as const,
  auditByActor: (actorId: string, id: string) =>
    ["audit_by_actor", actorId, id] as const,
  auditByActorPrefix: (actorId: string) => ["audit_by_actor", actorId] as const,

  // quota windows: counters and reservations (gateway admission)
  quotaCounter: (subject: string, window: string) =>
    ["quota", subject, window] as const,
  reservation: (id: string) => ["reservation", id] as const,
  reservationPrefix: () => ["reservation"] as const,
  /** What a lease (a reservation) has used so far, billed if it is reclaimed. */
  reservationUse: (id: string) => ["reservation_use", id] as const,

  // gateway instances: liveness records (store/instances.ts)
  gatewayInstance: (id: string) => ["gateway_instance", id] as const,
  gatewayInstancePrefix: () => ["gateway_instance"] as const,

  // usage metering
  /** A tenant's records written together (an array), under the first one's id. */
  usageRecord: (tenantId: string, id: string) =>
    ["usage", tenantId, id] as const,
  usageRecordPrefix: (tenantId: string) => ["usage", tenantId] as const,
  /**
   * The request log's index (store/request_log.ts): which records of the
   * usage value `valueId` (their positions in it) have this key, model,
   * node or status class; written with the value, expiring with it.
   */
  requestLogIndex: (
    tenantId: string,
    dim: RequestLogDimension,
    value: string,
    valueId: string,
  ) => ["request_log_idx", tenantId, dim, value, valueId] as const,
  /** Every request-log index entry of a tenant. */
  requestLogTenantPrefix: (tenantId: string) =>
    ["request_log_idx", tenantId] as const,
  requestLogIndexPrefix: (
    tenantId: string,
    dim: RequestLogDimension,
    value: string,
  ) => ["request_log_idx", tenantId, dim, value] as const,
  /** Up to which of a writer's records (sequence number) the tenant's are in KV (store/usage_rollups.ts). */
  usageMark: (tenantId: string, writer: string) =>
    ["usage_mark", tenantId, writer] as const,
  /** A rollup group's totals written by one writer (`shard`; store/usage.ts). */
  usageRollup: (
    granularity: "hour" | "day",
    dimension: UsageDimension,
    subject: string,
    bucket: string,
    shard: string,
  ) =>
    ["usage_rollup", granularity, dimension, subject, bucket, shard] as const,
  usageRollupPrefix: (
    granularity: "hour" | "day",
    dimension: UsageDimension,
    subject: string,
  ) => ["usage_rollup", granularity, dimension, subject] as const,
  /**
   * Month rollups read across subjects (month first): tenant totals for top
   * tenants, tenant × model tokens and node × tenant busy time for statements;
   * one value per group and writer (`shard`), like `usageRollup`.
   */
  usageMonth: (
    month: string,
    dimension: UsageMonthDimension,
    subject: string,
    shard: string,
  ) => ["usage_month", month, dimension, subject, shard] as const,
  usageMonthPrefix: (month: string, dimension: UsageMonthDimension) =>
    ["usage_month", month, dimension] as const,

  /**
   * Capacity rollups of one UTC day (store/capacity_rollup.ts): per node
   * and hour, per model, and the cluster's queue and refusals per hour;
   * the day first, so four weeks of every node, model and the cluster are
   * one range read. One value per group and writer (`shard`), like
   * `usageRollup`.
   */
  usageCapacity: (
    day: string,
    kind: CapacityKind,
    subject: string,
    shard: string,
  ) => ["usage_capacity", day, kind, subject, shard] as const,
  usageCapacityPrefix: () => ["usage_capacity"] as const,

  // stored Responses (`/v1/responses`; store/responses.ts)
  /** A stored response's head: its parts' count and expiry. */
  response: (tenantId: string, id: string) =>
    ["response", tenantId, id] as const,
  responsePrefix: (tenantId: string) => ["response", tenantId] as const,
  /** One part (≤ 60,000 bytes) of a stored response's JSON. */
  responsePart: (tenantId: string, id: string, part: number) =>
    ["response_part", tenantId, id, part] as const,
  responsePartPrefix: (tenantId: string) =>
    ["response_part", tenantId] as const,
  /**
   * A tenant's hour or day totals per key and model (store/spend.ts prices
   * them), bucket before key so a range of a tenant's is one read; one
   * value per group and writer (`shard`), like `usageRollup`.
   */
  usageKeyModel: (
    granularity: "hour" | "day",
    tenantId: string,
    bucket: string,
    keyId: string,
    model: string,
    shard: string,
  ) =>
    [
      "usage_key_model",
      granularity,
      tenantId,
      bucket,
      keyId,
      model,
      shard,
    ] as const,
  usageKeyModelPrefix: (granularity: "hour" | "day", tenantId: string) =>
    ["usage_key_model", granularity, tenantId] as const,

  // budgets, their alerts, and webhooks (store/budgets.ts,
  // store/budget_alerts.ts, store/webhooks.ts)
  /** A tenant's budget (`keyId` "") or a key's, in one unit. */
  budget: (tenantId: string, keyId: string, unit: string) =>
    ["budget", tenantId, keyId, unit] as const,
  budgetPrefix: (tenantId: string) => ["budget", tenantId] as const,
  budgetAlert: (tenantId: string, id: string) =>
    ["budget_alert", tenantId, id] as const,
  budgetAlertPrefix: (tenantId: string) => ["budget_alert", tenantId] as const,
  /** Every tenant's alerts, for the provider (the whole alert, like audit indexes). */
  budgetAlertAll: (id: string) => ["budget_alert_all", id] as const,
  budgetAlertAllPrefix: () => ["budget_alert_all"] as const,
  /** Marks a threshold of a budget as alerted in a period: once each. */
  budgetAlertOnce: (
    tenantId: string,
    keyId: string,
    unit: string,
    period: string,
    threshold: number,
  ) => ["budget_alert_once", tenantId, keyId, unit, period, threshold] as const,
  /** Alerts created and acknowledged (`scope`: a tenant id, or "provider" for all). */
  budgetAlertCount: (scope: string, what: "created" | "acked") =>
    ["budget_alert_count", scope, what] as const,
  webhook: (id: string) => ["webhook", id] as const,
  /** `owner`: a tenant id, or "provider" for the platform's own endpoints. */
  webhookByOwner: (owner: string, id: string) =>
    ["webhook_by_owner", owner, id] as const,
  webhookByOwnerPrefix: (owner: string) => ["webhook_by_owner", owner] as const,
  webhookDelivery: (id: string) => ["webhook_delivery", id] as const,
  webhookDeliveryByOwner: (owner: string, id: string) =>
    ["webhook_delivery_by_owner", owner, id] as const,
  webhookDeliveryByOwnerPrefix: (owner: string) =>
    ["webhook_delivery_by_owner", owner] as const,
  /** Deliveries due at `at` (epoch ms): the dispatcher's queue. */
  webhookDue: (at: number, id: string) => ["webhook_due", at, id] as const,
  webhookDuePrefix: () => ["webhook_due"] as const,
};

/** What the request log is indexed by: API key, model, node, status class. */
export type RequestLogDimension = "key" | "model" | "node" | "status";

/**
 * Month rollup dimensions: subject is the tenant id, `tenantId/model`,
 * the node id, or `nodeId/tenantId`.
 */
export type UsageMonthDimension =
  | "tenant"
  | "tenant_model"
  | "node"
  | "node_tenant";

/** Capacity rollup subjects: a node (its id), a model, or the cluster ("*"). */
export type CapacityKind = "node" | "model" | "cluster";

/**
 * Usage rollup dimensions: subject is the tenant id, `tenantId/keyId`,
 * `tenantId/model`, the model (across tenants), or "*" for everything.
 */
export type UsageDimension =
  | "tenant"
  | "key"
  | "tenant_model"
  | "model"
  | "all";

/** A KV key tuple as built by `k`. */
export type Key = readonly Deno.KvKeyPart[];
