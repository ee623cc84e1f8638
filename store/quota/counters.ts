/**
 * Quota counters. Each window of a subject has two: `A` (admitted, only
 * ever `set` by admission under a `check`) and `R` (released, only ever
 * increased by blind `sum`s when a reservation settles, and only while its
 * window runs). Usage = A − R. Settlement never conflicts with admission,
 * and admission needs no read on the hot path: A's value and versionstamp
 * are cached from this process's own commits (a stale entry fails its
 * `check` and is re-read), and R may be read stale because it only grows
 * (stale R over-counts usage: conservative), re-read before refusing.
 */
import { k } from "../kv_keys.ts";
import type { Store } from "../store.ts";
import {
  QuotaUnavailableError,
  type QuotaView,
  type Rule,
  type RuleKind,
} from "./types.ts";
import { TIDY_AFTER_MS } from "./tidy.ts";
import { DAY, isTokenRule, windowEnd } from "./windows.ts";

/** One quota counter (a window of a subject) as seen by one commit attempt. */
export interface Counter {
  /** `subject\0window`: the cache key. */
  id: string;
  kind: RuleKind;
  key: Deno.KvKey;
  relKey: Deno.KvKey;
  /** When the window ends (epoch ms). */
  end: number;
  /** Admitted (A) and its versionstamp (null: absent). */
  value: number;
  versionstamp: string | null;
  /** Released (R), as last seen: only ever too low, which over-counts usage. */
  released: number;
  /** Added by the requests decided so far in this attempt. */
  added: number;
}

/**
 * A counter of `subject`'s `window` (of a rule of `kind`, ending at `end`)
 * for a commit attempt: A not known yet, R as this process last saw it.
 */
export function newCounter(
  subject: string,
  kind: RuleKind,
  window: string,
  end: number,
  cache: CounterCache,
): Counter {
  const id = `${subject}\u0000${window}`;
  return {
    id,
    kind,
    key: k.quotaCounter(subject, window),
    relKey: k.quotaCounter(subject, rel(window)),
    end,
    value: 0,
    versionstamp: null,
    released: cache.released(id) ?? 0,
    added: 0,
  };
}

/**
 * How long a counter's new value lives: a minute's as long as its release
 * counter (see TIDY_AFTER_MS), a day's or month's a day past its window,
 * concurrency's for ever.
 */
export function counterExpiry(c: Counter, now: number): number | undefined {
  if (c.kind === "concurrency") return undefined;
  return c.end - now +
    (c.kind === "rpm" || c.kind === "tpm" ? TIDY_AFTER_MS : DAY);
}

/** Reads the release counters of `cs` fresh (before a refusal), into them and the cache. */
export async function readReleased(
  kv: Deno.Kv,
  cache: CounterCache,
  cs: Counter[],
): Promise<void> {
  if (cs.length === 0) return;
  const read = await getManyChunked(kv, cs.map((c) => c.relKey));
  cs.forEach((c, i) => {
    c.released = Math.max(c.released, u64(read[i]!.value));
    cache.setReleased(c.id, c.released);
  });
}

/** A counter's usage as decided so far: admitted − released + added. */
export const used = (c: Counter) => c.value - c.released + c.added;

/** The release counter's window name for an admission window. */
export const rel = (window: string) => `${window}:r`;

/** A KV counter's value (0 when absent). */
export function u64(v: unknown): number {
  return v instanceof Deno.KvU64 ? Number(v.value) : 0;
}

/** Reads many keys, ten to a `getMany` (its limit), in parallel. */
export const getManyChunked = async (
  kv: Deno.Kv,
  keys: Deno.KvKey[],
): Promise<Deno.KvEntryMaybe<unknown>[]> => {
  const parts: Promise<Deno.KvEntryMaybe<unknown>[]>[] = [];
  for (let i = 0; i < keys.length; i += 10) {
    parts.push(kv.getMany(keys.slice(i, i + 10)));
  }
  return (await Promise.all(parts)).flat();
};

/** The view for headers: the tightest request and token windows of `rules`. */
export function viewOf(rules: Rule[], cs: Counter[], now: number): QuotaView {
  const view: QuotaView = { requests: null, tokens: null };
  const rank: Record<RuleKind, number> = {
    tpm: 0,
    day: 1,
    month: 2,
    rpm: 0,
    concurrency: 9,
    spend: 9,
  };
  let tokenRank = 9;
  for (let i = 0; i < rules.length; i++) {
    const r = rules[i]!;
    const v = {
      limit: r.limit,
      remaining: Math.max(0, r.limit - used(cs[i]!)),
      resetMs: cs[i]!.end - now,
    };
    if (r.kind === "rpm") {
      if (!view.requests || v.remaining < view.requests.remaining) {
        view.requests = v;
      }
    } else if (isTokenRule(r.kind)) {
      const better = rank[r.kind] < tokenRank ||
        (rank[r.kind] === tokenRank && v.remaining < view.tokens!.remaining);
      if (better) {
        view.tokens = v;
        tokenRank = rank[r.kind];
      }
    }
  }
  return view;
}

