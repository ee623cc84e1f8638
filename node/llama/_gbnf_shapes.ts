/**
 * The bodies of object and array rules, from the rules of their parts:
 * where commas go, which members may be left out, and how many repeat.
 */
import type { RuleTable } from "./_gbnf_table.ts";

/** One declared property: its `"key" space ":" space value` rule. */
export interface Member {
  kv: string;
  optional: boolean;
}

/**
 * `{…}` with the members in order, optional ones omittable, then any number
 * of `extraKv` (null = none); `atLeastOne` forbids the empty object when all
 * members are optional.
 */
export function objectBody(
  t: RuleTable,
  name: string,
  path: string,
  members: Member[],
  extraKv: string | null,
  atLeastOne: boolean,
): string {
  const space = t.prim("space");
  const sep = `"," ${space}`;
  const extras = extraKv ? `(${sep} ${extraKv})*` : "";
  const first = members.findIndex((m) => !m.optional);
  let inner = "";
  if (first >= 0) {
    // optional members before the first required one carry their comma after them
    const parts = members.slice(0, first).map((m) => `(${m.kv} ${sep})?`);
    parts.push(members[first]!.kv);
    for (const m of members.slice(first + 1)) {
      parts.push(m.optional ? `(${sep} ${m.kv})?` : `${sep} ${m.kv}`);
    }
    inner = [...parts, extras].filter(Boolean).join(" ");
  } else if (members.length || extraKv) {
    // all optional: the first one present picks the branch; rest[j] holds
    // members j.. each after a comma (a rule, as several branches share it)
    const rest: string[] = [];
    rest[members.length] = extras;
    for (let j = members.length - 1; j >= 1; j--) {
      const body = [`(${sep} ${members[j]!.kv})?`, rest[j + 1]]
        .filter(Boolean).join(" ");
      rest[j] = rest[j + 1] ? t.add(`${name}-rest-${j}`, body, path) : body;
    }
    const alts = members.map((m, j) =>
      [m.kv, rest[j + 1]].filter(Boolean).join(" ")
    );
    if (extraKv) alts.push(`${extraKv} ${extras}`);
    inner = `(${alts.join(" | ")})${atLeastOne ? "" : "?"}`;
  }
  return inner ? `"{" ${space} ${inner} ${space} "}"` : `"{" ${space} "}"`;
}

/**
 * `[…]` with `elems` in order (rule names), then up to max in total of
 * `rest` (null = none); at least `min` elements in all.
 */
export function arrayBody(
  t: RuleTable,
  name: string,
  path: string,
  elems: string[],
  rest: string | null,
  min: number,
  max: number,
): string {
  const space = t.prim("space");
  if (!elems.length && rest && max >= 1) elems = [rest];
  let tail = "";
  if (rest && max > elems.length) {
    const next = t.add(`${name}-next`, `"," ${space} ${rest}`, path);
    const from = Math.max(0, min - elems.length);
    tail = t.repeat(next, from, max - elems.length, `${name}-next`, path);
  }
  for (let i = elems.length - 1; i >= 0; i--) {
    const seg = [i > 0 ? `"," ${space}` : "", elems[i], tail]
      .filter(Boolean).join(" ");
    tail = i >= min ? `(${seg})?` : seg;
  }
  return tail ? `"[" ${space} ${tail} ${space} "]"` : `"[" ${space} "]"`;
}
