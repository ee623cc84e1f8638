/**
 * OpenAPI 3.1 description of the admin API. Paths and answers are listed
 * here (and by the modules that add routes, through documentPaths); every
 * request body is generated from the zod schema its service function
 * parses (requestBody), so the document cannot drift from what is
 * accepted.
 */
import { z } from "zod";
import {
  aliasSchema,
  nodePlacementSchema,
  ruleSchema,
  spanSchema,
} from "../../store/placement.ts";
import { pricingSchema } from "../../store/pricing.ts";
import {
  apiKeyCreateSchema,
  apiKeyPatchSchema,
  inviteSchema,
  joinTokenCreateSchema,
  keyRotateSchema,
  limitsSchema,
  linkTestSchema,
  nodeDedicationSchema,
  tenantCreateSchema,
  tenantPatchSchema,
} from "../../store/schemas.ts";

/** JSON Schema of what `schema` accepts (its input side), for the document. */
export function jsonSchemaOf(
  schema: z.ZodType,
  io: "input" | "output" = "input",
): Record<string, unknown> {
  const { $schema: _, ...out } = z.toJSONSchema(schema, {
    io,
    unrepresentable: "any",
  });
  return out;
}

/** A required JSON request body, generated from the zod schema that parses it. */
export function requestBody(schema: z.ZodType) {
  return {
    required: true,
    content: { "application/json": { schema: jsonSchemaOf(schema) } },
  };
}

const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: unknown) => ({
  content: { "application/json": { schema } },
});
const errors = {
  "400": {
    description: "Invalid input; `error.field` names the field",
    ...json(ref("Error")),
  },
  "401": {
    description: "Missing or invalid admin token",
    ...json(ref("Error")),
  },
  "403": {
    description: "Not allowed for this token's role",
    ...json(ref("Error")),
  },
  "404": {
    description: "Not found (or belongs to another tenant)",
    ...json(ref("Error")),
  },
  "409": {
    description: "Conflict (taken slug, concurrent change)",
    ...json(ref("Error")),
  },
};
const idParam = (name: string, what: string) => ({
  name,
  in: "path",
  required: true,
  schema: { type: "string" },
  description: what,
});
const pageParams = [
  { name: "cursor", in: "query", schema: { type: "string" } },
  {
    name: "limit",
    in: "query",
    schema: { type: "integer", minimum: 1, maximum: 200 },
  },
];
const op = (
  summary: string,
  ok: { status: string; schema: unknown },
  extra: Record<string, unknown> = {},
) => ({
  summary,
  responses: {
    [ok.status]: { description: "OK", ...json(ok.schema) },
    ...errors,
  },
  ...extra,
});
const page = (item: string) => ({
  type: "object",
  properties: {
    items: { type: "array", items: ref(item) },
    cursor: { type: ["string", "null"] },
  },
});

