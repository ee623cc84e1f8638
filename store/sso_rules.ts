/**
 * Sign-in rules of an SSO provider: an ordered list that maps the claims an
 * identity provider asserts (groups, roles, email…) to a role and a tenant.
 * The first rule that matches decides; no match means no access. Pure
 * functions: parsing the text form the portal edits, formatting it back,
 * and matching claims.
 *
 * Text form, one rule per line (`#` starts a comment):
 *
 *     groups contains "acme-admins" -> tenant acme, role tenant_admin
 *     email ends_with "@globex.com" -> tenant globex, role tenant_viewer
 *     roles contains "orchard-ops" -> role platform_admin
 *     * -> tenant acme, role tenant_viewer
 */
import { ValidationError } from "./errors.ts";
import type { Role } from "./principal.ts";

/** How a rule compares a claim with its value. */
export type RuleOp = "equals" | "contains" | "ends_with" | "any";

/** One rule as stored: `tenantId` null only for platform admins. */
export interface ClaimRule {
  /** Claim name; a dotted path reaches nested claims (`realm_access.roles`). */
  claim: string;
  op: RuleOp;
  value: string;
  tenantId: string | null;
  role: Role;
}

/** A rule as written, naming its tenant by slug (or id) rather than id. */
export interface RuleInput {
  claim: string;
  op: RuleOp;
  value: string;
  tenant: string | null;
  role: Role;
}

/** Most rules a provider may have. */
export const MAX_RULES = 50;
const OPS: readonly RuleOp[] = ["equals", "contains", "ends_with"];
const ROLES: readonly Role[] = [
  "platform_admin",
  "tenant_admin",
  "tenant_viewer",
];
const CLAIM_RE = /^[A-Za-z0-9_:\-/.]{1,100}$/;
const LINE_RE =
  /^(?:(\*)|([^\s]+)\s+(equals|contains|ends_with)\s+"((?:[^"\\]|\\.)*)")\s*(?:->|→)\s*(.+)$/;

/** Parses the text form into rules (tenants still by slug); errors name the line. */
export function parseRules(text: string): RuleInput[] {
  const out: RuleInput[] = [];
  const lines = text.split(/\r?\n/);
  for (const [i, raw] of lines.entries()) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const where = `Rule line ${i + 1}`;
    const m = LINE_RE.exec(line);
    if (!m) {
      throw new ValidationError(
        `${where}: write it as: claim contains "value" -> tenant slug, role tenant_admin`,
        "rules",
      );
    }
    const [, star, claim, op, value, target] = m;
    const { tenant, role } = parseTarget(target!, where);
    out.push(
      star ? { claim: "*", op: "any", value: "", tenant, role } : {
        claim: claim!,
        op: op as RuleOp,
        value: value!.replace(/\\(.)/g, "$1"),
        tenant,
        role,
      },
    );
    if (out.length > MAX_RULES) {
      throw new ValidationError(
        `At most ${MAX_RULES} rules per provider`,
        "rules",
      );
    }
  }
  return out;
}

function parseTarget(
  target: string,
  where: string,
): { tenant: string | null; role: Role } {
  let tenant: string | null = null;
  let role: string | null = null;
  const words = target.replace(/,/g, " ").split(/\s+/).filter(Boolean);
  for (let i = 0; i < words.length; i++) {
    const w = words[i]!;
    if (w === "tenant" && words[i + 1]) tenant = words[++i]!;
    else if (w === "role" && words[i + 1]) role = words[++i]!;
    else if (ROLES.includes(w as Role) && role === null) role = w;
    else {
      throw new ValidationError(
        `${where}: unexpected "${
          w.slice(0, 40)
        }" after the arrow (write: tenant slug, role tenant_admin)`,
        "rules",
      );
    }
  }
  if (!role || !ROLES.includes(role as Role)) {
    throw new ValidationError(
      `${where}: the role must be platform_admin, tenant_admin or tenant_viewer`,
      "rules",
    );
  }
  return { tenant, role: role as Role };
}

/** Checks one rule's shape (for rules given as JSON); returns it trimmed. */
export function checkRule(r: RuleInput, n: number): RuleInput {
  const where = `Rule ${n}`;
  if (r.op === "any") {
    return { claim: "*", op: "any", value: "", tenant: r.tenant, role: r.role };
  }
  if (typeof r.claim !== "string" || !CLAIM_RE.test(r.claim)) {
    throw new ValidationError(
      `${where}: the claim must be a claim name (letters, digits, _ : - / .)`,
      "rules",
    );
  }
  if (!OPS.includes(r.op)) {
    throw new ValidationError(
      `${where}: the comparison must be equals, contains or ends_with`,
      "rules",
    );
  }
  if (typeof r.value !== "string" || !r.value || r.value.length > 200) {
    throw new ValidationError(
      `${where}: the value must be 1–200 characters`,
      "rules",
    );
  }
  if (!ROLES.includes(r.role)) {
    throw new ValidationError(
      `${where}: the role must be platform_admin, tenant_admin or tenant_viewer`,
      "rules",
    );
  }
  return r;
}

/** Writes rules back in the text form (`slugOf` names each tenant). */
export function formatRules(
  rules: ClaimRule[],
  slugOf: (tenantId: string) => string,
): string {
  return rules.map((r) => {
    const target = r.tenantId
      ? `tenant ${slugOf(r.tenantId)}, role ${r.role}`
      : `role ${r.role}`;
    if (r.op === "any") return `* -> ${target}`;
    const value = r.value.replace(/["\\]/g, "\\$&");
    return `${r.claim} ${r.op} "${value}" -> ${target}`;
  }).join("\n");
}

/** Reads a claim by name, following dots into nested objects when no claim has the whole name. */
export function claimValue(
  claims: Record<string, unknown>,
  name: string,
): unknown {
  if (Object.hasOwn(claims, name)) return claims[name];
  let v: unknown = claims;
  for (const part of name.split(".")) {
    if (!v || typeof v !== "object" || !Object.hasOwn(v, part)) {
      return undefined;
    }
    v = (v as Record<string, unknown>)[part];
  }
  return v;
}

function scalar(v: unknown): string | null {
  return typeof v === "string" || typeof v === "number" ||
      typeof v === "boolean"
    ? String(v)
    : null;
}

/** Whether a rule matches the claims. */
export function ruleMatches(
  rule: ClaimRule,
  claims: Record<string, unknown>,
): boolean {
  if (rule.op === "any") return true;
  const v = claimValue(claims, rule.claim);
  // a list claim (groups, roles) matches through any of its elements
  const items = Array.isArray(v) ? v.map(scalar) : [scalar(v)];
  const want = rule.value;
  switch (rule.op) {
    case "equals":
      return !Array.isArray(v) && items[0] === want;
    case "contains":
      return items.some((s) => s === want);
    case "ends_with":
      return items.some((s) =>
        s !== null && s.toLowerCase().endsWith(want.toLowerCase())
      );
  }
}

/** The first rule that matches the claims (with its 1-based position), or null. */
export function firstMatch(
  rules: ClaimRule[],
  claims: Record<string, unknown>,
): { rule: ClaimRule; n: number } | null {
  for (const [i, rule] of rules.entries()) {
    if (ruleMatches(rule, claims)) return { rule, n: i + 1 };
  }
  return null;
}
