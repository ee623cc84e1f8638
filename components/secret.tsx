/** A secret shown once (API key, admin token, webhook signing secret) with a copy button. */
import CopyButton from "../islands/CopyButton.tsx";
import { Island } from "./Island.tsx";

/** The secret in a `code.secret` (`#secret-value`, which the copy button selects when the clipboard is refused) and its copy button. */
export function SecretValue(
  props: { value: string; testid: string; label: string },
) {
  return (
    <div class="row" style="align-items:center">
      <code class="secret" id="secret-value" data-testid={props.testid}>
        {props.value}
      </code>
      <Island
        name="CopyButton"
        component={CopyButton}
        props={{ text: props.value, label: props.label }}
      />
    </div>
  );
}
