/**
 * Destructive form posts (drain, remove, suspend, revoke, disable) act only
 * with `confirm=1`, which the ConfirmSubmit island's second button sends.
 * A post without it (no JavaScript yet, or a hand-made form) gets this page
 * asking once more, with the same fields, instead of acting on one click.
 */
import type { Context } from "hono";
import { Alert, Card, PostForm } from "../components/ui.tsx";
import type { PortalEnv } from "./_env.ts";
import { page, str } from "./_page.tsx";

/** Whether the post carries the confirmation. */
export async function confirmed(c: Context<PortalEnv>): Promise<boolean> {
  return str((await c.req.parseBody()).confirm) === "1";
}

/** The page asking to confirm a destructive post. */
export function confirmPage(
  c: Context<PortalEnv>,
  opts: {
    title: string;
    question: string;
    confirmLabel: string;
    action: string;
    /** Where "Cancel" goes (the page the form was on). */
    back: string;
    active: string;
    fields?: Record<string, string>;
  },
): Response {
  return page(
    c,
    opts.title,
    opts.active,
    <>
      <h1>{opts.title}</h1>
      <Card>
        <Alert tone="warn">{opts.question}</Alert>
        <PostForm
          action={opts.action}
          csrf={c.get("csrf")}
          class="row"
          data-testid="confirm-form"
        >
          {Object.entries(opts.fields ?? {}).map(([name, value]) => (
            <input key={name} type="hidden" name={name} value={value} />
          ))}
          <input type="hidden" name="confirm" value="1" />
          <button type="submit" class="danger">{opts.confirmLabel}</button>
          <a class="btn" href={opts.back}>Cancel</a>
        </PostForm>
      </Card>
    </>,
  );
}
