import { useEffect, useRef } from "preact/hooks";

/** How long a sent form ignores further submits (then it may be sent again). */
const HOLD_MS = 10_000;

/**
 * Rendered (hidden) inside every PostForm: once the form is submitted, a
 * second submit (a double click, Enter pressed twice) is ignored while the
 * first is on its way, so the browser does not abandon the first answer,
 * which may carry a secret shown once. The server ignores repeats anyway
 * (the form's `_once` token); this keeps the first answer on screen.
 */
export default function FormGuard() {
  const ref = useRef<HTMLSpanElement>(null);
  useEffect(() => {
    const form = ref.current?.closest("form");
    if (!form) return;
    let sentAt = 0;
    const onSubmit = (e: SubmitEvent) => {
      if (e.defaultPrevented) return;
      if (Date.now() - sentAt < HOLD_MS) {
        e.preventDefault();
        return;
      }
      sentAt = Date.now();
      form.classList.add("sending");
    };
    // back/forward cache: the page is shown again, the form may be sent again
    const onShow = () => {
      sentAt = 0;
      form.classList.remove("sending");
    };
    form.addEventListener("submit", onSubmit);
    addEventListener("pageshow", onShow);
    return () => {
      form.removeEventListener("submit", onSubmit);
      removeEventListener("pageshow", onShow);
    };
  }, []);
  return <span ref={ref} hidden data-guard="" />;
}
