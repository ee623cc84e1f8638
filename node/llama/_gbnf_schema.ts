/**
 * The walk over one JSON schema document for GbnfBuilder.schema(): keyword
 * checks, types, combinators, $ref (one rule per target, so recursion
 * works), objects and arrays. Scalars are in _gbnf_scalars.ts.
 *
 * In loose mode (GbnfBuilder.looseSchema) a subschema the converter cannot
 * enforce is not refused: the keyword it trips on is dropped and the
 * subschema converted again (for a combinator beside other keywords, the
 * combinator goes: `{"type": "string", "allOf": […]}` becomes a string),
 * until it converts; a subschema that still fails admits any JSON value.
 * Each dropped keyword's path is recorded in `loosened`.
 */
import { gbnfLiteral, notStrings, PRIMITIVES } from "./_gbnf_rules.ts";
import { capped, count, numberRule, stringRule } from "./_gbnf_scalars.ts";
import { arrayBody, objectBody } from "./_gbnf_shapes.ts";
import {
  at,
  fail,
  GBNF_LIMITS,
  isObj,
  type Obj,
  type RuleTable,
  SchemaError,
} from "./_gbnf_table.ts";

/** Annotations, and the containers of $ref targets (read only through $ref). */
const IGNORED = new Set(
  "title description default examples $schema $id $comment deprecated readOnly writeOnly $defs definitions"
    .split(" "),
);
/** Type-specific keywords, by the type they constrain (they imply it when `type` is absent). */
const FAMILY = new Map<string, string>(
  Object.entries({
    object:
      "properties required additionalProperties minProperties maxProperties",
    array: "items prefixItems additionalItems minItems maxItems",
    string: "minLength maxLength pattern format",
    number: "minimum maximum exclusiveMinimum exclusiveMaximum",
  }).flatMap(([type, keys]) => keys.split(" ").map((k) => [k, type] as const)),
);
const COMBINATORS = ["$ref", "anyOf", "oneOf", "allOf", "enum", "const"];
const TYPES = new Set(
  "object array string number integer boolean null".split(" "),
);

const isName = (e: string) => /^[a-zA-Z0-9-]+$/.test(e);

/** `propertyNames` that every JSON object meets (its keys are strings). */
const trivialNames = (v: unknown) =>
  v === true ||
  (isObj(v) && Object.keys(v).every((k) => k === "type" || IGNORED.has(k)) &&
    (v.type === undefined || v.type === "string"));

/** Keywords whose removal loosens a schema, tried in this order when it fails. */
const SPREADING = ["allOf", "anyOf", "oneOf"];

/** The walk's rollback point (loose mode): the rule table and the $ref maps. */
type WalkState = [
  ReturnType<RuleTable["save"]>,
  Map<string, string>,
  Map<string, string>,
  Map<string, Set<string>>,
];

/** One `schema()` call: the walk over one schema document. */
export class SchemaWalk {
  /** $ref pointer → its rule. */
  #refs = new Map<string, string>();
  /** ref rule → its pointer. */
  #pointers = new Map<string, string>();
  /** ref rule → ref rules it can reach before emitting any character. */
  #leads = new Map<string, Set<string>>();

  /** Paths of the keywords dropped (loose mode), or "" for a schema read as any value. */
  readonly loosened: string[] = [];

  constructor(
    readonly t: RuleTable,
    readonly root: unknown,
    readonly name: string,
    readonly strict: boolean,
    readonly loose = false,
  ) {}

  /** The rule name for the whole document. */
  run(): string {
    const rule = this.#visit(this.root, this.name, "", 0, null);
    this.#checkLeftRecursion();
    return rule;
  }

