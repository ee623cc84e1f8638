/** Budgets, alerts, webhooks and spend as the portal shows them. */
import type { ApiKeyView } from "../store/api_keys.ts";
import type { BudgetAlert } from "../store/budget_alerts.ts";
import type { BudgetUse } from "../store/budgets.ts";
import { formatMoney } from "../store/money.ts";
import type { Spend } from "../store/spend.ts";
import type { DeliveryView, WebhookView } from "../store/webhooks.ts";
import { fmtInt } from "./dashboard.tsx";
import { Badge, fmtTime, PostForm, Table, Time } from "./ui.tsx";

/** A table that scrolls sideways on phones instead of squeezing its cells. */
function WideTable(props: Parameters<typeof Table>[0]) {
  return (
    <div class="roomy">
      <Table {...props} />
    </div>
  );
}

/** Money with its currency: "12.34 EUR". */
export function fmtMoney(micro: number, currency: string | null): string {
  return `${formatMoney(micro)}${currency ? ` ${currency}` : ""}`;
}

/** A budget amount or spend in its unit. */
export function fmtBudget(
  unit: "tokens" | "money",
  n: number,
  currency: string | null,
): string {
  return unit === "money" ? fmtMoney(n, currency) : `${fmtInt(n)} tokens`;
}

function Meter(props: { percent: number; label: string }) {
  const hot = props.percent >= 80;
  const w = Math.min(100, props.percent);
  return (
    <div class="meter-row">
      <div
        class={hot ? "meter warn" : "meter"}
        role="meter"
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={w}
        aria-label={props.label}
      >
        <span style={`width:${w}%`} />
      </div>
      <span class={hot ? "pct hot" : "pct"}>{props.percent}%</span>
    </div>
  );
}

/** A tenant's budgets and its keys', with this month's spend. */
export function BudgetTable(
  props: {
    budgets: BudgetUse[];
    currency: string;
    keys: Map<string, string>;
    /** Delete buttons post here (with scope, keyId and unit); none when null. */
    deleteAction: ((b: BudgetUse) => boolean) | null;
    action: string;
    csrf: string;
  },
) {
  return (
    <WideTable
      head={["Budget", "Kind", "Per month", "Spent", "", "Alerts at", ""]}
      rows={props.budgets.length}
      empty="No budgets: spend is unlimited."
    >
      {props.budgets.map((b) => {
        const owner = b.keyId === null
          ? "Tenant"
          : `Key ${props.keys.get(b.keyId) ?? b.keyId}`;
        return (
          <tr
            key={`${b.keyId}-${b.unit}`}
            data-budget={`${b.keyId ?? "tenant"}:${b.unit}`}
            class={b.percent >= 80 ? "hot" : undefined}
          >
            <td>{owner}</td>
            <td>
              {b.unit}{" "}
              {b.hard ? <Badge tone="danger">hard</Badge> : <Badge>soft</Badge>}
            </td>
            <td class="num">{fmtBudget(b.unit, b.amount, props.currency)}</td>
            <td class="num" data-spent>
              {fmtBudget(b.unit, b.spent, props.currency)}
            </td>
            <td style="min-width:140px">
              <Meter percent={b.percent} label={`${owner} ${b.unit} budget`} />
            </td>
            <td>{b.thresholds.map((t) => `${t}%`).join(", ")}</td>
            <td>
              {props.deleteAction?.(b) && (
                <PostForm action={props.action} csrf={props.csrf}>
                  <input
                    type="hidden"
                    name="scope"
                    value={b.keyId ? "key" : "tenant"}
                  />
                  <input type="hidden" name="keyId" value={b.keyId ?? ""} />
                  <input type="hidden" name="unit" value={b.unit} />
                  <button type="submit" class="small">Remove</button>
                </PostForm>
              )}
            </td>
          </tr>
        );
      })}
    </WideTable>
  );
}

/** The fields of a budget form (amount, unit, hard, thresholds). */
export function BudgetFields(
  props: { keys?: ApiKeyView[]; prefix: string },
) {
  const id = (n: string) => `${props.prefix}-${n}`;
  return (
    <div class="row">
      {props.keys && (
        <div class="field">
          <label for={id("key")}>API key</label>
          <select id={id("key")} name="keyId" required>
            {props.keys.map((k) => (
              <option key={k.id} value={k.id}>
                {k.name} ({k.prefix}…{k.last4})
              </option>
            ))}
          </select>
        </div>
      )}
      <div class="field">
        <label for={id("unit")}>Counts</label>
        <select id={id("unit")} name="unit">
          <option value="money">money</option>
          <option value="tokens">tokens</option>
        </select>
      </div>
      <div class="field">
        <label for={id("amount")}>
          Per month <span class="hint">amount or tokens</span>
        </label>
        <input
          id={id("amount")}
          type="text"
          name="amount"
          required
          inputMode="decimal"
          placeholder="e.g. 500.00"
          maxLength={20}
        />
      </div>
      <div class="field">
        <label for={id("thresholds")}>
          Alert at <span class="hint">percent, comma-separated</span>
        </label>
        <input
          id={id("thresholds")}
          type="text"
          name="thresholds"
          value="80, 100"
          maxLength={60}
        />
      </div>
      <div class="field">
        <label>Enforce</label>
        <div class="checks">
          <label>
            <input type="checkbox" name="hard" value="on" />{" "}
            hard: refuse requests once reached
          </label>
        </div>
      </div>
    </div>
  );
}

