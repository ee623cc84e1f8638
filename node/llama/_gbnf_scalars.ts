/**
 * Rules for string and number schemas: lengths, formats, patterns, and
 * exact integer and integral decimal bounds.
 */
import { decimalRange, DIGITS_LIMIT, intRange } from "./_gbnf_rules.ts";
import { PatternError, patternToGbnf } from "./_gbnf_pattern.ts";
import {
  at,
  fail,
  GBNF_LIMITS,
  type Obj,
  type RuleTable,
} from "./_gbnf_table.ts";

const FORMATS = new Set(["date", "time", "date-time", "uuid"]);

/** The rule for a string schema's minLength, maxLength, pattern and format. */
export function stringRule(
  t: RuleTable,
  s: Obj,
  name: string,
  path: string,
): string {
  const min = count(s, "minLength", path) ?? 0;
  const max = capped(count(s, "maxLength", path));
  if (min > max) {
    throw fail(at(path, "minLength"), "minLength is above maxLength");
  }
  const lengths = Object.hasOwn(s, "minLength") ||
    Object.hasOwn(s, "maxLength");
  if (s.format !== undefined && typeof s.format !== "string") {
    throw fail(at(path, "format"), "format must be a string");
  }
  const format = FORMATS.has(s.format as string) ? s.format as string : null;
  if (s.pattern !== undefined) {
    if (typeof s.pattern !== "string") {
      throw fail(at(path, "pattern"), "pattern must be a string");
    }
    if (lengths || format) {
      throw fail(
        at(path, "pattern"),
        "pattern together with minLength, maxLength or format is not supported",
      );
    }
    try {
      const inner = patternToGbnf(s.pattern, {
        char: () => t.prim("char"),
        rule: (body) => t.add(`${name}-part`, body, path),
        repeat: (item, a, b) => {
          if (a > GBNF_LIMITS.count) {
            throw new PatternError(`a repetition above ${GBNF_LIMITS.count}`);
          }
          return t.repeat(
            item,
            a,
            capped(b),
            `${name}-rep`,
            path,
          );
        },
      });
      return t.add(name, `"\\"" ${inner} "\\""`, path);
    } catch (err) {
      if (!(err instanceof PatternError)) throw err;
      throw fail(
        at(path, "pattern"),
        `pattern ${
          JSON.stringify(short(s.pattern))
        } is not supported: ${err.message}`,
      );
    }
  }
  if (format) {
    if (lengths) {
      throw fail(
        at(path, "format"),
        `format ${format} together with minLength or maxLength is not supported`,
      );
    }
    return t.prim(`${format}-string`);
  }
  if (min === 0 && max === Infinity) return t.prim("string");
  const chars = t.repeat(t.prim("char"), min, max, `${name}-chars`, path);
  return t.add(name, `"\\"" ${chars} "\\""`, path);
}

/** The rule for an integer or number schema's bounds. */
export function numberRule(
  t: RuleTable,
  s: Obj,
  integer: boolean,
  name: string,
  path: string,
): string {
  const lo = bound(s, "minimum", "exclusiveMinimum", path, 1);
  const hi = bound(s, "maximum", "exclusiveMaximum", path, -1);
  if (!lo && !hi) return t.prim(integer ? "integer" : "number");
  let body: string;
  if (integer) {
    const a = lo
      ? BigInt(lo.exclusive ? Math.floor(lo.value) + 1 : Math.ceil(lo.value))
      : -DIGITS_LIMIT;
    const b = hi
      ? BigInt(hi.exclusive ? Math.ceil(hi.value) - 1 : Math.floor(hi.value))
      : DIGITS_LIMIT;
    const from = a < -DIGITS_LIMIT ? -DIGITS_LIMIT : a;
    const to = b > DIGITS_LIMIT ? DIGITS_LIMIT : b;
    body = from <= to ? intRange(from, to) : "";
  } else {
    for (const x of [lo, hi]) {
      if (x && !Number.isInteger(x.value)) {
        throw fail(
          at(path, x.key),
          "a fractional bound on a number is not supported (integral bounds are)",
        );
      }
    }
    // bounds beyond 16 digits: the unbounded side already stays within them
    const limit = Number(DIGITS_LIMIT);
    const big = (x: Bound | null, beyond: boolean) =>
      x && !beyond ? { value: BigInt(x.value), exclusive: x.exclusive } : null;
    body = (lo && lo.value > limit) || (hi && hi.value < -limit)
      ? ""
      : decimalRange(
        big(lo, !!lo && lo.value < -limit),
        big(hi, !!hi && hi.value > limit),
      );
  }
  if (!body) {
    throw fail(
      path,
      `no ${
        integer ? "integer" : "number"
      } of at most 16 integral digits lies between the bounds`,
    );
  }
  return t.add(name, body, path);
}

/** A maximum count lowered to GBNF_LIMITS.count (narrower, so still valid); undefined = Infinity. */
export function capped(max: number | undefined): number {
  return max === undefined || max === Infinity
    ? Infinity
    : Math.min(max, GBNF_LIMITS.count);
}

/** A count keyword (minLength, maxItems, …): a non-negative integer; min* at most GBNF_LIMITS.count. */
export function count(s: Obj, key: string, path: string): number | undefined {
  const v = s[key];
  if (v === undefined) return undefined;
  if (!Number.isSafeInteger(v) || (v as number) < 0) {
    throw fail(at(path, key), `${key} must be a non-negative integer`);
  }
  if (key.startsWith("min") && (v as number) > GBNF_LIMITS.count) {
    throw fail(
      at(path, key),
      `${key} above ${GBNF_LIMITS.count} is not supported`,
    );
  }
  return v as number;
}

function short(text: string): string {
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

interface Bound {
  value: number;
  exclusive: boolean;
  key: string;
}

/** The tighter of an inclusive and an exclusive bound (draft 4's boolean exclusive* too). */
function bound(
  s: Obj,
  inc: string,
  exc: string,
  path: string,
  dir: 1 | -1,
): Bound | null {
  const i = s[inc], e = s[exc];
  if (i !== undefined && !Number.isFinite(i)) {
    throw fail(at(path, inc), `${inc} must be a number`);
  }
  if (e !== undefined && typeof e !== "boolean" && !Number.isFinite(e)) {
    throw fail(at(path, exc), `${exc} must be a number`);
  }
  const a = i === undefined
    ? null
    : { value: i as number, exclusive: e === true, key: inc };
  const b = typeof e === "number"
    ? { value: e, exclusive: true, key: exc }
    : null;
  if (!a || !b) return a ?? b;
  return (b.value - a.value) * dir >= 0 ? b : a;
}