/** Reads a window's current usage, admitted minus released (tests and the portal). */
export async function counterValue(
  store: Store,
  subject: string,
  window: string,
): Promise<number> {
  const [a, r] = await store.kv.getMany([
    k.quotaCounter(subject, window),
    k.quotaCounter(subject, rel(window)),
  ]);
  return u64(a!.value) - u64(r!.value);
}

/**
 * A release to add to one release counter: `[cacheId, key, n, end]`, `end`
 * when its window ends (Infinity for concurrency). Releases into a window
 * that has ended are dropped: nothing admits there any more, so a lease
 * that ran to its minute's end settles only its day, month and concurrency
 * counters (3 sums of 6 fewer, 1,000 times a minute with 1,000 busy keys).
 */
export type Release = [string, Deno.KvKey, number, number];

/** The releases whose window has not ended by `now`. */
export function live(rs: Release[], now: number): Release[] {
  return rs.every((r) => r[3] > now) ? rs : rs.filter((r) => r[3] > now);
}

/** Adds `n` (when positive) to the release counter of each `[subject, window]`. */
export function releaseTo(
  out: Release[],
  counters: [string, string][],
  n: number,
): void {
  if (n <= 0) return;
  for (const [s, w] of counters) {
    out.push([`${s}\u0000${w}`, k.quotaCounter(s, rel(w)), n, windowEnd(w)]);
  }
}

/**
 * This process's view of the counters, by `subject\0window`: A's value and
 * versionstamp from its own commits, and R as last read plus what it
 * released since (only ever ≤ the truth).
 */
export class CounterCache {
  readonly #admitted = new Map<
    string,
    { value: number; versionstamp: string | null }
  >();
  readonly #released = new Map<string, number>();

  /** A's value and versionstamp as this process last committed or read them. */
  admitted(
    id: string,
  ): { value: number; versionstamp: string | null } | undefined {
    return this.#admitted.get(id);
  }

  setAdmitted(
    id: string,
    c: { value: number; versionstamp: string | null },
  ): void {
    if (this.#admitted.size >= 100_000) this.#admitted.clear();
    this.#admitted.set(id, { value: c.value, versionstamp: c.versionstamp });
  }

  /** Forgets A (another instance moved it: read it again). */
  forgetAdmitted(id: string): void {
    this.#admitted.delete(id);
  }

  /** R as last seen, if known. */
  released(id: string): number | undefined {
    return this.#released.get(id);
  }

  setReleased(id: string, value: number): void {
    if (this.#released.size >= 100_000) this.#released.clear();
    this.#released.set(id, value);
  }

  /** Adds a committed release to R, when known. */
  addReleased(id: string, n: number): void {
    const v = this.#released.get(id);
    if (v !== undefined) this.#released.set(id, v + n);
  }
}

/**
 * Raises a window's usage (admitted − released) to at least `value`: a
 * limit or budget set in the middle of its window counts what was used
 * in it before (the usage rollups say how much), not zero. A window that
 * counts as much already (its requests were counted while the rule held)
 * is left as it is. The admission counter is rewritten under a check, so
 * a gateway that cached it fails its own check and reads it again.
 * Resolves whether it was raised.
 */
export async function seedCounter(
  store: Store,
  subject: string,
  window: string,
  value: number,
  now = Date.now(),
): Promise<boolean> {
  if (!(value > 0)) return false;
  const key = k.quotaCounter(subject, window);
  const relKey = k.quotaCounter(subject, rel(window));
  for (let attempt = 0; attempt < 20; attempt++) {
    const [a, r] = await store.kv.getMany([key, relKey]);
    const admitted = u64(a!.value);
    const used = admitted - u64(r!.value);
    if (used >= value) return false;
    const res = await store.kv.atomic()
      .check(a!)
      .set(key, new Deno.KvU64(BigInt(admitted + Math.round(value - used))), {
        expireIn: windowEnd(window) - now + 86_400_000,
      })
      .commit();
    if (res.ok) return true;
  }
  throw new QuotaUnavailableError(
    `Cannot start the ${window} counter from its usage: it kept changing`,
  );
}
