import { useSignal } from "@preact/signals";

/** Props of ConfirmSubmit. */
export interface ConfirmSubmitProps {
  label: string;
  confirmLabel: string;
  question: string;
  /** Marks the first button (`data-action`), for tests and styling. */
  action?: string;
}

/**
 * A destructive submit button that asks once more inline before submitting
 * its form; the confirming button sends `confirm=1`. Without JavaScript (or
 * before it loads) it is a plain submit button without `confirm`, and the
 * server asks on a page of its own (routes/_confirm.tsx) instead of acting.
 */
export default function ConfirmSubmit(props: ConfirmSubmitProps) {
  const asking = useSignal(false);
  if (!asking.value) {
    return (
      <button
        type="submit"
        class="small danger"
        data-action={props.action}
        onClick={(e) => {
          e.preventDefault();
          asking.value = true;
        }}
      >
        {props.label}
      </button>
    );
  }
  return (
    <span class="row" style="gap:6px;align-items:center">
      <span class="muted">{props.question}</span>
      <button type="submit" class="small danger" name="confirm" value="1">
        {props.confirmLabel}
      </button>
      <button
        type="button"
        class="small"
        onClick={() => (asking.value = false)}
      >
        Cancel
      </button>
    </span>
  );
}
