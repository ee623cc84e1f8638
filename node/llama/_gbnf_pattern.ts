/**
 * JSON Schema `pattern` → GBNF for the inside of a JSON string. Handles the
 * regular subset of ECMAScript regexes (with the `u` flag, as validators
 * compile them): literals, escapes, classes, `.`, groups, alternation,
 * quantifiers, and `^`/`$` at the ends of top-level alternatives. Lookaround,
 * backreferences, word boundaries and `\p{…}` throw a PatternError.
 *
 * The grammar works on the JSON text, so every character is emitted in its
 * JSON spelling; classes keep the characters a JSON string may hold raw plus
 * the escapes \" \\ \t \n \r (other control characters are left out, which
 * only narrows the strings produced).
 */
import {
  charClass,
  contains,
  gbnfLiteral,
  intersect,
  JSON_RAW,
  negate,
  normalize,
  type Range,
} from "./_gbnf_rules.ts";

/** A pattern the converter cannot express. */
export class PatternError extends Error {}

/** What the converter needs from the grammar builder. */
export interface PatternHost {
  /** Rule name matching any one JSON string character. */
  char(): string;
  /** Names a sub-expression; returns the rule name. */
  rule(body: string): string;
  /** `item` repeated min..max times (max may be Infinity). */
  repeat(item: string, min: number, max: number): string;
}

const DIGIT: Range[] = [[0x30, 0x39]];
const WORD: Range[] = [[0x30, 0x39], [0x41, 0x5a], [0x5f, 0x5f], [0x61, 0x7a]];
const SPACE: Range[] = normalize([
  [0x09, 0x0d],
  [0x20, 0x20],
  [0xa0, 0xa0],
  [0x1680, 0x1680],
  [0x2000, 0x200a],
  [0x2028, 0x2029],
  [0x202f, 0x202f],
  [0x205f, 0x205f],
  [0x3000, 0x3000],
  [0xfeff, 0xfeff],
]);
const DOT = negate([[0x0a, 0x0a], [0x0d, 0x0d], [0x2028, 0x2029]]);
const CONTROL_ESCAPES: Record<string, number> = {
  t: 9,
  n: 10,
  v: 11,
  f: 12,
  r: 13,
};
/** Characters outside JSON_RAW that classes keep, in their JSON spelling. */
const ESCAPED: [number, string][] = [
  [0x22, '\\"'],
  [0x5c, "\\\\"],
  [0x09, "\\t"],
  [0x0a, "\\n"],
  [0x0d, "\\r"],
];

interface Piece {
  /** The decoded text when the piece is one literal code point. */
  text: string | null;
  expr: string;
}

/** GBNF for the characters between the quotes of a string matching `pattern`. */
export function patternToGbnf(pattern: string, host: PatternHost): string {
  try {
    new RegExp(pattern, "u");
  } catch (err) {
    throw new PatternError(
      `invalid regular expression: ${(err as Error).message}`,
    );
  }
  return new Parser(pattern, host).top();
}

/** Deepest group nesting converted (the parser recurses per group). */
const MAX_GROUP_DEPTH = 50;

class Parser {
  #cps: string[];
  #i = 0;
  #groups = 0;

  constructor(pattern: string, readonly host: PatternHost) {
    this.#cps = [...pattern];
  }

