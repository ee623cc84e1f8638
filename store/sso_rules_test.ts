import assert from "node:assert/strict";
import { ValidationError } from "./errors.ts";
import {
  type ClaimRule,
  firstMatch,
  formatRules,
  parseRules,
  ruleMatches,
} from "./sso_rules.ts";

Deno.test("parseRules() reads the text form, comments and blank lines skipped", () => {
  const rules = parseRules([
    "# admins first",
    'groups contains "acme-admins" -> tenant acme, role tenant_admin',
    "",
    'email ends_with "@acme.com" → tenant acme role tenant_viewer',
    'roles contains "ops" -> platform_admin',
    'realm_access.roles contains "say \\"hi\\"" -> role tenant_viewer',
    "* -> tenant acme, role tenant_viewer",
  ].join("\n"));
  assert.deepEqual(rules, [
    {
      claim: "groups",
      op: "contains",
      value: "acme-admins",
      tenant: "acme",
      role: "tenant_admin",
    },
    {
      claim: "email",
      op: "ends_with",
      value: "@acme.com",
      tenant: "acme",
      role: "tenant_viewer",
    },
    {
      claim: "roles",
      op: "contains",
      value: "ops",
      tenant: null,
      role: "platform_admin",
    },
    {
      claim: "realm_access.roles",
      op: "contains",
      value: 'say "hi"',
      tenant: null,
      role: "tenant_viewer",
    },
    { claim: "*", op: "any", value: "", tenant: "acme", role: "tenant_viewer" },
  ]);
});

Deno.test("parseRules() names the line at fault", () => {
  assert.throws(
    () =>
      parseRules(
        'groups contains "a" -> tenant acme, role tenant_admin\ngroups has x -> acme',
      ),
    (e: unknown) => e instanceof ValidationError && /line 2/.test(e.message),
  );
  assert.throws(
    () => parseRules('groups contains "a" -> tenant acme, boss tenant_admin'),
    (e: unknown) =>
      e instanceof ValidationError &&
      /line 1: unexpected "boss"/.test(e.message),
  );
  assert.throws(
    () => parseRules('groups contains "a" -> tenant acme, role owner'),
    /line 1: the role must be/,
  );
});

Deno.test("formatRules() writes what parseRules() reads", () => {
  const stored: ClaimRule[] = [
    {
      claim: "groups",
      op: "contains",
      value: 'x "y"',
      tenantId: "t1",
      role: "tenant_admin",
    },
    {
      claim: "*",
      op: "any",
      value: "",
      tenantId: null,
      role: "platform_admin",
    },
  ];
  const text = formatRules(stored, (id) => id === "t1" ? "acme" : id);
  assert.equal(
    text,
    'groups contains "x \\"y\\"" -> tenant acme, role tenant_admin\n* -> role platform_admin',
  );
  const back = parseRules(text);
  assert.equal(back[0]!.value, 'x "y"');
  assert.equal(back[0]!.tenant, "acme");
  assert.equal(back[1]!.op, "any");
});

Deno.test("ruleMatches() compares lists by element, scalars whole, domains case-insensitively", () => {
  const rule = (
    op: ClaimRule["op"],
    claim: string,
    value: string,
  ): ClaimRule => ({ claim, op, value, tenantId: "t", role: "tenant_viewer" });
  const claims = {
    groups: ["staff", "acme-admins"],
    email: "Ann@ACME.com",
    hd: "acme.com",
    email_verified: true,
    realm_access: { roles: ["orchard"] },
    "https://example.com/roles": ["x"],
  };
  assert.ok(ruleMatches(rule("contains", "groups", "acme-admins"), claims));
  assert.ok(!ruleMatches(rule("contains", "groups", "acme"), claims));
  assert.ok(!ruleMatches(rule("equals", "groups", "staff"), claims));
  assert.ok(ruleMatches(rule("equals", "hd", "acme.com"), claims));
  assert.ok(ruleMatches(rule("equals", "email_verified", "true"), claims));
  assert.ok(ruleMatches(rule("ends_with", "email", "@acme.com"), claims));
  assert.ok(!ruleMatches(rule("ends_with", "email", "@globex.com"), claims));
  assert.ok(
    ruleMatches(rule("contains", "realm_access.roles", "orchard"), claims),
  );
  assert.ok(
    ruleMatches(rule("contains", "https://example.com/roles", "x"), claims),
  );
  assert.ok(!ruleMatches(rule("contains", "missing", "x"), claims));
  assert.ok(!ruleMatches(rule("contains", "__proto__", "x"), claims));
});

Deno.test("firstMatch() takes the first rule that matches, or none", () => {
  const rules: ClaimRule[] = [
    {
      claim: "groups",
      op: "contains",
      value: "admins",
      tenantId: "a",
      role: "tenant_admin",
    },
    {
      claim: "groups",
      op: "contains",
      value: "staff",
      tenantId: "a",
      role: "tenant_viewer",
    },
  ];
  assert.equal(firstMatch(rules, { groups: ["staff", "admins"] })?.n, 1);
  assert.equal(
    firstMatch(rules, { groups: ["staff"] })?.rule.role,
    "tenant_viewer",
  );
  assert.equal(firstMatch(rules, { groups: ["guests"] }), null);
  assert.equal(firstMatch(rules, {}), null);
});