  #save(): WalkState {
    return [
      this.t.save(),
      new Map(this.#refs),
      new Map(this.#pointers),
      new Map([...this.#leads].map(([k, v]) => [k, new Set(v)])),
    ];
  }

  #restore([table, refs, pointers, leads]: WalkState) {
    this.t.restore(table);
    this.#refs = refs;
    this.#pointers = pointers;
    this.#leads = leads;
  }

  /** `lead`: the $ref rule whose start this schema is at, if any (for left recursion). */
  #visit(
    s: unknown,
    name: string,
    path: string,
    depth: number,
    lead: string | null,
  ): string {
    if (!this.loose) return this.#exact(s, name, path, depth, lead);
    let cur = s;
    for (let tries = 0; tries < 16; tries++) {
      const saved = this.#save();
      const mark = this.loosened.length;
      try {
        return this.#exact(cur, name, path, depth, lead);
      } catch (err) {
        if (!(err instanceof SchemaError)) throw err;
        this.#restore(saved);
        this.loosened.length = mark;
        const drop = isObj(cur) ? dropped(cur, path, err) : null;
        if (drop === null) break;
        this.loosened.push(at(path, drop));
        const { [drop]: _, ...rest } = cur as Obj;
        cur = rest;
      }
    }
    this.loosened.push(path);
    return this.t.prim("value");
  }

  #exact(
    s: unknown,
    name: string,
    path: string,
    depth: number,
    lead: string | null,
  ): string {
    if (depth > GBNF_LIMITS.depth) {
      throw fail(path, `nesting is deeper than ${GBNF_LIMITS.depth} levels`);
    }
    if (s === true) return this.t.prim("value");
    if (!isObj(s)) {
      throw fail(
        path,
        s === false
          ? "false admits no value"
          : `expected a schema, got ${JSON.stringify(s)}`,
      );
    }
    for (const k of Object.keys(s)) {
      if (k === "propertyNames" && trivialNames(s[k])) continue;
      if (
        !IGNORED.has(k) && !FAMILY.has(k) && !COMBINATORS.includes(k) &&
        k !== "type" && k !== "nullable"
      ) {
        throw fail(at(path, k), `unsupported keyword "${k}"`);
      }
    }
    if (s.nullable !== undefined && typeof s.nullable !== "boolean") {
      throw fail(at(path, "nullable"), "nullable must be a boolean");
    }
    const nullable = s.nullable === true;
    const k = COMBINATORS.find((c) => Object.hasOwn(s, c));
    let alts: string[];
    if (k) {
      const literal = k === "enum" || k === "const";
      for (const other of Object.keys(s)) {
        if (other === k || (literal && other === "type")) continue;
        if (
          FAMILY.has(other) || other === "type" || COMBINATORS.includes(other)
        ) {
          throw fail(
            at(path, other),
            `"${other}" next to "${k}" is not supported`,
          );
        }
      }
      alts = this.#combinator(
        k,
        s,
        nullable ? `${name}-value` : name,
        path,
        depth,
        lead,
      );
      if (nullable) {
        alts.push(literal ? gbnfLiteral("null") : this.t.prim("null"));
      }
    } else {
      const types = this.#types(s, path);
      if (types && nullable && !types.includes("null")) types.push("null");
      const one = !types || types.length === 1;
      alts = types?.map((t) =>
        this.#typed(t, s, one ? name : `${name}-${t}`, path, depth)
      ) ??
        [this.t.prim("value")];
    }
    const unique = [...new Set(alts)];
    return unique.length === 1 && isName(unique[0]!)
      ? unique[0]!
      : this.t.add(name, unique.join(" | "), path);
  }

  #combinator(
    k: string,
    s: Obj,
    name: string,
    path: string,
    depth: number,
    lead: string | null,
  ): string[] {
    if (k === "$ref") return [this.#ref(s.$ref, path, depth, lead)];
    const list = k === "const" ? [s.const] : s[k];
    if (!Array.isArray(list) || list.length === 0) {
      throw fail(at(path, k), `${k} must be a non-empty array`);
    }
    if (k === "enum" || k === "const") {
      const types = Object.hasOwn(s, "type") ? this.#types(s, path)! : null;
      const fits = (v: unknown) =>
        !types || types.includes(jsonType(v)) ||
        (jsonType(v) === "integer" && types.includes("number"));
      const kept = list.filter(fits);
      if (!kept.length) {
        throw fail(at(path, k), `no value of ${k} has the schema's type`);
      }
      return kept.map((v) => valueLiteral(v, at(path, k)));
    }
    if (k === "allOf" && list.length !== 1) {
      throw fail(at(path, k), "allOf is supported with exactly one schema");
    }
    return list.map((sub, i) =>
      this.#visit(
        sub,
        list.length === 1 ? name : `${name}-${i}`,
        at(at(path, k), i),
        depth + 1,
        lead,
      )
    );
  }

  /** The types a schema admits: `type`, else those its keywords imply; null = any value. */
  #types(s: Obj, path: string): string[] | null {
    if (!Object.hasOwn(s, "type")) {
      const implied = new Set(
        Object.keys(s).flatMap((k) => FAMILY.get(k) ?? []),
      );
      return implied.size ? [...implied] : null;
    }
    const t = s.type;
    const list = typeof t === "string" ? [t] : Array.isArray(t) ? t : [];
    if (
      !list.length || !list.every((x) => typeof x === "string" && TYPES.has(x))
    ) {
      throw fail(at(path, "type"), `unsupported type ${JSON.stringify(t)}`);
    }
    return [...new Set(list as string[])];
  }

  #typed(t: string, s: Obj, name: string, path: string, depth: number): string {
    switch (t) {
      case "null":
      case "boolean":
        return this.t.prim(t);
      case "string":
        return stringRule(this.t, s, name, path);
      case "integer":
      case "number":
        return numberRule(this.t, s, t === "integer", name, path);
      case "object":
        return this.#object(s, name, path, depth);
      default:
        return this.#array(s, name, path, depth);
    }
  }

  #ref(ref: unknown, path: string, depth: number, lead: string | null): string {
    if (typeof ref !== "string" || !(ref === "#" || ref.startsWith("#/"))) {
      throw fail(
        at(path, "$ref"),
        `only local references ("#/$defs/…") are supported, got ${
          JSON.stringify(ref)
        }`,
      );
    }
    let rule = this.#refs.get(ref);
    if (rule === undefined) {
      const target = resolvePointer(this.root, ref);
      if (target === undefined) {
        throw fail(at(path, "$ref"), `${ref} does not resolve`);
      }
      const targetPath = pointerPath(ref);
      rule = this.t.reserve(
        `${this.name}-${
          ref === "#" ? "self" : ref.slice(2).replaceAll("$", "")
        }`,
        path,
      );
      this.#refs.set(ref, rule);
      this.#pointers.set(rule, ref);
      this.#leads.set(rule, new Set());
      const mark = this.t.size;
      const body = this.#visit(target, rule, targetPath, depth + 1, rule);
      // the target's own rule becomes the ref's rule, unless it is shared (a primitive or another ref)
      const own = !this.#pointers.has(body) && !Object.hasOwn(PRIMITIVES, body);
      if (!own || !this.t.absorb(body, rule, mark, targetPath)) {
        this.t.define(rule, body, targetPath);
      }
    }
    if (lead !== null) this.#leads.get(lead)!.add(rule);
    return rule;
  }

  #checkLeftRecursion() {
    const state = new Map<string, "open" | "done">();
    const visit = (rule: string) => {
      state.set(rule, "open");
      for (const next of this.#leads.get(rule)!) {
        if (state.get(next) === "open") {
          const ref = this.#pointers.get(next)!;
          throw fail(
            pointerPath(ref),
            `${ref} reaches itself before any JSON token (left recursion)`,
          );
        }
        if (!state.has(next)) visit(next);
      }
      state.set(rule, "done");
    };
    for (const rule of this.#leads.keys()) if (!state.has(rule)) visit(rule);
  }

  #object(s: Obj, name: string, path: string, depth: number): string {
    const props = s.properties ?? {};
    if (!isObj(props)) {
      throw fail(at(path, "properties"), "properties must be an object");
    }
    const req = s.required ?? [];
    if (!Array.isArray(req) || !req.every((r) => typeof r === "string")) {
      throw fail(at(path, "required"), "required must be an array of strings");
    }
    const ap = s.additionalProperties;
    if (ap !== undefined && typeof ap !== "boolean" && !isObj(ap)) {
      throw fail(
        at(path, "additionalProperties"),
        "additionalProperties must be a boolean or a schema",
      );
    }
    const extra =
      ap === false || (this.strict && (ap === undefined || ap === true))
        ? false
        : ap ?? true;
    const minP = count(s, "minProperties", path) ?? 0;
    const maxP = count(s, "maxProperties", path) ?? Infinity;
    const entries = Object.entries(props).map(([key, sub]) => ({
      key,
      sub,
      path: at(at(path, "properties"), key),
    }));
    const required = new Set(req as string[]);
    for (const key of required) {
      if (Object.hasOwn(props, key)) continue;
      if (extra === false) {
        throw fail(
          at(path, "required"),
          `"${key}" is required but not in properties, and extra properties are not allowed`,
        );
      }
      entries.push({ key, sub: extra, path: at(path, "additionalProperties") });
    }
    if (!entries.length && extra === true && minP === 0 && maxP === Infinity) {
      return this.t.prim("object");
    }
    const space = this.t.prim("space");
    // a property whose schema is false may only be absent
    const banned = entries.filter((e) => e.sub === false);
    for (const e of banned) {
      if (required.has(e.key)) throw fail(e.path, "false admits no value");
    }
    const items = entries.filter((e) => e.sub !== false).map((e) => {
      const value = this.#visit(
        e.sub,
        `${name}-${e.key}`,
        e.path,
        depth + 1,
        null,
      );
      const key = gbnfLiteral(JSON.stringify(e.key));
      const kv = this.t.add(
        `${name}-${e.key}-kv`,
        `${key} ${space} ":" ${space} ${value}`,
        path,
      );
      return { kv, optional: !required.has(e.key) };
    });
    let extraKv: string | null = null;
    if (extra !== false) {
      const value = this.#visit(
        extra,
        `${name}-extra`,
        at(path, "additionalProperties"),
        depth + 1,
        null,
      );
      const key = this.t.add(
        `${name}-extra-key`,
        notStrings(entries.map((e) => e.key)),
        path,
      );
      extraKv = this.t.add(
        `${name}-extra-kv`,
        `${key} ${space} ":" ${space} ${value}`,
        path,
      );
    }
    const nRequired = items.filter((i) => !i.optional).length;
    if (maxP < (extraKv ? Infinity : items.length)) {
      throw fail(
        at(path, "maxProperties"),
        "maxProperties below the number of allowed properties is not supported",
      );
    }
    const atLeastOne = minP === 1 && nRequired === 0 &&
      (items.length > 0 || extraKv !== null);
    if (minP > nRequired && !atLeastOne) {
      throw fail(
        at(path, "minProperties"),
        "minProperties above the number of required properties is not supported",
      );
    }
    return this.t.add(
      name,
      objectBody(this.t, name, path, items, extraKv, atLeastOne),
      path,
    );
  }

  #array(s: Obj, name: string, path: string, depth: number): string {
    const prefixed = s.prefixItems !== undefined;
    if (prefixed && !Array.isArray(s.prefixItems)) {
      throw fail(at(path, "prefixItems"), "prefixItems must be an array");
    }
    if (prefixed && Array.isArray(s.items)) {
      throw fail(
        at(path, "items"),
        "items must be a schema next to prefixItems",
      );
    }
    // draft 2020-12 prefixItems + items, or the older items array + additionalItems
    const tupleKey = prefixed ? "prefixItems" : "items";
    const tuple: unknown[] = prefixed
      ? s.prefixItems as unknown[]
      : Array.isArray(s.items)
      ? s.items
      : [];
    const restKey = Array.isArray(s.items) ? "additionalItems" : "items";
    const restSchema = s[restKey] ?? true;
    const min = count(s, "minItems", path) ?? 0;
    const max = capped(count(s, "maxItems", path));
    if (min > max) {
      throw fail(at(path, "minItems"), "minItems is above maxItems");
    }
    if (!tuple.length && restSchema === true && min === 0 && max === Infinity) {
      return this.t.prim("array");
    }
    const elems = tuple.slice(0, Math.min(tuple.length, max))
      .map((sub, i) =>
        this.#visit(
          sub,
          `${name}-${i}`,
          at(at(path, tupleKey), i),
          depth + 1,
          null,
        )
      );
    const rest = restSchema === false ? null : this.#visit(
      restSchema,
      `${name}-item`,
      at(path, restKey),
      depth + 1,
      null,
    );
    if (!rest && min > elems.length) {
      throw fail(
        at(path, "minItems"),
        "minItems is above the number of items allowed",
      );
    }
    return this.t.add(
      name,
      arrayBody(this.t, name, path, elems, rest, min, max),
      path,
    );
  }
}

