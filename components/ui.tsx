/** The portal's small design system: cards, fields, buttons, badges, tables. */
import type { ComponentChildren, JSX } from "preact";
import FormGuard from "../islands/FormGuard.tsx";
import { Island } from "./Island.tsx";

/** A white panel with an optional title. */
export function Card(
  props: { title?: string; children: ComponentChildren; id?: string },
) {
  return (
    <section class="card" id={props.id}>
      {props.title && <h2>{props.title}</h2>}
      {props.children}
    </section>
  );
}

/** A labelled form field with optional hint and error. */
export function Field(
  props: {
    label: string;
    name: string;
    type?: string;
    value?: string | number | null;
    hint?: string;
    error?: string;
    required?: boolean;
    placeholder?: string;
    min?: number;
    max?: number;
    autocomplete?: string;
    maxLength?: number;
  },
) {
  const id = `f-${props.name}`;
  return (
    <div class="field">
      <label for={id}>
        {props.label} {props.hint && <span class="hint">{props.hint}</span>}
      </label>
      <input
        id={id}
        name={props.name}
        type={props.type ?? "text"}
        value={props.value ?? ""}
        required={props.required}
        placeholder={props.placeholder}
        min={props.min}
        max={props.max}
        autocomplete={props.autocomplete}
        maxLength={props.maxLength}
        aria-invalid={props.error ? "true" : undefined}
      />
      {props.error && <div class="err" role="alert">{props.error}</div>}
    </div>
  );
}

/** A status badge. */
export function Badge(
  props: { tone?: "ok" | "warn" | "danger"; children: ComponentChildren },
) {
  return <span class={`badge ${props.tone ?? ""}`}>{props.children}</span>;
}

/** An alert box. */
export function Alert(
  props: { tone: "error" | "ok" | "warn"; children: ComponentChildren },
) {
  return (
    <div
      class={`alert ${props.tone}`}
      role={props.tone === "error" ? "alert" : "status"}
    >
      {props.children}
    </div>
  );
}

/**
 * A form that posts with the CSRF token and a one-time `_once` token (new
 * on every render): the server acts on the first post with it only, so a
 * double click or a resent form does not act twice (routes/_once.tsx).
 * With JavaScript, a repeated submit is not even sent (islands/FormGuard.tsx).
 */
export function PostForm(
  props: {
    action: string;
    csrf: string;
    children: ComponentChildren;
    class?: string;
    id?: string;
  } & Omit<JSX.HTMLAttributes<HTMLFormElement>, "action" | "method">,
) {
  const { action, csrf, children, ...rest } = props;
  return (
    <form method="post" action={action} {...rest}>
      <input type="hidden" name="_csrf" value={csrf} />
      <input type="hidden" name="_once" value={crypto.randomUUID()} />
      <Island name="FormGuard" component={FormGuard} props={{}} />
      {children}
    </form>
  );
}

/** A horizontally scrollable table. */
export function Table(
  props: {
    head: string[];
    children: ComponentChildren;
    empty?: string;
    rows: number;
  },
) {
  return (
    <div class="table-wrap">
      <table>
        <thead>
          <tr>{props.head.map((h) => <th key={h}>{h}</th>)}</tr>
        </thead>
        <tbody>
          {props.rows === 0
            ? (
              <tr>
                <td colSpan={props.head.length} class="muted">
                  {props.empty ?? "Nothing here yet."}
                </td>
              </tr>
            )
            : props.children}
        </tbody>
      </table>
    </div>
  );
}

/** "Next page" link when a cursor exists. */
export function Pager(props: { next: string | null }) {
  return (
    <div class="pager">
      <span />
      {props.next && <a class="btn small" href={props.next}>Next page →</a>}
    </div>
  );
}

/** Formats an ISO time for display (UTC, minutes). */
export function fmtTime(iso: string | null | undefined): string {
  if (!iso) return "—";
  return iso.slice(0, 16).replace("T", " ") + " UTC";
}
