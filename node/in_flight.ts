/**
 * The generation requests a node is serving, so that each one's engine work
 * stops when it is no longer wanted. An engine gets one signal per request,
 * aborted by whichever comes first:
 *
 * - the gateway's connection closes (the request's own signal). Deno's
 *   server misses that while the handler has not returned its Response yet
 *   (measured with Deno 2.9.6: for a gateway call, ~400 B of headers with
 *   its JWT, the close went unnoticed for every body from 50 B to 100 KB),
 *   which is the whole generation of a non-stream request and the wait for
 *   an upstream's response headers, hence:
 * - the gateway cancels it by id (`DELETE /orchard/requests/{x-request-id}`),
 *   which it does for every call it gives up before the node finished;
 * - the node's response body is cancelled (its reader went away).
 */

/** One request being served. */
export interface InFlightRequest {
  /** What the engine gets: aborted when the request is no longer wanted. */
  readonly signal: AbortSignal;
  /** Aborts the engine's work (idempotent). */
  cancel(reason?: unknown): void;
  /** Stops tracking it once its response is done (idempotent). */
  end(): void;
}

/** Why a request's work was cancelled without the gateway saying more. */
const CANCELLED = new DOMException("The request was cancelled", "AbortError");

/** Requests in progress, by the gateway's request id. */
export class InFlight {
  readonly #byId = new Map<string, AbortController>();

  /** Starts tracking a request (`id`: its `x-request-id`, if any) whose connection's signal is `signal`. */
  begin(id: string | null, signal: AbortSignal): InFlightRequest {
    const ac = new AbortController();
    const onClose = () => ac.abort(signal.reason);
    if (signal.aborted) onClose();
    else signal.addEventListener("abort", onClose, { once: true });
    if (id) this.#byId.set(id, ac); // ids are unique per gateway call
    let ended = false;
    return {
      signal: ac.signal,
      cancel: (reason = CANCELLED) => {
        if (!ac.signal.aborted) ac.abort(reason);
      },
      end: () => {
        if (ended) return;
        ended = true;
        signal.removeEventListener("abort", onClose);
        if (id && this.#byId.get(id) === ac) this.#byId.delete(id);
      },
    };
  }

  /** Cancels the request with this id; whether one was running. */
  cancel(id: string): boolean {
    const ac = this.#byId.get(id);
    ac?.abort(CANCELLED);
    return ac !== undefined;
  }
}
