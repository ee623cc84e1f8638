import { useSignal } from "@preact/signals";

/** Props of ConfirmSubmit. */
export interface ConfirmSubmitProps {
  label: string;
  confirmLabel: string;
  question: string;
}

/**
 * A destructive submit button that asks once more inline before submitting
 * its form. Without JavaScript it is a plain submit button.
 */
export default function ConfirmSubmit(props: ConfirmSubmitProps) {
  const asking = useSignal(false);
  if (!asking.value) {
    return (
      <button
        type="submit"
        class="small danger"
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
      <button type="submit" class="small danger">{props.confirmLabel}</button>
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
