/**
 * OpenAI-shaped errors, shared by the gateway and the node API.
 *
 * Every `/v1/*` failure is `{"error":{"message","type","param","code"}}` with
 * `code` a string or null; this module is the one place that shape is built.
 */
import { sseFrame } from "../../lib/sse.ts";

/** The `type` values OpenAI clients recognise. */
export type OpenAIErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "permission_error"
  | "not_found_error"
  | "rate_limit_error"
  | "insufficient_quota"
  | "server_error"
  | "api_error";

/** The JSON body of an OpenAI error. */
export interface OpenAIErrorBody {
  error: {
    message: string;
    type: OpenAIErrorType;
    param: string | null;
    code: string | null;
  };
}

const DEFAULT_TYPE: Record<number, OpenAIErrorType> = {
  400: "invalid_request_error",
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  409: "invalid_request_error",
  413: "invalid_request_error",
  415: "invalid_request_error",
  422: "invalid_request_error",
  429: "rate_limit_error",
};

/** An error that renders as an OpenAI error response. */
export class OpenAIError extends Error {
  readonly status: number;
  readonly type: OpenAIErrorType;
  readonly code: string | null;
  readonly param: string | null;
  readonly headers: Record<string, string>;

  constructor(
    status: number,
    code: string | null,
    message: string,
    opts: {
      type?: OpenAIErrorType;
      param?: string | null;
      headers?: Record<string, string>;
    } = {},
  ) {
    super(message);
    this.name = "OpenAIError";
    this.status = status;
    this.code = code;
    this.param = opts.param ?? null;
    this.type = opts.type ?? DEFAULT_TYPE[status] ??
      (status >= 500 ? "server_error" : "invalid_request_error");
    this.headers = opts.headers ?? {};
  }

  /** The JSON body for this error. */
  toJSON(): OpenAIErrorBody {
    return {
      error: {
        message: this.message,
        type: this.type,
        param: this.param,
        code: this.code,
      },
    };
  }

  /** A complete `Response` with status, JSON body and extra headers. */
  toResponse(extraHeaders: Record<string, string> = {}): Response {
    return new Response(JSON.stringify(this.toJSON()), {
      status: this.status,
      headers: {
        "content-type": "application/json",
        ...this.headers,
        ...extraHeaders,
      },
    });
  }

  /** The terminal SSE frame for an error after the first byte. */
  toSSE(): string {
    return sseFrame(this.toJSON());
  }
}

/**
 * A 400 `context_length_exceeded` in OpenAI's words, carrying the numbers
 * as fields: the prompt's tokens, the model's context, and the completion
 * tokens asked for when those made it too long (null when the prompt alone
 * is). They also travel as `x-orchard-*` headers, which is how a node's
 * refusal reaches the gateway's error mapping (gateway/upstream.ts
 * `nodeError`) with its numbers intact.
 */
export class ContextLengthError extends OpenAIError {
  constructor(
    readonly promptTokens: number,
    readonly contextLength: number,
    readonly completionTokens: number | null = null,
    param: string | null = "messages",
  ) {
    super(
      400,
      "context_length_exceeded",
      completionTokens === null
        ? `This model's maximum context length is ${contextLength} tokens. However, your messages resulted in ${promptTokens} tokens. Please reduce the length of the messages.`
        : `This model's maximum context length is ${contextLength} tokens. However, you requested ${
          promptTokens + completionTokens
        } tokens (${promptTokens} in the messages, ${completionTokens} in the completion). Please reduce the length of the messages or completion.`,
      {
        param,
        headers: {
          "x-orchard-prompt-tokens": String(promptTokens),
          "x-orchard-context-length": String(contextLength),
          ...(completionTokens === null ? {} : {
            "x-orchard-completion-tokens": String(completionTokens),
          }),
        },
      },
    );
  }

  /** The error a response's headers describe, or null when they carry no numbers. */
  static fromHeaders(
    headers: { get(name: string): string | null },
    param: string | null,
  ): ContextLengthError | null {
    const n = (h: string) => {
      const v = headers.get(h);
      return v !== null && /^\d{1,9}$/.test(v) ? Number(v) : null;
    };
    const prompt = n("x-orchard-prompt-tokens");
    const ctx = n("x-orchard-context-length");
    if (prompt === null || ctx === null) return null;
    return new ContextLengthError(
      prompt,
      ctx,
      n("x-orchard-completion-tokens"),
      param,
    );
  }
}

/** Shorthand: an OpenAI error response. */
export function openAIErrorResponse(
  status: number,
  code: string | null,
  message: string,
  opts?: ConstructorParameters<typeof OpenAIError>[3],
): Response {
  return new OpenAIError(status, code, message, opts).toResponse();
}

/** A 400 for a malformed request field, naming its path (`tools[0].function.name`). */
export function invalidParam(
  param: string,
  message: string,
  code = "invalid_value",
): OpenAIError {
  return new OpenAIError(400, code, message, { param });
}

/**
 * A 400 `unsupported_parameter` for a field that cannot be honoured: the
 * product never answers 200 to what was ignored.
 */
export function unsupportedParam(param: string, message: string): OpenAIError {
  return new OpenAIError(400, "unsupported_parameter", message, { param });
}