/** The OpenAPI document served at `/api/admin/v1/openapi.json`. */
export function openApiDocument() {
  return {
    openapi: "3.1.0",
    info: {
      title: "Orchard admin API",
      version: "1.0.0",
      description:
        "Tenants, API keys, limits, members, nodes and audit. Authenticate with `Authorization: Bearer <admin token>`.",
    },
    servers: [{ url: "/api/admin/v1" }],
    security: [{ bearer: [] }],
    paths: {
      "/tenants": {
        get: op("List tenants", { status: "200", schema: page("Tenant") }, {
          parameters: [{
            name: "search",
            in: "query",
            schema: { type: "string" },
          }, ...pageParams],
        }),
        post: op("Create a tenant", { status: "201", schema: ref("Tenant") }, {
          requestBody: requestBody(tenantCreateSchema),
        }),
      },
      "/tenants/{id}": {
        parameters: [idParam("id", "Tenant id or slug")],
        get: op("Read a tenant", { status: "200", schema: ref("Tenant") }),
        patch: op("Rename, suspend or resume a tenant", {
          status: "200",
          schema: ref("Tenant"),
        }, {
          requestBody: requestBody(tenantPatchSchema),
        }),
        delete: op(
          "Delete a tenant: suspended at once, its data removed after the grace period (platform admins; routes/api/retention.ts)",
          { status: "202", schema: ref("Tenant") },
        ),
      },
      "/tenants/{id}/limits": {
        parameters: [idParam("id", "Tenant id or slug")],
        get: op("Read a tenant's limits", {
          status: "200",
          schema: ref("Limits"),
        }),
        put: op("Replace a tenant's limits", {
          status: "200",
          schema: ref("Limits"),
        }, { requestBody: requestBody(limitsSchema) }),
      },
      "/tenants/{id}/keys": {
        parameters: [idParam("id", "Tenant id or slug")],
        get: op("List a tenant's API keys", {
          status: "200",
          schema: page("ApiKey"),
        }, { parameters: pageParams }),
        post: op(
          "Create an API key; the response is the only one that carries `key`",
          {
            status: "201",
            schema: {
              allOf: [ref("ApiKey"), {
                type: "object",
                properties: { key: { type: "string" } },
              }],
            },
          },
          {
            requestBody: requestBody(apiKeyCreateSchema),
          },
        ),
      },
      "/tenants/{id}/users": {
        parameters: [idParam("id", "Tenant id or slug")],
        get: op("List a tenant's members", {
          status: "200",
          schema: page("User"),
        }, { parameters: pageParams }),
      },
      "/tenants/{id}/requests": {
        parameters: [idParam("id", "Tenant id or slug")],
        get: op(
          "The request log, newest first (kept for the platform's retention, default 14 days); `partial`: the page stopped after reading its most values, `cursor` searches on",
          {
            status: "200",
            schema: {
              type: "object",
              properties: {
                items: { type: "array", items: ref("RequestLogEntry") },
                cursor: { type: ["string", "null"] },
                partial: { type: "boolean" },
                searchedTo: { type: ["string", "null"] },
              },
            },
          },
          {
            parameters: [
              { name: "key", in: "query", schema: { type: "string" } },
              {
                name: "status",
                in: "query",
                schema: { enum: ["2xx", "4xx", "5xx"] },
              },
              { name: "model", in: "query", schema: { type: "string" } },
              { name: "node", in: "query", schema: { type: "string" } },
              {
                name: "from",
                in: "query",
                schema: { type: "string" },
                description: "ISO 8601, or YYYY-MM-DD[THH:MM] in UTC",
              },
              { name: "to", in: "query", schema: { type: "string" } },
              ...pageParams,
            ],
          },
        ),
      },
      "/keys/{id}/rotate": {
        parameters: [idParam("id", "API key id")],
        post: op(
          "Rotate a key's secret: `key` (the new secret) is in this answer only; the previous secret works for `graceSeconds` more (0: stops at once)",
          {
            status: "200",
            schema: {
              allOf: [ref("ApiKey"), {
                type: "object",
                properties: { key: { type: "string" } },
              }],
            },
          },
          {
            requestBody: requestBody(keyRotateSchema),
          },
        ),
      },
      "/keys/{id}": {
        parameters: [idParam("id", "API key id")],
        get: op("Read an API key", { status: "200", schema: ref("ApiKey") }),
        patch: op(
          "Edit a key's name, scopes, models and own limits (within the tenant's)",
          { status: "200", schema: ref("ApiKey") },
          {
            requestBody: requestBody(apiKeyPatchSchema),
          },
        ),
        delete: op("Revoke an API key (effective within a second)", {
          status: "200",
          schema: ref("ApiKey"),
        }),
      },
      "/invites": {
        get: op(
          "List pending invites (platform: all, or `tenant`; tenant tokens: their tenant's)",
          { status: "200", schema: { type: "object" } },
          {
            parameters: [
              { name: "tenant", in: "query", schema: { type: "string" } },
              ...pageParams,
            ],
          },
        ),
        post: op("Invite a user with a one-time link", {
          status: "201",
          schema: {
            type: "object",
            properties: {
              link: { type: "string" },
              email: { type: "string" },
              role: { type: "string" },
              expiresAt: { type: "string" },
            },
          },
        }, {
          requestBody: requestBody(inviteSchema),
        }),
      },
      "/audit": {
        get: op("Browse the audit log, newest first", {
          status: "200",
          schema: page("AuditEntry"),
        }, {
          parameters: [
            { name: "tenant", in: "query", schema: { type: "string" } },
            { name: "actor", in: "query", schema: { type: "string" } },
            {
              name: "action",
              in: "query",
              schema: { type: "string" },
              description: "An action (key.rotate) or its prefix (key.)",
            },
            { name: "from", in: "query", schema: { type: "string" } },
            { name: "to", in: "query", schema: { type: "string" } },
            ...pageParams,
          ],
        }),
      },
      "/usage": {
        get: op(
          "Usage totals and series from the rollups (tenant tokens: own tenant only)",
          {
            status: "200",
            schema: {
              type: "object",
              properties: {
                query: { type: "object" },
                totals: { type: "object" },
                series: { type: "array", items: { type: "object" } },
                spend: {
                  type: "object",
                  description:
                    "What the range cost at the statement's prices, money as decimal strings in major units of `currency`: total, byModel, byKey (a tenant's), currency, notes",
                },
              },
            },
          },
          {
            parameters: [
              { name: "tenant", in: "query", schema: { type: "string" } },
              { name: "key", in: "query", schema: { type: "string" } },
              { name: "model", in: "query", schema: { type: "string" } },
              {
                name: "granularity",
                in: "query",
                schema: { enum: ["hour", "day"] },
              },
              { name: "from", in: "query", schema: { type: "string" } },
              { name: "to", in: "query", schema: { type: "string" } },
            ],
          },
        ),
      },
      "/statements": {
        get: op(
          "A tenant's monthly statement (token charges, energy and hardware share), JSON (money as decimal strings in major units of `currency`) or CSV",
          { status: "200", schema: { type: "object" } },
          {
            parameters: [
              { name: "tenant", in: "query", schema: { type: "string" } },
              {
                name: "month",
                in: "query",
                required: true,
                schema: { type: "string", pattern: "^\\d{4}-\\d{2}$" },
              },
              {
                name: "format",
                in: "query",
                schema: { enum: ["json", "csv"] },
              },
            ],
          },
        ),
      },
      "/chargeback": {
        get: op(
          "The cluster's month (platform admins): each tenant's statement total and the provider's idle capacity",
          { status: "200", schema: { type: "object" } },
          {
            parameters: [{
              name: "month",
              in: "query",
              required: true,
              schema: { type: "string", pattern: "^\\d{4}-\\d{2}$" },
            }],
          },
        ),
      },
      "/capacity": {
        get: op(
          "The capacity report of the last 4 weeks (platform admins): busy share, wait, refusals and tokens/s per node and for the cluster, by hour; the forecast; cost per 1M tokens per model. JSON, or the hourly series as CSV",
          { status: "200", schema: { type: "object" } },
          {
            parameters: [
              {
                name: "format",
                in: "query",
                schema: { enum: ["json", "csv"] },
              },
            ],
          },
        ),
      },
      "/settings/pricing": {
        get: op(
          "Chargeback prices and cluster cost model (money as decimal strings in major units of `currency`)",
          {
            status: "200",
            schema: jsonSchemaOf(pricingSchema),
          },
        ),
        put: op(
          "Replace the chargeback settings (platform admins; money as decimal strings in major units, never numbers; `updatedAt`/`updatedBy` are read only and ignored)",
          { status: "200", schema: jsonSchemaOf(pricingSchema) },
          { requestBody: requestBody(pricingSchema) },
        ),
      },
      "/join-tokens": {
        get: op("List live join tokens", {
          status: "200",
          schema: { type: "object" },
        }),
        post: op(
          "Create a node join token (`id.secret`, shown once) and the command to run on the Mac",
          {
            status: "201",
            schema: {
              type: "object",
              properties: {
                token: { type: "string" },
                command: { type: "string" },
              },
            },
          },
          {
            requestBody: requestBody(joinTokenCreateSchema),
          },
        ),
      },
      "/nodes": {
        get: op("List nodes with state, load and hardware", {
          status: "200",
          schema: { type: "object" },
        }),
      },
      "/nodes/{id}": {
        parameters: [idParam("id", "Node id")],
        get: op("Read a node", { status: "200", schema: ref("Node") }),
        delete: op("Remove a node and everything about it", {
          status: "200",
          schema: { type: "object" },
        }),
      },
      "/nodes/{id}/drain": {
        parameters: [idParam("id", "Node id")],
        post: op("Drain: no new work; finish in-flight, then report drained", {
          status: "200",
          schema: ref("Node"),
        }),
      },
      "/nodes/{id}/undrain": {
        parameters: [idParam("id", "Node id")],
        post: op("Take new work again", { status: "200", schema: ref("Node") }),
      },
      "/nodes/{id}/dedication": {
        parameters: [idParam("id", "Node id")],
        put: op(
          'Dedicate the node to a tenant ({"tenantId": "…"}: only its requests reach it, and its requests only its dedicated nodes unless the tenant\'s overflowToShared is set) or share it again ({"tenantId": null})',
          { status: "200", schema: ref("Node") },
          { requestBody: requestBody(nodeDedicationSchema) },
        ),
      },
      "/nodes/{id}/placement": {
        parameters: [idParam("id", "Node id")],
        put: op(
          'The models the node should serve ({"models": [{"id": "…", "pinned": true}]}; pinned ones stay loaded; an empty list drops its own entries); it applies them with its next heartbeat',
          { status: "200", schema: { type: "object" } },
          {
            requestBody: requestBody(nodePlacementSchema),
          },
        ),
      },
      "/models": {
        get: op(
          "Where each model runs: replicas and their health, loaded and pinned, placement mismatches, aliases, the placement and each node's desired models",
          { status: "200", schema: { type: "object" } },
        ),
      },
      "/models/{id}/span": {
        parameters: [idParam("id", "Model id (a / in it as %2F)")],
        put: op(
          'Place the model across several nodes ({"nodes": [head, worker, …], "split": [..]?}): the head loads it across its memory and the workers\' through llama.cpp RPC, as the instance rpc:<id>; refused (409) when the members\' free memory cannot hold the weights and KV cache, saying how much is missing',
          { status: "200", schema: { type: "object" } },
          { requestBody: requestBody(spanSchema) },
        ),
        delete: op("End the model's spanning placement", {
          status: "200",
          schema: { type: "object" },
        }),
      },
      "/placement/rules": {
        post: op(
          "Add a placement rule: every node matching minMemoryGb, engine, os and arch serves model (pinned or not)",
          { status: "201", schema: { type: "object" } },
          {
            requestBody: requestBody(ruleSchema),
          },
        ),
      },
      "/placement/rules/{rule}": {
        parameters: [idParam("rule", "Rule id")],
        delete: op("Remove a placement rule", {
          status: "200",
          schema: { type: "object" },
        }),
      },
      "/model-aliases": {
        get: op("The operator's aliases: client-facing name → model id", {
          status: "200",
          schema: { type: "object" },
        }),
      },
      "/model-aliases/{alias}": {
        parameters: [idParam("alias", "The client-facing name")],
        put: op(
          "Set an alias to a model (resolved at the gateway, listed in /v1/models)",
          { status: "200", schema: { type: "object" } },
          {
            requestBody: requestBody(aliasSchema),
          },
        ),
        delete: op("Remove an alias", {
          status: "200",
          schema: { type: "object" },
        }),
      },
      "/instances": {
        get: op(
          "Spanning instances (a model across several machines: an RPC split or an Exo instance): members, who serves, availability and why not",
          { status: "200", schema: { type: "object" } },
        ),
      },
      "/links": {
        get: op("Latest link test per node pair (orchard.linktest/1)", {
          status: "200",
          schema: { type: "object" },
        }),
      },
      "/links/test": {
        post: op("Run a link test between two nodes", {
          status: "200",
          schema: { type: "object" },
        }, {
          requestBody: requestBody(linkTestSchema),
        }),
      },
      "/links/test-all": {
        post: op("Test all pairs, one at a time, in the background", {
          status: "202",
          schema: { type: "object" },
        }),
      },
      "/links/progress": {
        get: op("Progress of the running all-pairs test", {
          status: "200",
          schema: { type: "object" },
        }),
      },
      ...extraPaths,
    },
    components: {
      securitySchemes: { bearer: { type: "http", scheme: "bearer" } },
      schemas: {
        Error: {
          type: "object",
          properties: {
            error: {
              type: "object",
              properties: {
                message: { type: "string" },
                code: { type: "string" },
                field: { type: ["string", "null"] },
              },
            },
          },
        },
        Tenant: {
          type: "object",
          properties: {
            id: { type: "string" },
            name: { type: "string" },
            slug: { type: "string" },
            status: { enum: ["active", "suspended"] },
            createdAt: { type: "string" },
            updatedAt: { type: "string" },
          },
        },
        Limits: {
          ...jsonSchemaOf(limitsSchema, "output"),
          description: "null = unlimited",
        },
        ApiKey: {
          type: "object",
          properties: {
            id: { type: "string" },
            tenantId: { type: "string" },
            name: { type: "string" },
            prefix: { type: "string" },
            last4: { type: "string" },
            scopes: { type: "array", items: { type: "string" } },
            models: { type: ["array", "null"], items: { type: "string" } },
            limits: { oneOf: [ref("Limits"), { type: "null" }] },
            expiresAt: { type: ["string", "null"] },
            revokedAt: { type: ["string", "null"] },
            createdAt: { type: "string" },
            lastUsedAt: { type: ["string", "null"] },
            rotatedAt: { type: ["string", "null"] },
            previousValidUntil: {
              type: ["string", "null"],
              description:
                "After a rotation with a grace period: the previous secret works until then",
            },
          },
        },
        RequestLogEntry: {
          type: "object",
          description:
            "One request (never prompt text or secrets); model is empty for a request refused before its model was known",
          properties: {
            id: { type: "string" },
            at: { type: "string" },
            requestId: { type: "string" },
            keyId: { type: "string" },
            model: { type: "string" },
            nodeId: { type: ["string", "null"] },
            endpoint: { type: "string" },
            status: { type: "integer" },
            outcome: { enum: ["ok", "error", "cancelled"] },
            promptTokens: { type: "integer" },
            completionTokens: { type: "integer" },
            latencyMs: { type: "integer" },
            ttftMs: { type: ["integer", "null"] },
            errorCode: { type: ["string", "null"] },
            errorType: { type: "string" },
            notes: {
              type: "object",
              additionalProperties: { type: "string" },
              description:
                "How the request's hints were taken, as its x-orchard-* response headers said (ignored, tools-omitted, tool-grammar, reasoning-effort)",
            },
          },
        },
        Node: {
          type: "object",
          description:
            "A node: id, name, url, engine, state (healthy, unhealthy, draining, drained), models, stats, probe",
        },
        User: {
          type: "object",
          properties: {
            id: { type: "string" },
            email: { type: "string" },
            role: { type: "string" },
            tenantId: { type: ["string", "null"] },
            disabled: { type: "boolean" },
          },
        },
        AuditEntry: {
          type: "object",
          properties: {
            id: { type: "string" },
            at: { type: "string" },
            actor: { type: "object" },
            action: { type: "string" },
            target: { type: "object" },
            tenantId: { type: ["string", "null"] },
            before: {},
            after: {},
            ip: { type: ["string", "null"] },
          },
        },
      },
    },
  };
}

/** Paths contributed by other parts of the admin API (nodes, usage). */
const extraPaths: Record<string, unknown> = {};

/** Registers more documented paths (called by modules that add admin routes). */
export function documentPaths(paths: Record<string, unknown>): void {
  Object.assign(extraPaths, paths);
}
