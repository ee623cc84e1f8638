// deno-lint-ignore-file no-console -- command-line entry point.
/**
 * `deno task orchard`: the admin CLI, a thin client of the admin REST API
 * (ORCHARD_URL, ORCHARD_ADMIN_TOKEN). `--json` prints machine output.
 */
import { parseArgs } from "node:util";

const USAGE = `Usage: deno task orchard <command> [options]

  tenant create NAME [--slug SLUG]         create a tenant
  tenant list [--search TEXT]              list tenants
  tenant suspend|resume TENANT             suspend or resume a tenant (id or slug)
  key create TENANT --name NAME [--scopes chat,embeddings,models] [--models a,b] [--expires ISO]
  key list TENANT                          list a tenant's keys
  key revoke KEY_ID                        revoke a key
  limits show TENANT                       show a tenant's limits
  limits set TENANT [--rpm N] [--tpm N] [--concurrency N] [--tokens-per-day N] [--tokens-per-month N]
                                           (use "none" for unlimited; unset fields keep their value)
  budget show TENANT                       the tenant's and its keys' budgets with this month's spend
  budget set TENANT --unit tokens|money --amount AMOUNT [--key KEY_ID] [--hard] [--thresholds 80,100]
                                           money in major units as typed ("500.00"), tokens whole
  pricing show                             prices per 1M tokens and the cluster cost model
  user invite EMAIL --role ROLE [--tenant TENANT]
  user list [--tenant TENANT]              users with role, status and last sign-in
  user disable|enable USER_ID              disabling ends their sessions at once
  user reset-password USER_ID              one-time reset link (valid 24 h) to pass on
  invite list [--tenant TENANT]            pending invites
  invite revoke INVITE_ID                  revoke a pending invite
  admin-token create --name NAME --role ROLE [--tenant TENANT] [--days N | --expires ISO]
                                           a token for this CLI and the admin API (shown once)
  admin-token list [--tenant TENANT]       tokens (never their secrets)
  admin-token revoke TOKEN_ID              revoke a token
  join-token create [--uses N] [--ttl SECONDS]
  audit [--tenant TENANT] [--actor ID]

Roles: platform_admin, tenant_admin, tenant_viewer (tenant roles need --tenant)
Options: --json  machine-readable output
Environment: ORCHARD_URL (default http://localhost:8000), ORCHARD_ADMIN_TOKEN (required)`;

/** An error to print without a stack trace. */
class CliError extends Error {}

/** How to get an admin token: printed when none is set, or when it is refused. */
export function howToGetAToken(base: string): string {
  return `To get an admin token (orchadm_…):
  - in the portal, signed in as a platform or tenant admin: open ${base}/admin-tokens,
    create a token and copy it (it is shown once);
  - with an admin token you already have: deno task orchard admin-token create --name NAME --role ROLE
    (or POST ${base}/api/admin/v1/admin-tokens);
  - for the very first one, without the portal: start the server with
    ORCHARD_ADMIN_TOKEN set to a random secret of at least 24 characters
    (e.g. ORCHARD_ADMIN_TOKEN=$(openssl rand -hex 24) deno task start) and export the same value here.
Then: export ORCHARD_ADMIN_TOKEN=<the token>`;
}

