/**
 * Input schemas (zod) for every service-layer write, shared by the portal's
 * forms, the admin API and the CLI. Lengths are bounded so nothing
 * user-supplied can exceed KV key (2 KiB) or value (64 KiB) limits.
 */
import { z } from "zod";
import { ValidationError } from "./errors.ts";
import { MONEY_NOT_A_NUMBER, parseMoney } from "./money.ts";

/** Parses `input` with `schema`, throwing a ValidationError naming the field. */
export function parse<T extends z.ZodType>(
  schema: T,
  input: unknown,
): z.infer<T> {
  const r = schema.safeParse(input);
  if (r.success) return r.data;
  const issues = r.error.issues.map((i) => ({
    field: i.path.join(".") || "body",
    message: i.message,
  }));
  const first = issues[0]!;
  throw new ValidationError(
    `${first.field}: ${first.message}`,
    first.field,
    issues,
  );
}

const trimmed = (min: number, max: number, what: string) =>
  z.string({ error: `${what} must be a string` }).trim()
    .min(min, `${what} is required`)
    .max(max, `${what} must be at most ${max} characters`);

export const tenantName = trimmed(1, 100, "Name");
export const slug = z.string({ error: "Slug must be a string" }).trim()
  .toLowerCase()
  .regex(
    /^[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?$/,
    "Slug must be 1–48 lowercase letters, digits or dashes, not starting or ending with a dash",
  );
export const email = z.string({ error: "Email must be a string" }).trim()
  .toLowerCase().max(254, "Email must be at most 254 characters")
  .pipe(z.email("Email is not a valid address"));
export const password = z.string({ error: "Password must be a string" })
  .min(12, "Password must be at least 12 characters")
  .max(256, "Password must be at most 256 characters");

/**
 * Money in major units as a decimal string ("0.40"), parsed to integer
 * micro-units (store/money.ts) at most `maxMicro`, above 0 when
 * `positive`. A JSON number is refused with why (MONEY_NOT_A_NUMBER).
 */
export function moneySchema(
  opts: { positive?: boolean; maxMicro?: number; what?: string } = {},
) {
  const bounds = opts.what ??
    "must be a non-negative amount with at most 6 decimals, like 12.50";
  return z.string({
    error: (iss) =>
      typeof iss.input === "number"
        ? MONEY_NOT_A_NUMBER
        : 'must be a decimal string in major units like "0.40"',
  }).transform((v, ctx) => {
    try {
      const micro = parseMoney(v);
      const low = opts.positive ? micro > 0 : micro >= 0;
      if (low && micro <= (opts.maxMicro ?? Infinity)) return micro;
    } catch { /* below */ }
    ctx.addIssue({ code: "custom", message: bounds });
    return z.NEVER;
  }).meta({
    description:
      "money in major units of the currency, as a decimal string with at most 6 decimals",
    pattern: "^\\d{1,13}(\\.\\d{1,6})?$",
    examples: ["0.40", "400.00"],
  });
}

// the maximum is checked before wholeness: 1e30 is "too large", not "not whole"
const limitValue = z.number({ error: "must be a number or null" })
  .min(0, "must be 0 or more")
  .max(1e12, "is too large: the maximum is 1,000,000,000,000 (10^12)")
  .int("must be a whole number").nullable();

/** Limits: null (or absent) means unlimited. */
export const limitsSchema = z.object({
  rpm: limitValue.optional().default(null),
  tpm: limitValue.optional().default(null),
  concurrency: limitValue.optional().default(null),
  tokensPerDay: limitValue.optional().default(null),
  tokensPerMonth: limitValue.optional().default(null),
}).strict();

export const SCOPES = ["chat", "embeddings", "models"] as const;
export type Scope = typeof SCOPES[number];

export const modelName = z.string().trim().min(1).max(
  200,
  "model names must be at most 200 characters",
);

/** What a key's edit may change (every field optional; absent: unchanged). */
export const apiKeyPatchSchema = z.object({
  name: trimmed(1, 100, "Name").optional(),
  scopes: z.array(
    z.enum(SCOPES, { error: "scope must be chat, embeddings or models" }),
  ).min(1, "at least one scope is required").max(3).optional(),
  models: z.array(modelName).max(100, "at most 100 models").nullable()
    .optional(),
  limits: limitsSchema.nullable().optional(),
}).strict();

export const apiKeyCreateSchema = z.object({
  name: trimmed(1, 100, "Name"),
  scopes: z.array(
    z.enum(SCOPES, { error: "scope must be chat, embeddings or models" }),
  )
    .min(1, "at least one scope is required").max(3).optional()
    .default([...SCOPES]),
  models: z.array(modelName).max(100, "at most 100 models").nullable()
    .optional().default(null),
  limits: limitsSchema.nullable().optional().default(null),
  expiresAt: z.iso.datetime({
    offset: true,
    error: "must be an ISO 8601 date-time",
  })
    .nullable().optional().default(null)
    .refine(
      (v) => v === null || Date.parse(v) > Date.now(),
      "must be in the future",
    ),
}).strict();

export const tenantCreateSchema = z.object({
  name: tenantName,
  slug: slug.optional(),
}).strict();

export const tenantPatchSchema = z.object({
  name: tenantName.optional(),
  status: z.enum(["active", "suspended"], {
    error: "status must be active or suspended",
  }).optional(),
  overflowToShared: z.boolean({ error: "overflowToShared must be a boolean" })
    .optional(),
}).strict();

export const ROLES = [
  "platform_admin",
  "tenant_admin",
  "tenant_viewer",
] as const;

export const inviteSchema = z.object({
  email,
  role: z.enum(ROLES, {
    error: "role must be platform_admin, tenant_admin or tenant_viewer",
  }),
  tenantId: z.string().max(64).nullable().optional().default(null),
}).strict();

export const adminTokenCreateSchema = z.object({
  name: trimmed(1, 100, "Name"),
  role: z.enum(ROLES, {
    error: "role must be platform_admin, tenant_admin or tenant_viewer",
  }),
  tenantId: z.string().max(64).nullable().optional().default(null),
  expiresAt: z.iso.datetime({
    offset: true,
    error: "must be an ISO 8601 date-time",
  })
    .nullable().optional().default(null)
    .refine(
      (v) => v === null || Date.parse(v) > Date.now(),
      "must be in the future",
    ),
}).strict();

/** The body of a key's rotation: how long the previous secret keeps working. */
export const keyRotateSchema = z.object({
  graceSeconds: z.number({ error: "must be a whole number of seconds" })
    .int("must be a whole number of seconds")
    .min(0, "must be 0 or more")
    .max(2_592_000, "must be at most 2592000 (30 days)")
    .optional().default(0),
}).strict();

/** The body of a node's dedication: a tenant id, or null to share it. */
export const nodeDedicationSchema = z.object({
  tenantId: z.string({
    error: "is required (a tenant id, or null to share)",
  }).max(64, "must be at most 64 characters").nullable(),
}).strict();

/** The body of a link test between two nodes. */
export const linkTestSchema = z.object({
  a: z.string({ error: "Give two different node ids: a and b" }).max(64),
  b: z.string({ error: "Give two different node ids: a and b" }).max(64),
}).strict().refine((v) => v.a !== v.b, {
  message: "Give two different node ids: a and b",
  path: ["b"],
});

export const joinTokenCreateSchema = z.object({
  uses: z.number().int().min(1).max(1000).optional().default(1),
  ttlSeconds: z.number().int().min(60).max(
    86_400,
    "must be at most 86400 (24 h)",
  )
    .optional().default(3600),
}).strict();