/**
 * The keyword of `s` to drop after `err` (loose mode): the one the error
 * names, or, when it names a keyword beside a combinator, the combinator
 * (`{"type": "string", "allOf": […]}` keeps its type). Null when the error
 * names no keyword of `s` (it is then read as any value).
 */
function dropped(s: Obj, path: string, err: SchemaError): string | null {
  const key = Object.keys(s).find((k) => err.path === at(path, k));
  if (key === undefined) return null;
  if (err.message.includes(" next to ")) {
    const spread = SPREADING.find((k) => Object.hasOwn(s, k));
    if (spread) return spread;
  }
  return key;
}

function jsonType(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  return typeof v;
}

function valueLiteral(v: unknown, path: string): string {
  const text = JSON.stringify(v);
  if (text === undefined) throw fail(path, "not a JSON value");
  return gbnfLiteral(text);
}

/** "#/$defs/Node" → "$defs.Node", for error paths. */
function pointerPath(ref: string): string {
  return ref.slice(2).split("/").join(".");
}

function resolvePointer(root: unknown, ref: string): unknown {
  let cur = root;
  if (ref === "#") return cur;
  for (const raw of ref.slice(2).split("/")) {
    let key: string;
    try {
      key = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
    } catch {
      return undefined; // a malformed %-escape
    }
    if (Array.isArray(cur) && /^\d+$/.test(key)) cur = cur[Number(key)];
    else if (isObj(cur) && Object.hasOwn(cur, key)) cur = cur[key];
    else return undefined;
  }
  return cur;
}