/** Calls the admin API; throws CliError with the server's message on failure. */
async function call(
  method: string,
  path: string,
  body?: unknown,
): Promise<unknown> {
  const base = (Deno.env.get("ORCHARD_URL") ?? "http://localhost:8000").replace(
    /\/+$/,
    "",
  );
  const token = Deno.env.get("ORCHARD_ADMIN_TOKEN");
  if (!token) {
    throw new CliError(
      `ORCHARD_ADMIN_TOKEN is not set: this command needs an admin API token.\n${
        howToGetAToken(base)
      }`,
    );
  }
  let res: Response;
  try {
    res = await fetch(`${base}/api/admin/v1${path}`, {
      method,
      headers: {
        authorization: `Bearer ${token}`,
        ...(body !== undefined ? { "content-type": "application/json" } : {}),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new CliError(
      `Cannot reach Orchard at ${base}: ${(err as Error).message}`,
    );
  }
  const text = await res.text();
  let data: unknown = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    throw new CliError(
      `Unexpected response (${res.status}): ${text.slice(0, 200)}`,
    );
  }
  if (!res.ok) {
    const e = (data as { error?: { message?: string; field?: string | null } })
      ?.error;
    throw new CliError(
      `${res.status}: ${e?.message ?? "request failed"}${
        e?.field ? ` (${e.field})` : ""
      }${
        res.status === 401
          ? `\nORCHARD_ADMIN_TOKEN was refused (wrong, revoked or expired).\n${
            howToGetAToken(base)
          }`
          : ""
      }`,
    );
  }
  return data;
}

function num(v: string | undefined, name: string): number | null | undefined {
  if (v === undefined) return undefined;
  if (v === "none" || v === "null") return null;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) {
    throw new CliError(`--${name} must be a whole number or "none"`);
  }
  return n;
}

function table(rows: Record<string, unknown>[], cols: string[]): string {
  const cells = rows.map((r) => cols.map((c) => String(r[c] ?? "—")));
  const widths = cols.map((c, i) =>
    Math.max(c.length, ...cells.map((r) => r[i]!.length))
  );
  const line = (r: string[]) =>
    r.map((v, i) => v.padEnd(widths[i]!)).join("  ").trimEnd();
  return [line(cols), ...cells.map(line)].join("\n");
}

function formatLimits(l: Record<string, number | null>): string {
  return Object.entries(l).map(([k, v]) =>
    `${k.padEnd(15)} ${v ?? "unlimited"}`
  )
    .join("\n");
}

/** Budgets as a table: whose, unit, amount and spend (money with its currency). */
function formatBudgets(
  period: string,
  rows: Record<string, unknown>[],
): string {
  const cur = (r: Record<string, unknown>, v: unknown) =>
    r.currency ? `${v} ${r.currency}` : String(v);
  return `${period ? `Budgets for ${period}\n` : ""}${
    table(
      rows.map((r) => ({
        owner: r.keyId ? `key ${r.keyId}` : "tenant",
        unit: r.unit,
        amount: cur(r, r.amount),
        spent: r.spent === undefined ? "—" : cur(r, r.spent),
        percent: r.percent,
        hard: r.hard ? "hard" : "soft",
      })),
      ["owner", "unit", "amount", "spent", "percent", "hard"],
    )
  }`;
}

/** Runs the CLI with `args`; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const { values: o, positionals: pos } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      json: { type: "boolean" },
      help: { type: "boolean", short: "h" },
      slug: { type: "string" },
      search: { type: "string" },
      name: { type: "string" },
      scopes: { type: "string" },
      models: { type: "string" },
      expires: { type: "string" },
      rpm: { type: "string" },
      tpm: { type: "string" },
      concurrency: { type: "string" },
      "tokens-per-day": { type: "string" },
      "tokens-per-month": { type: "string" },
      role: { type: "string" },
      tenant: { type: "string" },
      actor: { type: "string" },
      uses: { type: "string" },
      ttl: { type: "string" },
      days: { type: "string" },
      unit: { type: "string" },
      amount: { type: "string" },
      key: { type: "string" },
      hard: { type: "boolean" },
      thresholds: { type: "string" },
    },
  });
  const [group, action, arg] = pos;
  if (o.help || !group) {
    console.log(USAGE);
    return o.help ? 0 : 2;
  }
  const out = (data: unknown, human: () => string) =>
    console.log(o.json ? JSON.stringify(data, null, 2) : human());
  const enc = encodeURIComponent;
  const need = (v: string | undefined, what: string) => {
    if (!v) throw new CliError(`Missing ${what}.\n\n${USAGE}`);
    return v;
  };
  const cmd = `${group} ${action ?? ""}`.trim();
  switch (cmd) {
    case "tenant create": {
      const t = await call("POST", "/tenants", {
        name: need(arg, "NAME"),
        ...(o.slug ? { slug: o.slug } : {}),
      }) as Record<string, string>;
      out(t, () => `Created tenant ${t.name} (${t.slug}, id ${t.id})`);
      return 0;
    }
    case "tenant list": {
      const q = o.search ? `?search=${enc(o.search)}&limit=200` : "?limit=200";
      const page = await call("GET", `/tenants${q}`) as {
        items: Record<string, unknown>[];
      };
      out(page, () => table(page.items, ["id", "slug", "name", "status"]));
      return 0;
    }
    case "tenant suspend":
    case "tenant resume": {
      const t = await call("PATCH", `/tenants/${enc(need(arg, "TENANT"))}`, {
        status: action === "suspend" ? "suspended" : "active",
      }) as Record<string, string>;
      out(t, () => `Tenant ${t.slug} is now ${t.status}`);
      return 0;
    }
    case "key create": {
      const body = {
        name: need(o.name, "--name"),
        ...(o.scopes
          ? { scopes: o.scopes.split(",").map((s) => s.trim()) }
          : {}),
        ...(o.models
          ? { models: o.models.split(",").map((s) => s.trim()) }
          : {}),
        ...(o.expires ? { expiresAt: o.expires } : {}),
      };
      const k = await call(
        "POST",
        `/tenants/${enc(need(arg, "TENANT"))}/keys`,
        body,
      ) as Record<string, string>;
      out(
        k,
        () =>
          `Created key ${k.name} (id ${k.id}).\nThis is the only time the key is shown; store it now:\n\n  ${k.key}\n`,
      );
      return 0;
    }
    case "key list": {
      const page = await call(
        "GET",
        `/tenants/${enc(need(arg, "TENANT"))}/keys?limit=200`,
      ) as { items: Record<string, unknown>[] };
      out(
        page,
        () =>
          table(
            page.items.map((k) => ({
              ...k,
              key: `${k.prefix}…${k.last4}`,
              scopes: (k.scopes as string[]).join(","),
              state: k.revokedAt ? "revoked" : "active",
            })),
            ["id", "name", "key", "scopes", "state", "lastUsedAt"],
          ),
      );
      return 0;
    }
    case "key revoke": {
      const k = await call(
        "DELETE",
        `/keys/${enc(need(arg, "KEY_ID"))}`,
      ) as Record<string, string>;
      out(k, () => `Revoked key ${k.name} (${k.id})`);
      return 0;
    }
    case "limits show": {
      const l = await call(
        "GET",
        `/tenants/${enc(need(arg, "TENANT"))}/limits`,
      ) as Record<string, number | null>;
      out(l, () => formatLimits(l));
      return 0;
    }
    case "limits set": {
      const tenant = enc(need(arg, "TENANT"));
      const current = await call("GET", `/tenants/${tenant}/limits`) as Record<
        string,
        number | null
      >;
      const next = { ...current };
      for (
        const [flag, field] of [
          ["rpm", "rpm"],
          ["tpm", "tpm"],
          ["concurrency", "concurrency"],
          ["tokens-per-day", "tokensPerDay"],
          ["tokens-per-month", "tokensPerMonth"],
        ] as const
      ) {
        const v = num(o[flag], flag);
        if (v !== undefined) next[field] = v;
      }
      const l = await call("PUT", `/tenants/${tenant}/limits`, next) as Record<
        string,
        number | null
      >;
      out(l, () => formatLimits(l));
      return 0;
    }
    case "budget show": {
      const b = await call(
        "GET",
        `/tenants/${enc(need(arg, "TENANT"))}/budgets`,
      ) as { period: string; budgets: Record<string, unknown>[] };
      out(b, () => formatBudgets(b.period, b.budgets));
      return 0;
    }
    case "budget set": {
      const tenant = enc(need(arg, "TENANT"));
      const unit = need(o.unit, "--unit (tokens or money)");
      const amount = need(o.amount, "--amount");
      const body = {
        // money stays the decimal text typed: the API refuses numbers for it
        amount: unit === "tokens" ? num(amount, "amount") : amount,
        hard: o.hard ?? false,
        ...(o.thresholds
          ? { thresholds: o.thresholds.split(",").map(Number) }
          : {}),
      };
      const path = o.key
        ? `/keys/${enc(o.key)}/budgets/${enc(unit)}`
        : `/tenants/${tenant}/budgets/${enc(unit)}`;
      const b = await call("PUT", path, body) as Record<string, unknown>;
      out(b, () => formatBudgets("", [b]));
      return 0;
    }
    case "pricing show": {
      const p = await call("GET", "/settings/pricing") as {
        currency: string;
        models: Record<string, string>[];
        cluster: Record<string, unknown>;
      };
      out(p, () =>
        [
          `Prices per 1M tokens (${p.currency}):`,
          table(p.models, [
            "model",
            "promptPerMillion",
            "completionPerMillion",
          ]),
          "",
          ...Object.entries(p.cluster).map(([k, v]) => `${k.padEnd(21)} ${v}`),
        ].join("\n"));
      return 0;
    }
    case "user invite": {
      let tenantId: string | null = null;
      if (o.tenant) {
        tenantId =
          (await call("GET", `/tenants/${enc(o.tenant)}`) as { id: string }).id;
      }
      const inv = await call("POST", "/invites", {
        email: need(action === "invite" ? arg : undefined, "EMAIL"),
        role: need(o.role, "--role"),
        tenantId,
      }) as Record<string, string>;
      out(
        inv,
        () =>
          `Invite for ${inv.email} (${inv.role}). Send this one-time link:\n\n  ${inv.link}\n`,
      );
      return 0;
    }
    case "user list": {
      const qs = new URLSearchParams({ limit: "200" });
      if (o.tenant) qs.set("tenant", o.tenant);
      const page = await call("GET", `/users?${qs}`) as {
        items: Record<string, unknown>[];
      };
      out(
        page,
        () =>
          table(
            page.items.map((u) => ({
              ...u,
              status: u.disabled ? "disabled" : "active",
            })),
            ["id", "email", "role", "tenantId", "status", "lastSignInAt"],
          ),
      );
      return 0;
    }
    case "user disable":
    case "user enable": {
      const u = await call(
        "POST",
        `/users/${enc(need(arg, "USER_ID"))}/${action}`,
      ) as Record<string, string>;
      out(
        u,
        () =>
          action === "disable"
            ? `Disabled ${u.email}; their sessions ended.`
            : `Enabled ${u.email}.`,
      );
      return 0;
    }
    case "user reset-password": {
      const r = await call(
        "POST",
        `/users/${enc(need(arg, "USER_ID"))}/password-reset`,
      ) as Record<string, string>;
      out(
        r,
        () =>
          `Password reset for ${r.email}. Pass on this one-time link (valid until ${r.expiresAt}; shown once):\n\n  ${r.link}\n`,
      );
      return 0;
    }
    case "invite list": {
      const qs = new URLSearchParams({ limit: "200" });
      if (o.tenant) qs.set("tenant", o.tenant);
      const page = await call("GET", `/invites?${qs}`) as {
        items: Record<string, unknown>[];
      };
      out(
        page,
        () =>
          table(page.items, ["id", "email", "role", "tenantId", "expiresAt"]),
      );
      return 0;
    }
    case "invite revoke": {
      const inv = await call(
        "DELETE",
        `/invites/${enc(need(arg, "INVITE_ID"))}`,
      ) as Record<string, string>;
      out(inv, () => `Revoked the invite for ${inv.email}`);
      return 0;
    }
    case "admin-token create": {
      let tenantId: string | null = null;
      if (o.tenant) {
        tenantId =
          (await call("GET", `/tenants/${enc(o.tenant)}`) as { id: string }).id;
      }
      let expiresAt: string | null = null;
      if (o.expires) expiresAt = o.expires;
      else if (o.days) {
        const days = Number(o.days);
        if (!Number.isInteger(days) || days < 1) {
          throw new CliError(
            "--days must be a whole number of days (1 or more)",
          );
        }
        expiresAt = new Date(Date.now() + days * 86_400_000).toISOString();
      }
      const t = await call("POST", "/admin-tokens", {
        name: need(o.name, "--name"),
        role: need(o.role, "--role"),
        tenantId,
        expiresAt,
      }) as Record<string, string>;
      out(
        t,
        () =>
          `Created admin token ${t.name} (${t.role}${
            t.tenantId ? `, tenant ${t.tenantId}` : ""
          }, id ${t.id}, expires ${
            t.expiresAt ?? "never"
          }).\nThis is the only time the token is shown; store it now:\n\n  ${t.token}\n`,
      );
      return 0;
    }
    case "admin-token list": {
      const qs = new URLSearchParams({ limit: "200" });
      if (o.tenant) qs.set("tenant", o.tenant);
      const page = await call("GET", `/admin-tokens?${qs}`) as {
        items: Record<string, unknown>[];
      };
      const now = Date.now();
      out(
        page,
        () =>
          table(
            page.items.map((t) => ({
              ...t,
              state: t.revokedAt
                ? "revoked"
                : t.expiresAt && Date.parse(String(t.expiresAt)) <= now
                ? "expired"
                : "active",
              expiresAt: t.expiresAt ?? "never",
            })),
            [
              "id",
              "name",
              "role",
              "tenantId",
              "state",
              "createdAt",
              "expiresAt",
              "lastUsedAt",
            ],
          ),
      );
      return 0;
    }
    case "admin-token revoke": {
      const t = await call(
        "DELETE",
        `/admin-tokens/${enc(need(arg, "TOKEN_ID"))}`,
      ) as Record<string, string>;
      out(t, () => `Revoked admin token ${t.name} (${t.id})`);
      return 0;
    }
    case "join-token create": {
      const body = {
        ...(o.uses ? { uses: Number(o.uses) } : {}),
        ...(o.ttl ? { ttlSeconds: Number(o.ttl) } : {}),
      };
      const t = await call("POST", "/join-tokens", body) as Record<
        string,
        string
      >;
      out(
        t,
        () =>
          `Join token (shown once): ${t.token}\n\nOn the new Mac, in a checkout of Orchard, run:\n\n  ${
            t.command ??
              `deno task node join --gateway ${
                Deno.env.get("ORCHARD_URL") ?? "http://localhost:8000"
              } --join ${t.token} && deno task node service install`
          }\n${t.warning ? `\n${t.warning}\n` : ""}`,
      );
      return 0;
    }
    default:
      if (group === "audit") {
        const qs = new URLSearchParams({ limit: "100" });
        if (o.tenant) {
          qs.set(
            "tenant",
            (await call("GET", `/tenants/${enc(o.tenant)}`) as { id: string })
              .id,
          );
        }
        if (o.actor) qs.set("actor", o.actor);
        const page = await call("GET", `/audit?${qs}`) as {
          items: Record<string, unknown>[];
        };
        out(
          page,
          () =>
            table(
              page.items.map((e) => ({
                at: e.at,
                actor: (e.actor as { label: string }).label,
                action: e.action,
                target: `${(e.target as { type: string; id: string }).type}:${
                  (e.target as { id: string }).id
                }`,
                ip: e.ip,
              })),
              ["at", "actor", "action", "target", "ip"],
            ),
        );
        return 0;
      }
      console.error(`Unknown command: ${cmd}\n\n${USAGE}`);
      return 2;
  }
}

if (import.meta.main) {
  try {
    Deno.exit(await main(Deno.args));
  } catch (err) {
    if (
      err instanceof CliError ||
      (err as Error)?.name === "TypeError" && String(err).includes("parseArgs")
    ) {
      console.error((err as Error).message);
      Deno.exit(1);
    }
    if ((err as { code?: string }).code?.startsWith("ERR_PARSE_ARGS")) {
      console.error(`${(err as Error).message}\n\n${USAGE}`);
      Deno.exit(2);
    }
    throw err;
  }
}
