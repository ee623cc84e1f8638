/**
 * GBNF building blocks for json_schema_grammar.ts: literal and character
 * class escaping, code point sets, the shared primitive rules, and exact
 * integer and decimal ranges. Pure functions; the builder owns rule names.
 */

/** A closed code point range. */
export type Range = readonly [number, number];

/**
 * The most repetitions one `x{m,n}` may ask of llama.cpp: its parser refuses
 * 2,000 and reads any larger maximum as unbounded, so larger counts are
 * composed from chunks of this size.
 */
export const MAX_REPEAT = 1000;

/** Largest magnitude of a generated integer or integral part: 16 digits, like llama.cpp. */
export const DIGITS_LIMIT = 10n ** 16n - 1n;

/** Code points a JSON string may hold unescaped (surrogates excluded: UTF-8 cannot carry them). */
export const JSON_RAW: Range[] = [
  [0x20, 0x21],
  [0x23, 0x5b],
  [0x5d, 0x7e],
  [0x80, 0xd7ff],
  [0xe000, 0x10ffff],
];

/** Shared rules, by name; bodies refer to their dependencies by these names. */
export const PRIMITIVES: Record<string, { body: string; deps: string[] }> = {
  space: { body: `| " " | "\\n" [ \\t]{0,20}`, deps: [] },
  // one code point each: \u escapes of surrogates are excluded, so
  // minLength/maxLength count what a validator counts
  char: {
    body: `${charClass(JSON_RAW)} | "\\\\" ` +
      `(["\\\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))`,
    deps: [],
  },
  string: { body: `"\\"" char* "\\""`, deps: ["char"] },
  boolean: { body: `"true" | "false"`, deps: [] },
  null: { body: `"null"`, deps: [] },
  integer: { body: `"-"? ("0" | [1-9] [0-9]{0,15})`, deps: [] },
  // the exponent keeps two digits so that every number stays finite in a double
  number: {
    body:
      `"-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?`,
    deps: [],
  },
  value: {
    body: "object | array | string | number | boolean | null",
    deps: ["object", "array", "string", "number", "boolean", "null"],
  },
  object: {
    body:
      `"{" space (string space ":" space value ("," space string space ":" space value)*)? space "}"`,
    deps: ["space", "string", "value"],
  },
  array: {
    body: `"[" space (value ("," space value)*)? space "]"`,
    deps: ["space", "value"],
  },
  date: {
    body:
      `[0-9]{4} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ` +
      `("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | ` +
      `"02-" ("0" [1-9] | "1" [0-9] | "2" [0-8]))`,
    deps: [],
  },
  time: {
    body:
      `([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ` +
      `("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])`,
    deps: [],
  },
  "date-time": { body: `date "T" time`, deps: ["date", "time"] },
  uuid: {
    body:
      `[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}`,
    deps: [],
  },
  "date-string": { body: `"\\"" date "\\""`, deps: ["date"] },
  "time-string": { body: `"\\"" time "\\""`, deps: ["time"] },
  "date-time-string": { body: `"\\"" date-time "\\""`, deps: ["date-time"] },
  "uuid-string": { body: `"\\"" uuid "\\""`, deps: ["uuid"] },
};

/** A GBNF string literal matching `text` exactly. */
export function gbnfLiteral(text: string): string {
  let out = '"';
  for (const ch of text) {
    const cp = ch.codePointAt(0)!;
    if (ch === '"' || ch === "\\") out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (cp < 0x20 || cp === 0x7f) out += hexEscape(cp);
    else out += ch;
  }
  return out + '"';
}

