/**
 * Service errors in words for portal pages. The service layer names the
 * field at fault as a path (`rpm: must be 0 or more`, `scopes.1: …`,
 * `body: Password must …`), which the admin API keeps; people see the
 * field's label instead, and no path.
 */
import { ServiceError, ValidationError } from "../store/errors.ts";

/** Labels of the fields portal forms send. */
const LABELS: Record<string, string> = {
  rpm: "Requests / minute",
  tpm: "Tokens / minute",
  concurrency: "Concurrent requests",
  tokensPerDay: "Tokens / day",
  tokensPerMonth: "Tokens / month",
  name: "Name",
  slug: "Slug",
  email: "Email",
  role: "Role",
  status: "Status",
  scopes: "Scopes",
  models: "Models",
  expiresAt: "Expires",
  limits: "Limits",
  month: "Month",
  uses: "Uses",
  ttlSeconds: "Valid for",
  password: "Password",
  tenantId: "Tenant",
};

/** Words a message starts with when it needs its field's name in front. */
const PREDICATE =
  /^(must|is|are|should|cannot|at (least|most)|expected|too|invalid|not)\b/i;

function labelOf(path: string, labels: Record<string, string>): string {
  const parts = path.split(".");
  const named = [...parts].reverse().find((p) => !/^\d+$/.test(p)) ?? "";
  const label = labels[named] ?? LABELS[named] ??
    named.replace(/([a-z])([A-Z])/g, "$1 $2").replace(
      /^./,
      (ch) => ch.toUpperCase(),
    );
  const index = parts.find((p) => /^\d+$/.test(p));
  return index === undefined ? label : `${label} (item ${Number(index) + 1})`;
}

/** One issue in words: the message, led by its field's label when it needs one. */
export function readableIssue(
  field: string,
  message: string,
  labels: Record<string, string> = {},
): string {
  const text = message.startsWith(`${field}: `)
    ? message.slice(field.length + 2)
    : message;
  if (!field || field === "body") return capitalise(text);
  if (!PREDICATE.test(text)) return capitalise(text);
  const label = labelOf(field, labels);
  return /^(must|is|are|should|cannot)\b/.test(text)
    ? `${label} ${text}`
    : `${label}: ${text}`;
}

function capitalise(s: string): string {
  return s.replace(/^./, (ch) => ch.toUpperCase());
}

/** A service error's message for a portal page (no field paths). */
export function portalMessage(
  err: ServiceError,
  labels: Record<string, string> = {},
): string {
  if (err instanceof ValidationError && err.field) {
    const first = err.issues[0];
    const field = first?.field ?? err.field;
    const message = err.message.startsWith(`${field}: `)
      ? err.message
      : first?.message ?? err.message;
    return readableIssue(field, message, labels);
  }
  return err.message.replace(/^body: /, "");
}
