/** The portal page shell: navigation by role, the signed-in user, sign-out. */
import type { ComponentChildren } from "preact";
import type { Principal } from "../store/principal.ts";
import { PostForm } from "./ui.tsx";

/** Props of the page shell. */
export interface LayoutProps {
  title: string;
  principal: Principal;
  csrf: string;
  active: string;
  children: ComponentChildren;
  /** Budget alerts not acknowledged yet (a badge on the alerts entry). */
  openAlerts?: number;
}

/** What tenant admins see beyond their viewers (routes/users.tsx, routes/admin_tokens.tsx). */
const TENANT_ADMIN_NAV: [string, string][] = [
  ["/playground", "Playground"],
  ["/users", "Users"],
  ["/admin-tokens", "Admin tokens"],
];

/** The navigation entries a principal sees. */
function navFor(p: Principal): [string, string][] {
  if (p.role === "platform_admin") {
    return [
      ["/tenants", "Tenants"],
      ["/usage", "Usage & cost"],
      ["/chargeback", "Chargeback"],
      ["/capacity", "Capacity"],
      ["/alerts", "Alerts"],
      ["/nodes", "Nodes"],
      ["/mesh", "RDMA mesh"],
      ["/models", "Models"],
      ["/playground", "Playground"],
      ["/audit", "Audit log"],
      ["/users", "Users"],
      ["/admin-tokens", "Admin tokens"],
      ["/settings", "Settings"],
    ];
  }
  return [
    [`/tenants/${p.tenantId}`, "My tenant"],
    ["/usage", "Usage & cost"],
    ["/audit", "Audit log"],
    ...(p.role === "tenant_admin" ? TENANT_ADMIN_NAV : []),
  ];
}

/** The navigation entry that carries the alerts badge. */
function alertsHref(p: Principal): string {
  return p.role === "platform_admin" ? "/alerts" : `/tenants/${p.tenantId}`;
}

/** Page shell for signed-in users. */
export function Layout(props: LayoutProps) {
  return (
    <div class="shell">
      <nav class="nav" aria-label="Main">
        <a class="brand" href="/">
          <span class="logo" aria-hidden="true"></span>Orchard
        </a>
        {navFor(props.principal).map(([href, label]) => (
          <a
            key={href}
            href={href}
            aria-current={props.active === href ? "page" : undefined}
          >
            {label}
            {href === alertsHref(props.principal) && !!props.openAlerts && (
              <span
                class="badge warn nav-badge"
                data-testid="alert-badge"
                title="Budget alerts not acknowledged"
              >
                {props.openAlerts}
              </span>
            )}
          </a>
        ))}
        <div class="who">
          {props.principal.label}
          <br />
          <span>{props.principal.role.replace("_", " ")}</span>
        </div>
        <PostForm action="/logout" csrf={props.csrf}>
          <button type="submit" class="small">Sign out</button>
        </PostForm>
      </nav>
      <main>{props.children}</main>
    </div>
  );
}