  top(): string {
    const alts = [this.#sequence(true)];
    while (this.#eat("|")) alts.push(this.#sequence(true));
    if (this.#i < this.#cps.length) throw new PatternError("unbalanced ')'");
    return alts.length === 1 ? alts[0]! : `(${alts.join(" | ")})`;
  }

  #peek(): string | undefined {
    return this.#cps[this.#i];
  }

  #eat(ch: string): boolean {
    if (this.#cps[this.#i] !== ch) return false;
    this.#i++;
    return true;
  }

  #next(): string {
    const ch = this.#cps[this.#i++];
    if (ch === undefined) throw new PatternError("unexpected end of pattern");
    return ch;
  }

  #sequence(top: boolean): string {
    const start = top && this.#eat("^");
    let end = false;
    const pieces: Piece[] = [];
    for (
      let ch = this.#peek();
      ch !== undefined && ch !== "|" && ch !== ")";
      ch = this.#peek()
    ) {
      if (ch === "^") {
        throw new PatternError("'^' is only supported at the start");
      }
      if (ch === "$") {
        this.#i++;
        const after = this.#peek();
        if (!top || (after !== undefined && after !== "|")) {
          throw new PatternError("'$' is only supported at the end");
        }
        end = true;
        break;
      }
      pieces.push(this.#quantified(this.#atom()));
    }
    const parts: string[] = [];
    let text = "";
    for (const p of pieces) {
      if (p.text !== null) {
        text += p.text;
        continue;
      }
      if (text) parts.push(literal(text));
      text = "";
      parts.push(p.expr);
    }
    if (text) parts.push(literal(text));
    if (top && !start) parts.unshift(`${this.host.char()}*`);
    if (top && !end) parts.push(`${this.host.char()}*`);
    return parts.length ? parts.join(" ") : `""`;
  }

  #quantified(p: Piece): Piece {
    let min: number, max: number;
    const ch = this.#peek();
    if (ch === "*") [min, max] = [0, Infinity];
    else if (ch === "+") [min, max] = [1, Infinity];
    else if (ch === "?") [min, max] = [0, 1];
    else if (ch === "{") {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(this.#cps.slice(this.#i).join(""));
      if (!m) return p; // validated with the u flag, so unreachable
      min = Number(m[1]);
      max = m[2] === undefined ? min : m[3] ? Number(m[3]) : Infinity;
      this.#i += [...m[0]].length - 1;
    } else return p;
    this.#i++;
    this.#eat("?"); // lazy matches the same strings
    const atomic = /^("([^"\\]|\\.)*"|\[([^\]\\]|\\.)*\]|[a-zA-Z0-9-]+)$/.test(
      p.expr,
    );
    const item = atomic ? p.expr : this.host.rule(p.expr);
    return { text: null, expr: this.host.repeat(item, min, max) };
  }

  #atom(): Piece {
    const ch = this.#next();
    if (ch === ".") return set(DOT);
    if (ch === "[") return set(this.#class());
    if (ch === "(") {
      if (this.#eat("?")) {
        if (this.#eat(":")) { /* non-capturing */ }
        else if (
          this.#peek() === "<" && !/[=!]/.test(this.#cps[this.#i + 1] ?? "")
        ) {
          while (
            this.#next() !== ">"
          ) { /* named group: the name does not matter */ }
        } else {throw new PatternError(
            "lookaround and inline flags are not supported",
          );}
      }
      if (++this.#groups > MAX_GROUP_DEPTH) {
        throw new PatternError(`groups nested deeper than ${MAX_GROUP_DEPTH}`);
      }
      const alts = [this.#sequence(false)];
      while (this.#eat("|")) alts.push(this.#sequence(false));
      if (!this.#eat(")")) throw new PatternError("unbalanced '('");
      this.#groups--;
      return { text: null, expr: `(${alts.join(" | ")})` };
    }
    if (ch === "\\") {
      const esc = this.#escape(false);
      return typeof esc === "number" ? char(esc) : set(esc);
    }
    return char(ch.codePointAt(0)!);
  }

  /** After `[`: the class's code points. */
  #class(): Range[] {
    const negated = this.#eat("^");
    const ranges: Range[] = [];
    while (!this.#eat("]")) {
      const from = this.#classAtom();
      if (
        this.#peek() === "-" && this.#cps[this.#i + 1] !== "]" &&
        typeof from === "number"
      ) {
        this.#i++;
        const to = this.#classAtom();
        if (typeof to !== "number") throw new PatternError("bad class range");
        ranges.push([from, to]);
      } else if (typeof from === "number") ranges.push([from, from]);
      else ranges.push(...from);
    }
    return negated ? negate(ranges) : normalize(ranges);
  }

  #classAtom(): number | Range[] {
    const ch = this.#next();
    return ch === "\\" ? this.#escape(true) : ch.codePointAt(0)!;
  }

  /** After `\`: one code point or a class. */
  #escape(inClass: boolean): number | Range[] {
    const ch = this.#next();
    const sets: Record<string, Range[]> = { d: DIGIT, w: WORD, s: SPACE };
    const lower = ch.toLowerCase();
    if (lower in sets) {
      return ch === lower ? sets[lower]! : negate(sets[lower]!);
    }
    if (ch in CONTROL_ESCAPES) return CONTROL_ESCAPES[ch]!;
    if (ch === "b" && inClass) return 8;
    if (ch === "b" || ch === "B") {
      throw new PatternError("word boundaries are not supported");
    }
    if (ch === "p" || ch === "P") {
      throw new PatternError("\\p{…} is not supported");
    }
    if (/[1-9k]/.test(ch)) {
      throw new PatternError("backreferences are not supported");
    }
    if (ch === "0") return 0;
    if (ch === "c") return this.#next().codePointAt(0)! % 32;
    if (ch === "x") return this.#hex(2);
    if (ch === "u") {
      if (this.#eat("{")) {
        let hex = "";
        for (let c = this.#next(); c !== "}"; c = this.#next()) hex += c;
        return parseInt(hex, 16);
      }
      const cp = this.#hex(4);
      if (
        cp >= 0xd800 && cp <= 0xdbff &&
        this.#cps.slice(this.#i, this.#i + 2).join("") === "\\u"
      ) {
        const save = this.#i;
        this.#i += 2;
        const low = this.#hex(4);
        if (low >= 0xdc00 && low <= 0xdfff) {
          return 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
        }
        this.#i = save;
      }
      return cp;
    }
    return ch.codePointAt(0)!; // identity escape of a syntax character
  }

  #hex(n: number): number {
    let hex = "";
    for (let k = 0; k < n; k++) hex += this.#next();
    return parseInt(hex, 16);
  }
}

function literal(text: string): string {
  return gbnfLiteral(JSON.stringify(text).slice(1, -1));
}

function char(cp: number): Piece {
  const text = String.fromCodePoint(cp);
  return { text, expr: literal(text) };
}

function set(ranges: Range[]): Piece {
  const raw = intersect(ranges, JSON_RAW);
  const alts = raw.length ? [charClass(raw)] : [];
  for (const [cp, spelling] of ESCAPED) {
    if (contains(ranges, cp)) alts.push(gbnfLiteral(spelling));
  }
  if (!alts.length) {
    throw new PatternError(
      "a character class matches no JSON string character",
    );
  }
  return {
    text: null,
    expr: alts.length === 1 ? alts[0]! : `(${alts.join(" | ")})`,
  };
}