/** Alerts, newest first, with an acknowledge button where allowed. */
export function AlertList(
  props: {
    alerts: BudgetAlert[];
    /** Where each alert's acknowledge form posts; none when null. */
    ackAction: ((a: BudgetAlert) => string) | null;
    csrf: string;
    showTenant?: boolean;
    next?: string;
  },
) {
  const head = [
    ...(props.showTenant ? ["Tenant"] : []),
    "When",
    "Budget",
    "Threshold",
    "Spent",
    "",
  ];
  return (
    <WideTable head={head} rows={props.alerts.length} empty="No alerts.">
      {props.alerts.map((a) => (
        <tr key={a.id} data-alert={a.id} class={a.acknowledgedAt ? "" : "hot"}>
          {props.showTenant && (
            <td>
              <a href={`/tenants/${a.tenantId}/budgets`}>{a.tenantName}</a>
            </td>
          )}
          <td class="time">
            <Time iso={a.createdAt} />
          </td>
          <td>
            {a.keyId ? `Key ${a.keyName ?? a.keyId}` : "Tenant"} · {a.unit}
            {a.hard ? " (hard)" : ""} · {a.period}
          </td>
          <td>
            <Badge tone={a.threshold >= 100 ? "danger" : "warn"}>
              {a.threshold}%
            </Badge>
            {a.cause === "refused" && (
              <span class="muted">requests refused</span>
            )}
          </td>
          <td class="mono">
            {fmtBudget(a.unit, a.spent, a.currency)} of{" "}
            {fmtBudget(a.unit, a.amount, a.currency)} ({a.percent}%)
          </td>
          <td>
            {a.acknowledgedAt
              ? <span class="muted">seen by {a.acknowledgedBy}</span>
              : props.ackAction && (
                <PostForm action={props.ackAction(a)} csrf={props.csrf}>
                  {props.next && (
                    <input type="hidden" name="next" value={props.next} />
                  )}
                  <button type="submit" class="small">Acknowledge</button>
                </PostForm>
              )}
          </td>
        </tr>
      ))}
    </WideTable>
  );
}

/** Webhook endpoints, with delete buttons where allowed. */
export function WebhookList(
  props: {
    hooks: WebhookView[];
    deleteAction: ((h: WebhookView) => string) | null;
    csrf: string;
  },
) {
  return (
    <WideTable
      head={["URL", "Description", "Secret", "Created", ""]}
      rows={props.hooks.length}
      empty="No webhook endpoints."
    >
      {props.hooks.map((h) => (
        <tr key={h.id} data-webhook={h.id}>
          <td class="mono wrap">{h.url}</td>
          <td>{h.description || <span class="muted">—</span>}</td>
          <td class="mono">whsec_…{h.secretLast4}</td>
          <td class="time">
            <Time iso={h.createdAt} />
          </td>
          <td>
            {props.deleteAction && (
              <PostForm action={props.deleteAction(h)} csrf={props.csrf}>
                <button type="submit" class="small danger">Delete</button>
              </PostForm>
            )}
          </td>
        </tr>
      ))}
    </WideTable>
  );
}

/** The delivery log: each delivery's status, attempts and last error. */
export function DeliveryLog(props: { deliveries: DeliveryView[] }) {
  return (
    <WideTable
      head={["Created", "Event", "Endpoint", "Status", "Attempts", "Last"]}
      rows={props.deliveries.length}
      empty="Nothing delivered yet."
    >
      {props.deliveries.map((d) => (
        <tr key={d.id} data-delivery={d.id}>
          <td class="time">
            <Time iso={d.createdAt} />
          </td>
          <td class="mono">
            {d.eventType}
            <div class="muted">{d.eventId}</div>
          </td>
          <td class="mono wrap">{d.url}</td>
          <td>
            <Badge
              tone={d.status === "delivered"
                ? "ok"
                : d.status === "failed"
                ? "danger"
                : "warn"}
            >
              {d.status}
            </Badge>
          </td>
          <td data-attempts>{d.attempts}</td>
          <td>
            {d.lastError
              ? <span class="err-text">{d.lastError}</span>
              : d.lastStatus
              ? `HTTP ${d.lastStatus}`
              : "—"}
            {d.status === "pending" && d.nextAttemptAt && (
              <div class="muted">
                next try {fmtTime(new Date(d.nextAttemptAt).toISOString())}
              </div>
            )}
          </td>
        </tr>
      ))}
    </WideTable>
  );
}

/** Spend per model and per key of a range. */
export function SpendTables(
  props: { spend: Spend; keys: Map<string, string> },
) {
  const s = props.spend;
  return (
    <div class="grid2">
      <Table
        head={["Model", "Prompt", "Completion", "Cost"]}
        rows={s.byModel.length}
        empty="No usage in this range."
      >
        {s.byModel.map((m) => (
          <tr key={m.model} data-spend-model={m.model}>
            <td class="mono">
              <span class="trunc" title={m.model}>{m.model}</span>
            </td>
            <td class="num">{fmtInt(m.promptTokens)}</td>
            <td class="num">{fmtInt(m.completionTokens)}</td>
            <td class="num">{fmtMoney(m.amountMicro, s.currency)}</td>
          </tr>
        ))}
      </Table>
      {s.byKey && (
        <Table
          head={["API key", "Tokens", "Cost"]}
          rows={s.byKey.length}
          empty="No usage in this range."
        >
          {s.byKey.map((k) => (
            <tr key={k.keyId} data-spend-key={k.keyId}>
              <td>{props.keys.get(k.keyId) ?? k.keyId}</td>
              <td class="num">{fmtInt(k.promptTokens + k.completionTokens)}</td>
              <td class="num">{fmtMoney(k.amountMicro, s.currency)}</td>
            </tr>
          ))}
        </Table>
      )}
    </div>
  );
}
