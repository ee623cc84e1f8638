/**
 * When a listed model that did not answer its probe is probed again. Exo
 * lists every model card it knows, downloaded or not, so a model that fails
 * is probed once, then after 30 s, 1 min, 2 min … up to 10 min between
 * probes, and again at once when its listing changes (it left the list and
 * came back, or its entry says something new) or when a probe succeeds.
 */

/** Options of {@linkcode ProbeBackoff}. */
export interface ProbeBackoffOptions {
  /** Wait after the first failed probe (default 30 s); doubles after each failure. */
  initialMs?: number;
  /** Longest wait between probes (default 10 min). */
  maxMs?: number;
  /** The clock (tests inject one). */
  now?: () => number;
}

interface Failing {
  /** The model's listing when it failed (see {@linkcode listingSignature}). */
  listing: string;
  failures: number;
  nextAt: number;
}

/** The backoff of each listed model whose probe failed. */
export class ProbeBackoff {
  readonly initialMs: number;
  readonly maxMs: number;
  readonly #now: () => number;
  readonly #failing = new Map<string, Failing>();

  constructor(opts: ProbeBackoffOptions = {}) {
    this.initialMs = opts.initialMs ?? 30_000;
    this.maxMs = opts.maxMs ?? 600_000;
    this.#now = opts.now ?? Date.now;
    if (!(this.initialMs > 0) || !(this.maxMs >= this.initialMs)) {
      throw new RangeError(
        `Cannot create probe backoff: initialMs must be > 0 and maxMs ≥ initialMs: current values are ${this.initialMs}, ${this.maxMs}`,
      );
    }
  }

  /** Whether `id`, listed as `listing`, is due a probe (never probed, listing changed, or its wait is over). */
  due(id: string, listing: string): boolean {
    const f = this.#failing.get(id);
    if (!f || f.listing !== listing) return true;
    return this.#now() >= f.nextAt;
  }

  /** Records a failed probe; returns how many in a row have failed. */
  failed(id: string, listing: string): number {
    const f = this.#failing.get(id);
    const failures = f && f.listing === listing ? f.failures + 1 : 1;
    const wait = Math.min(this.maxMs, this.initialMs * 2 ** (failures - 1));
    this.#failing.set(id, { listing, failures, nextAt: this.#now() + wait });
    return failures;
  }

  /** Records a successful probe: the model starts afresh. */
  succeeded(id: string): void {
    this.#failing.delete(id);
  }

  /** Whether `id`'s last probe failed. */
  failing(id: string): boolean {
    return this.#failing.has(id);
  }

  /** When `id` is probed next (ms on the clock), or null when it is not failing. */
  nextProbeAt(id: string): number | null {
    return this.#failing.get(id)?.nextAt ?? null;
  }

  /** Forgets the models no longer listed (a model that comes back is probed at once). */
  retain(listed: ReadonlySet<string>): void {
    for (const id of this.#failing.keys()) {
      if (!listed.has(id)) this.#failing.delete(id);
    }
  }
}

/**
 * What identifies a model's entry in `GET /v1/models` across listings: the
 * entry without `created` (mlx_lm.server and llama-server stamp it with the
 * time of each call), keys sorted.
 */
export function listingSignature(entry: Record<string, unknown>): string {
  const { created: _created, ...rest } = entry;
  return stable(rest, 0);
}

function stable(v: unknown, depth: number): string {
  if (v === null || typeof v !== "object" || depth > 8) {
    return JSON.stringify(v) ?? "null";
  }
  if (Array.isArray(v)) return `[${v.map((x) => stable(x, depth + 1))}]`;
  const o = v as Record<string, unknown>;
  return `{${
    Object.keys(o).sort().map((k) =>
      `${JSON.stringify(k)}:${stable(o[k], depth + 1)}`
    )
  }}`;
}
