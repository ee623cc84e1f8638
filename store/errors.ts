/**
 * Errors the service layer throws. Routes render them in one place: portal
 * pages as readable messages, the admin API as JSON with the right status.
 */

/** Base class: an error with an HTTP status and a message safe to show. */
export class ServiceError extends Error {
  readonly status: number;
  readonly code: string;
  readonly field?: string;
  constructor(status: number, code: string, message: string, field?: string) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

/** 400: the input is invalid; `field` names the field at fault. */
export class ValidationError extends ServiceError {
  readonly issues: { field: string; message: string }[];
  constructor(
    message: string,
    field?: string,
    issues?: { field: string; message: string }[],
  ) {
    super(400, "invalid_request", message, field);
    this.issues = issues ?? (field ? [{ field, message }] : []);
  }
}

/** 401: no valid credentials. */
export class UnauthorizedError extends ServiceError {
  constructor(message = "Sign in required") {
    super(401, "unauthorized", message);
  }
}

/** 403: authenticated but not allowed. */
export class ForbiddenError extends ServiceError {
  constructor(message = "You are not allowed to do this") {
    super(403, "forbidden", message);
  }
}

/** 404: missing, or belongs to a tenant the caller cannot see. */
export class NotFoundError extends ServiceError {
  constructor(what = "Object") {
    super(404, "not_found", `${what} not found`);
  }
}

/** 409: a uniqueness check or a concurrent write lost. */
export class ConflictError extends ServiceError {
  constructor(message: string, field?: string) {
    super(409, "conflict", message, field);
  }
}

/** 429: too many attempts; `retryAfter` in seconds. */
export class TooManyRequestsError extends ServiceError {
  readonly retryAfter: number;
  constructor(message: string, retryAfter: number) {
    super(429, "too_many_requests", message);
    this.retryAfter = retryAfter;
  }
}
