/**
 * Signing in with an identity provider once its answer has been validated
 * (lib/oidc.ts): the provider's rules decide the tenant and role; the user
 * linked to the provider's subject signs in (its role follows the rules),
 * an existing account with the same email is linked when the provider
 * vouches for the address, and anyone else is provisioned on first
 * sign-in. Claims that match no rule get a refusal and no account.
 * Sign-ins, links, provisioning, role changes and refusals are audited.
 */
import { addAudit } from "./audit.ts";
import { ConflictError, ForbiddenError } from "./errors.ts";
import { newId } from "./ids.ts";
import { k } from "./kv_keys.ts";
import type { Principal, Role } from "./principal.ts";
import { email as emailSchema } from "./schemas.ts";
import { type Session, startSession } from "./sessions.ts";
import type { SsoProvider } from "./sso_providers.ts";
import { firstMatch } from "./sso_rules.ts";
import type { Store } from "./store.ts";
import { getTenantRaw } from "./tenants.ts";
import { getUserByEmail, getUserRaw, type User, userView } from "./users.ts";

/** Why an SSO sign-in was refused. */
export type SsoRefusal =
  | "no_rule"
  | "no_email"
  | "email_taken"
  | "disabled"
  | "other_tenant";

/** 403: the provider vouched for the person, but Orchard gives them no access. */
export class SsoRefusedError extends ForbiddenError {
  readonly reason: SsoRefusal;
  constructor(reason: SsoRefusal, message: string) {
    super(message);
    this.reason = reason;
  }
}

function principalOf(user: User, ip: string | null): Principal {
  return {
    kind: "user",
    id: user.id,
    label: user.email,
    role: user.role,
    tenantId: user.tenantId,
    ip,
  };
}

async function refuse(
  store: Store,
  provider: SsoProvider,
  who: { sub: string; email: string | null },
  ip: string | null,
  reason: SsoRefusal,
  message: string,
): Promise<never> {
  const op = store.kv.atomic();
  addAudit(op, {
    kind: "system",
    id: `sso:${provider.id}`,
    label: `SSO ${provider.displayName}`,
    role: "platform_admin",
    tenantId: null,
    ip,
  }, {
    action: "user.sso_refused",
    target: {
      type: "sso_subject",
      id: who.sub,
      ...(who.email ? { label: who.email } : {}),
    },
    tenantId: provider.tenantId,
    after: { provider: provider.id, reason },
  });
  await op.commit();
  throw new SsoRefusedError(reason, message);
}

/**
 * Signs in the person `claims` (validated by lib/oidc.ts) describe, through
 * `provider`: returns the new session and the user, or throws
 * `SsoRefusedError` (nothing created).
 */
export async function ssoSignIn(
  store: Store,
  provider: SsoProvider,
  claims: Record<string, unknown> & { sub: string },
  ip: string | null,
): Promise<{ session: Session; user: User; provisioned: boolean }> {
  const sub = String(claims.sub).slice(0, 255);
  const parsed = emailSchema.safeParse(claims.email);
  const email = parsed.success ? parsed.data : null;
  const who = { sub, email };
  const name = provider.displayName;
  let match = firstMatch(provider.rules, claims);
  // a restricted provider reaches its own tenant only, whatever its rules say
  if (
    match && provider.tenantId &&
    (match.rule.tenantId !== provider.tenantId ||
      match.rule.role === "platform_admin")
  ) match = null;
  if (
    match?.rule.tenantId && !(await getTenantRaw(store, match.rule.tenantId))
  ) {
    match = null;
  }
  if (!match) {
    return await refuse(
      store,
      provider,
      who,
      ip,
      "no_rule",
      `You signed in to ${name}${
        email ? ` as ${email}` : ""
      }, but none of its sign-in rules gives this account access to Orchard (no tenant or role matches its groups or claims). No Orchard account was created. Ask your administrator for access.`,
    );
  }
  const { tenantId, role } = match.rule;

  const link = await store.kv.get<string>(k.userBySso(provider.id, sub));
  let user = link.value ? await getUserRaw(store, link.value) : null;
  let provisioned = false;
  const op = store.kv.atomic().check(link);
  if (!user) {
    if (!email) {
      return await refuse(
        store,
        provider,
        who,
        ip,
        "no_email",
        `${name} did not share a valid email address, which Orchard needs for your account. Ask your administrator to add the "email" scope or claim.`,
      );
    }
    const existing = await getUserByEmail(store, email);
    if (existing) {
      const vouched = claims.email_verified === true || provider.trustEmail;
      const inScope = provider.tenantId === null ||
        existing.tenantId === provider.tenantId;
      if (!vouched || !inScope) {
        return await refuse(
          store,
          provider,
          who,
          ip,
          "email_taken",
          `An Orchard account for ${email} already exists, and ${name} cannot be linked to it (${
            vouched
              ? "the account belongs to another organisation"
              : "the provider did not confirm the email address"
          }). No account was created.`,
        );
      }
      user = existing;
      op.set(k.userBySso(provider.id, sub), user.id);
      addAudit(op, principalOf(user, ip), {
        action: "user.sso_link",
        target: { type: "user", id: user.id, label: user.email },
        tenantId: user.tenantId,
        after: { provider: provider.id, subject: sub },
      });
    } else {
      user = {
        id: newId(),
        email,
        passwordHash: "",
        role,
        tenantId,
        disabled: false,
        createdAt: new Date().toISOString(),
      };
      provisioned = true;
      op.check({ key: k.userByEmail(email), versionstamp: null })
        .set(k.user(user.id), user)
        .set(k.userByEmail(email), user.id)
        .set(k.userBySso(provider.id, sub), user.id);
      if (tenantId) op.set(k.tenantUser(tenantId, user.id), user.id);
      addAudit(op, principalOf(user, ip), {
        action: "user.provision",
        target: { type: "user", id: user.id, label: email },
        tenantId,
        after: { ...userView(user), provider: provider.id, rule: match.n },
      });
    }
  }
  if (user.disabled) {
    return await refuse(
      store,
      provider,
      who,
      ip,
      "disabled",
      "Your Orchard account is disabled. Ask your administrator.",
    );
  }
  if (user.tenantId !== tenantId) {
    return await refuse(
      store,
      provider,
      who,
      ip,
      "other_tenant",
      `Your Orchard account belongs to another organisation than the one ${name}'s rules give you now. Ask your administrator.`,
    );
  }
  if (!provisioned && user.role !== role) {
    // the provider's groups decide the role at every sign-in
    const entry = await store.kv.get<User>(k.user(user.id));
    if (!entry.value) {
      throw new ConflictError("Your account changed; try again");
    }
    const after: User = { ...entry.value, role: role as Role };
    op.check(entry).set(k.user(user.id), after);
    addAudit(op, principalOf(user, ip), {
      action: "user.role_sync",
      target: { type: "user", id: user.id, label: user.email },
      tenantId: user.tenantId,
      before: { role: user.role },
      after: { role, provider: provider.id, rule: match.n },
    });
    user = after;
  }
  addAudit(op, principalOf(user, ip), {
    action: "user.sso_sign_in",
    target: { type: "user", id: user.id, label: user.email },
    tenantId: user.tenantId,
    after: { provider: provider.id, rule: match.n },
  });
  if (!(await op.commit()).ok) {
    throw new ConflictError(
      "Your account changed while signing in; sign in again.",
    );
  }
  return {
    session: await startSession(store, user, ip, Date.now(), "sso"),
    user,
    provisioned,
  };
}
