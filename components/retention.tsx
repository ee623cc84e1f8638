/** The tenant page's data retention card: periods per kind, the provider's bounds, export and deletion. */
import { Island } from "./Island.tsx";
import { Badge, Card, fmtTime, PostForm, Table } from "./ui.tsx";
import ConfirmSubmit from "../islands/ConfirmSubmit.tsx";
import {
  RETENTION_KINDS,
  RETENTION_LABELS,
  type TenantRetentionView,
} from "../store/retention.ts";
import type { ComponentChildren } from "preact";

/** Props of RetentionCard. */
export interface RetentionCardProps {
  tenantId: string;
  retention: TenantRetentionView;
  csrf: string;
  /** Tenant admins and platform admins choose periods and export. */
  canWrite: boolean;
  /** Platform admins delete the tenant or cancel its deletion. */
  platform: boolean;
  /** Flash and error messages of the section. */
  messages: ComponentChildren;
  /** What was typed, after an error. */
  input: (name: string) => string | undefined;
}

/** "Data retention" on the tenant page (`#retention`). */
export function RetentionCard(props: RetentionCardProps) {
  const { retention: r, tenantId: id, csrf } = props;
  const table = (
    <Table
      head={["Records", "Kept for", "Provider's bounds"]}
      rows={RETENTION_KINDS.length}
    >
      {RETENTION_KINDS.map((kind) => (
        <tr key={kind} data-retention={kind}>
          <td>{RETENTION_LABELS[kind]}</td>
          <td>
            {props.canWrite
              ? (
                <input
                  type="number"
                  name={kind}
                  min={r.bounds.min[kind]}
                  max={r.bounds.max[kind]}
                  aria-label={`${RETENTION_LABELS[kind]}, days`}
                  placeholder={`${r.bounds.defaults[kind]} (default)`}
                  value={props.input(kind) ?? r.choice[kind] ?? ""}
                  style="width:9em"
                />
              )
              : null} <span data-field="days">{r.periods[kind]} days</span>
          </td>
          <td class="muted">
            {r.bounds.min[kind]}–{r.bounds.max[kind]} days, default{" "}
            {r.bounds.defaults[kind]}
          </td>
        </tr>
      ))}
    </Table>
  );
  return (
    <Card title="Data retention" id="retention">
      {props.messages}
      {r.deletion && (
        <p data-testid="deletion">
          <Badge tone="danger">deletion scheduled</Badge> Requested{" "}
          {fmtTime(r.deletion.requestedAt)} by{" "}
          {r.deletion.by}; its data is removed on {fmtTime(r.deletion.purgeAt)}.
        </p>
      )}
      <p class="muted">
        Records older than their period are deleted. A deleted tenant is
        disabled at once and its data removed after {r.bounds.deletionGraceDays}
        {" "}
        days.
      </p>
      {props.canWrite
        ? (
          <PostForm action={`/tenants/${id}/retention`} csrf={csrf}>
            {table}
            <button type="submit">Save retention</button>
          </PostForm>
        )
        : table}
      <div class="row" style="gap:6px;margin-top:12px">
        {props.canWrite && (
          <a class="btn" href={`/tenants/${id}/export`} download>
            Export records (JSON)
          </a>
        )}
        {props.platform && !r.deletion && (
          <PostForm action={`/tenants/${id}/delete`} csrf={csrf}>
            <Island
              name="ConfirmSubmit"
              component={ConfirmSubmit}
              props={{
                label: "Delete tenant",
                confirmLabel: "Yes, delete",
                question:
                  `Its keys stop working now; its data is removed in ${r.bounds.deletionGraceDays} days.`,
                action: "delete",
              }}
            />
          </PostForm>
        )}
        {props.platform && r.deletion && (
          <PostForm action={`/tenants/${id}/deletion/cancel`} csrf={csrf}>
            <button type="submit" class="small">Cancel deletion</button>
          </PostForm>
        )}
      </div>
    </Card>
  );
}