/** A GBNF character class matching the code points in `ranges`. */
export function charClass(ranges: readonly Range[]): string {
  const one = (cp: number) =>
    /[A-Za-z0-9 !#$%&'()*+,./:;<=>?@_`{|}~]/.test(String.fromCodePoint(cp))
      ? String.fromCodePoint(cp)
      : hexEscape(cp);
  return "[" +
    ranges.map(([a, b]) => a === b ? one(a) : `${one(a)}-${one(b)}`).join("") +
    "]";
}

function hexEscape(cp: number): string {
  const hex = cp.toString(16).toUpperCase();
  if (cp < 0x100) return "\\x" + hex.padStart(2, "0");
  if (cp < 0x10000) return "\\u" + hex.padStart(4, "0");
  return "\\U" + hex.padStart(8, "0");
}

/** Sorts and merges ranges. */
export function normalize(ranges: readonly Range[]): Range[] {
  const sorted = [...ranges].sort((x, y) => x[0] - y[0]);
  const out: [number, number][] = [];
  for (const [a, b] of sorted) {
    const last = out[out.length - 1];
    if (last && a <= last[1] + 1) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

/** All code points not in `ranges`. */
export function negate(ranges: readonly Range[]): Range[] {
  const out: Range[] = [];
  let next = 0;
  for (const [a, b] of normalize(ranges)) {
    if (a > next) out.push([next, a - 1]);
    next = b + 1;
  }
  if (next <= 0x10ffff) out.push([next, 0x10ffff]);
  return out;
}

/** Code points in both `a` and `b`. */
export function intersect(a: readonly Range[], b: readonly Range[]): Range[] {
  const out: Range[] = [];
  for (const [x0, x1] of normalize(a)) {
    for (const [y0, y1] of normalize(b)) {
      const lo = Math.max(x0, y0), hi = Math.min(x1, y1);
      if (lo <= hi) out.push([lo, hi]);
    }
  }
  return out;
}

/** Whether `cp` lies in one of `ranges`. */
export function contains(ranges: readonly Range[], cp: number): boolean {
  return ranges.some(([a, b]) => a <= cp && cp <= b);
}

/**
 * The body of a JSON string rule (quotes included) for any key made of
 * unescaped characters that is none of `names`. Escapes are left out so that
 * the raw text is the key: an escaped spelling of a declared name could
 * otherwise slip past and overwrite it.
 */
export function notStrings(names: readonly string[]): string {
  interface Node {
    end: boolean;
    next: Map<number, Node>;
  }
  const root: Node = { end: false, next: new Map() };
  for (const name of names) {
    const cps = [...name].map((c) => c.codePointAt(0)!);
    if (!cps.every((cp) => contains(JSON_RAW, cp))) continue; // never generated anyway
    let node = root;
    for (const cp of cps) {
      let child = node.next.get(cp);
      if (!child) node.next.set(cp, child = { end: false, next: new Map() });
      node = child;
    }
    node.end = true;
  }
  const any = charClass(JSON_RAW);
  const visit = (node: Node): string => {
    const alts = [...node.next].sort(([a], [b]) => a - b).map(([cp, child]) => {
      const head = charClass([[cp, cp]]);
      if (child.next.size === 0) return `${head} ${any}+`; // child.end holds
      return `${head} (${visit(child)})${child.end ? "" : "?"}`;
    });
    const rest = intersect(
      JSON_RAW,
      negate([...node.next.keys()].map((cp) => [cp, cp])),
    );
    alts.push(`${charClass(normalize(rest))} ${any}*`);
    return alts.join(" | ");
  };
  return `"\\"" (${visit(root)})${root.end ? "" : "?"} "\\""`;
}

const par = (e: string) => (e.includes("|") ? `(${e})` : e);
const digits = (a: number, b: number) => (a === b ? `"${a}"` : `[${a}-${b}]`);
const anyDigits = (
  n: number,
) => (n === 0 ? "" : n === 1 ? " [0-9]" : ` [0-9]{${n}}`);

/** Canonical decimals of the same length from `lo` to `hi` (lo ≤ hi). */
function sameLength(lo: string, hi: string): string {
  if (lo === hi) return `"${lo}"`;
  let i = 0;
  while (lo[i] === hi[i]) i++;
  const x = Number(lo[i]), y = Number(hi[i]);
  const restLo = lo.slice(i + 1), restHi = hi.slice(i + 1);
  const k = restLo.length;
  const zeros = "0".repeat(k), nines = "9".repeat(k);
  const alts: string[] = [];
  let from = x, to = y;
  if (restLo !== zeros) {
    alts.push(`"${x}" ${par(sameLength(restLo, nines))}`);
    from = x + 1;
  }
  if (restHi !== nines) to = y - 1;
  if (from <= to) alts.push(digits(from, to) + anyDigits(k));
  if (restHi !== nines) alts.push(`"${y}" ${par(sameLength(zeros, restHi))}`);
  const body = alts.join(" | ");
  return i > 0 ? `"${lo.slice(0, i)}" ${par(body)}` : body;
}

/** Canonical non-negative integers from `a` to `b` (a ≤ b). */
function unsigned(a: bigint, b: bigint): string {
  const alts: string[] = [];
  const la = String(a).length, lb = String(b).length;
  let fullFrom = 0; // first digit count of a run of complete lengths, 0 = none
  const flush = (to: number) => {
    if (!fullFrom) return;
    const [m, n] = [fullFrom - 1, to - 1];
    alts.push(`[1-9]${m === n ? anyDigits(m) : ` [0-9]{${m},${n}}`}`);
    fullFrom = 0;
  };
  for (let n = la; n <= lb; n++) {
    const lo = n === la ? a : 10n ** BigInt(n - 1);
    const hi = n === lb ? b : 10n ** BigInt(n) - 1n;
    const full = lo === 10n ** BigInt(n - 1) &&
      hi === 10n ** BigInt(n) - 1n;
    if (full) {
      fullFrom ||= n;
      continue;
    }
    flush(n - 1);
    alts.push(sameLength(String(lo), String(hi)));
  }
  flush(lb);
  return alts.join(" | ");
}

/** Canonical integers from `lo` to `hi` (lo ≤ hi, both within 16 digits). */
export function intRange(lo: bigint, hi: bigint): string {
  const alts: string[] = [];
  if (lo < 0n) alts.push(`"-" ${par(unsigned(hi < 0n ? -hi : 1n, -lo))}`);
  if (hi >= 0n) alts.push(unsigned(lo > 0n ? lo : 0n, hi));
  return alts.join(" | ");
}

/** An integral bound of a decimal range. */
export interface Bound {
  value: bigint;
  exclusive: boolean;
}

const FRAC_ANY = `("." [0-9]{1,16})?`;
const FRAC_ZERO = `("." [0]{1,16})?`;
const FRAC_NONZERO = `"." [0]{0,15} [1-9] [0-9]{0,15}`;

/** Magnitudes m with a (<|≤) m (<|≤) b; b null = any 16-digit integral part. */
function magnitude(
  a: bigint,
  aEx: boolean,
  b: bigint | null,
  bEx: boolean,
): string[] {
  const alts: string[] = [];
  const iLo = aEx ? a + 1n : a;
  const iHi = b === null ? DIGITS_LIMIT : b - 1n;
  if (iLo <= iHi) alts.push(`${par(unsigned(iLo, iHi))} ${FRAC_ANY}`);
  if (aEx && (b === null || a < b)) alts.push(`"${a}" ${FRAC_NONZERO}`);
  if (b !== null && !bEx && (aEx ? a < b : a <= b)) {
    alts.push(`"${b}" ${FRAC_ZERO}`);
  }
  return alts;
}

/**
 * Plain decimals (no exponent) between integral bounds; null = unbounded
 * (16 integral digits). Empty when no decimal fits.
 */
export function decimalRange(lo: Bound | null, hi: Bound | null): string {
  const alts: string[] = [];
  if (hi === null || hi.value > 0n || (hi.value === 0n && !hi.exclusive)) {
    const pos = lo !== null && lo.value >= 0n;
    alts.push(
      ...magnitude(
        pos ? lo.value : 0n,
        pos && lo.exclusive,
        hi?.value ?? null,
        hi?.exclusive ?? false,
      ),
    );
  }
  if (lo === null || lo.value < 0n) {
    const neg = hi !== null && hi.value < 0n;
    const m = magnitude(
      neg ? -hi.value : 0n,
      neg ? hi.exclusive : true,
      lo === null ? null : -lo.value,
      lo?.exclusive ?? false,
    );
    if (m.length) alts.push(`"-" (${m.join(" | ")})`);
  }
  return alts.join(" | ");
}
