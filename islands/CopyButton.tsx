import { useSignal } from "@preact/signals";

/** Props of CopyButton. */
export interface CopyButtonProps {
  text: string;
  label?: string;
}

/** Copies `text` to the clipboard and confirms it. */
export default function CopyButton(props: CopyButtonProps) {
  const copied = useSignal(false);
  async function copy() {
    try {
      await navigator.clipboard.writeText(props.text);
      copied.value = true;
    } catch {
      const range = document.createRange();
      const el = document.getElementById("secret-value");
      if (el) {
        range.selectNodeContents(el);
        getSelection()?.removeAllRanges();
        getSelection()?.addRange(range);
      }
    }
  }
  return (
    <button type="button" class="small" onClick={copy} data-testid="copy">
      {copied.value ? "Copied ✓" : props.label ?? "Copy"}
    </button>
  );
}
