/** The portal's small design system: cards, fields, buttons, badges, tables. */
import {
  cloneElement,
  type ComponentChildren,
  isValidElement,
  type JSX,
  toChildArray,
} from "preact";
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

/**
 * Gives each cell of a row its column's header as `data-label`, so that on a
 * phone (app.css) each row becomes a card of "label value" lines. Cells that
 * span columns get none (they are totals or notes).
 */
function labelCells(children: ComponentChildren, head: string[]) {
  return toChildArray(children).map((row) => {
    if (!isValidElement(row) || row.type !== "tr") return row;
    let col = 0;
    const rowProps = row.props as { children?: ComponentChildren };
    const cells = toChildArray(rowProps.children).map((cell) => {
      if (!isValidElement(cell) || cell.type !== "td") return cell;
      const props = cell.props as { colSpan?: number; "data-label"?: string };
      const span = props.colSpan ?? 1;
      const label = span === 1 ? head[col] : undefined;
      col += span;
      return label && props["data-label"] === undefined
        ? cloneElement(cell, { "data-label": label })
        : cell;
    });
    return cloneElement(row, {}, ...cells);
  });
}

/**
 * A table: on wide screens a table (scrolling sideways inside its card if it
 * must), on phones one card per row with each cell labelled by its column.
 */
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
      <table class="cards">
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
            : labelCells(props.children, props.head)}
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

/** A time in a table cell: date and time each on one line, wrapping only between them. */
export function Time(props: { iso: string | null | undefined }) {
  const t = fmtTime(props.iso);
  const cut = t.indexOf(" ");
  if (cut < 0) return <span class="nowrap">{t}</span>;
  return (
    <>
      <span class="nowrap">{t.slice(0, cut)}</span>{" "}
      <span class="nowrap">{t.slice(cut + 1)}</span>
    </>
  );
}

/** Formats an ISO time for display (UTC, minutes). */
export function fmtTime(iso: string | null | undefined): string {
  if (!iso) return "—";
  return iso.slice(0, 16).replace("T", " ") + " UTC";
}

/**
 * The end of a GET filter form: a UTC time range (`from`, `to`; ids
 * prefixed with `idPrefix`), then Filter and Clear (back to `clearHref`).
 */
export function FilterRangeAndButtons(
  props: { idPrefix: string; from?: string; to?: string; clearHref: string },
) {
  const { idPrefix: p } = props;
  return (
    <>
      <div class="field">
        <label for={`${p}-from`}>From (UTC)</label>
        <input
          id={`${p}-from`}
          type="datetime-local"
          name="from"
          value={props.from}
        />
      </div>
      <div class="field">
        <label for={`${p}-to`}>To (UTC)</label>
        <input
          id={`${p}-to`}
          type="datetime-local"
          name="to"
          value={props.to}
        />
      </div>
      <div class="field" style="flex:0">
        <button type="submit" class="primary">Filter</button>
      </div>
      <div class="field" style="flex:0">
        <a class="btn" href={props.clearHref}>Clear</a>
      </div>
    </>
  );
}
