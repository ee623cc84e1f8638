/**
 * The rule table behind GbnfBuilder: unique deterministic names, shared
 * primitives, size limits, repetitions within llama.cpp's parser limits and
 * the final grammar text; and the converter's error type.
 */
import { MAX_REPEAT, PRIMITIVES } from "./_gbnf_rules.ts";

/**
 * A schema the converter cannot turn into a grammar; `path` is a JSON
 * pointer-ish path like "properties.foo.pattern" ("" = the schema itself),
 * the message says why (without the path).
 */
export class SchemaError extends Error {
  constructor(message: string, readonly path: string) {
    super(message);
    this.name = "SchemaError";
  }
}

/** Limits that keep grammars small enough to parse and sample quickly. */
export const GBNF_LIMITS = {
  rules: 2000,
  depth: 32,
  /** Largest minLength/minItems; larger maxLength/maxItems are lowered to it. */
  count: 100_000,
  /** Rules llama.cpp creates for `{m,n}` repetitions, summed over the grammar. */
  expansion: 100_000,
} as const;

/** A schema object. */
export type Obj = Record<string, unknown>;

export const isObj = (v: unknown): v is Obj =>
  typeof v === "object" && v !== null && !Array.isArray(v);

/** `path` extended by one key ("properties.foo"). */
export const at = (path: string, key: string | number): string =>
  path ? `${path}.${key}` : String(key);

/** A SchemaError at `path`; the message says what, the caller says where. */
export function fail(path: string, message: string): SchemaError {
  return new SchemaError(message, path);
}

type Saved = [Map<string, string | null>, number];

/** Rule names and bodies in insertion order; `null` marks a name reserved for a $ref. */
export class RuleTable {
  #rules = new Map<string, string | null>();
  #expansion = 0;

  save(): Saved {
    return [new Map(this.#rules), this.#expansion];
  }

  restore([rules, expansion]: Saved) {
    this.#rules = rules;
    this.#expansion = expansion;
  }

  get size(): number {
    return this.#rules.size;
  }

  /** Adds a rule or finds an identical one; a clash of names appends -2, -3, … */
  add(name: string, body: string, path: string): string {
    return this.#claim(name, body, path);
  }

  /** Claims a name to be defined later (a $ref's rule, used before its body exists). */
  reserve(name: string, path: string): string {
    return this.#claim(name, null, path);
  }

  define(name: string, body: string, path: string) {
    this.#count(body, path);
    this.#rules.set(name, body);
  }

  /** Moves the body of `from` into the reserved `to` if `from` was added at or after position `mark`. */
  absorb(from: string, to: string, mark: number, path: string): boolean {
    if ([...this.#rules.keys()].indexOf(from) < mark) return false;
    const body = this.#rules.get(from)!;
    this.#rules.delete(from);
    this.#expansion -= expansionOf(body);
    this.define(to, body, path);
    return true;
  }

  /** A shared rule of PRIMITIVES, added with what it uses. */
  prim(name: string): string {
    if (this.#rules.has(name)) return name;
    const p = PRIMITIVES[name]!;
    this.add(name, p.body, "");
    for (const dep of p.deps) this.prim(dep);
    return name;
  }

  /**
   * `item` (a rule name or terminal) repeated min..max times (max may be
   * Infinity). Counts above MAX_REPEAT are built from chunk rules.
   */
  repeat(
    item: string,
    min: number,
    max: number,
    name: string,
    path: string,
  ): string {
    const C = MAX_REPEAT;
    const simple = (a: number, b: number) =>
      b === Infinity
        ? `${item}${a === 0 ? "*" : a === 1 ? "+" : `{${a},}`}`
        : b === a
        ? (a === 0 ? "" : a === 1 ? item : `${item}{${a}}`)
        : a === 0 && b === 1
        ? `${item}?`
        : `${item}{${a},${b}}`;
    if (min <= C && (max <= C || max === Infinity)) return simple(min, max);
    const full = () => this.add(`${name}-${C}`, `${item}{${C}}`, path);
    const parts = min > C
      ? [`${full()}{${Math.floor(min / C)}}`, simple(min % C, min % C)]
      : [simple(min, min)];
    const d = max - min;
    if (d === Infinity || d <= C) parts.push(simple(0, d));
    else {
      // up to j*C + r = fewer than C, or C then up to (j-1)*C + r
      const below = this.add(`${name}-below-${C}`, `${item}{0,${C - 1}}`, path);
      let upTo = simple(0, d % C);
      for (let j = 1; j <= Math.floor(d / C); j++) {
        upTo = this.add(
          `${name}-upto-${j * C + (d % C)}`,
          `${below} | ${full()} ${upTo}`.trim(),
          path,
        );
      }
      parts.push(upTo);
    }
    return parts.filter(Boolean).join(" ");
  }

  /** The grammar text; adds primitives that bodies use, throws on rules used but never defined. */
  build(rootBody: string): string {
    const all = () =>
      [["root", rootBody], ...this.#rules] as [string, string | null][];
    for (const [, body] of all()) {
      for (const ref of references(body ?? "")) {
        if (!this.#rules.has(ref) && Object.hasOwn(PRIMITIVES, ref)) {
          this.prim(ref);
        }
      }
    }
    const lines: string[] = [];
    for (const [name, body] of all()) {
      const missing = references(body ?? "").find((r) =>
        r !== "root" && !this.#rules.has(r)
      );
      if (missing) {
        throw new Error(
          `Cannot build grammar: rule ${missing} (used by ${name}) is not defined`,
        );
      }
      lines.push(`${name} ::= ${body}`);
    }
    return lines.join("\n") + "\n";
  }

  #claim(name: string, body: string | null, path: string): string {
    const base = name.replace(/[^a-zA-Z0-9-]+/g, "-").replace(/^-+|-+$/g, "") ||
      "rule";
    for (let i = 1;; i++) {
      const n = i === 1 ? base : `${base}-${i}`;
      const cur = this.#rules.get(n);
      if (body !== null && cur === body) return n;
      const primitive = Object.hasOwn(PRIMITIVES, n) &&
        PRIMITIVES[n]!.body !== body;
      if (cur !== undefined || n === "root" || primitive) continue;
      if (this.#rules.size >= GBNF_LIMITS.rules) {
        throw fail(
          path,
          `the grammar would need more than ${GBNF_LIMITS.rules} rules`,
        );
      }
      if (body !== null) this.#count(body, path);
      this.#rules.set(n, body);
      return n;
    }
  }

  #count(body: string, path: string) {
    this.#expansion += expansionOf(body);
    if (this.#expansion > GBNF_LIMITS.expansion) {
      throw fail(
        path,
        `the grammar's repetitions would expand to more than ${GBNF_LIMITS.expansion} rules`,
      );
    }
  }
}

/** Roughly how many rules llama.cpp creates for the repetitions in `body`. */
function expansionOf(body: string): number {
  let n = 0;
  for (const m of body.matchAll(/\{(\d+)(?:,(\d*))?\}/g)) {
    n += m[2] === undefined ? 1 : m[2] === "" ? Number(m[1]) + 1 : Number(m[2]);
  }
  return n;
}

/** Rule names a body refers to (literals, classes and counts skipped). */
function references(body: string): string[] {
  const bare = body.replace(
    /"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{[\d,]*\}/g,
    " ",
  );
  return (bare.match(/[a-zA-Z0-9-]+/g) ?? []).filter((n) => !/^\d+$/.test(n));
}
