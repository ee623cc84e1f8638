/**
 * JSON Schema → llama.cpp GBNF, to enforce OpenAI `response_format`
 * (`json_object`, `json_schema` with `strict`) and to constrain tool calls.
 * Our own because node-llama-cpp's converter is reachable only through
 * `LlamaJsonSchemaGrammar`, which needs its native addon, and no well-kept
 * standalone npm converter exists; rule shapes follow llama.cpp's
 * common/json-schema-to-grammar.cpp.
 *
 * The grammar may be narrower than the schema, never wider: whatever it
 * admits validates. A constraint it cannot enforce throws SchemaError (the
 * engine answers 400) instead of being dropped. In particular:
 * - integers honour minimum/maximum (exclusive too) exactly; numbers honour
 *   integral bounds (bounded numbers are written without exponent) and refuse
 *   fractional ones; unbounded integral parts stop at 16 digits, exponents
 *   at 2, so every number is a finite double;
 * - maxLength/maxItems above GBNF_LIMITS.count are lowered to it; string
 *   characters are code points (\u escapes of surrogates are left out), so
 *   lengths count what validators count; formats date, time, date-time and
 *   uuid are exact, other formats read as plain strings; `pattern` takes the
 *   regular subset of ECMAScript regexes (_gbnf_pattern.ts);
 * - objects list declared properties in declaration order; extra keys, when
 *   allowed, follow them, are written without escapes and never repeat a
 *   declared name (a property whose schema is false stays absent);
 *   min/maxProperties only where the shape already meets them, or
 *   minProperties 1 over optional keys; $ref is local ("#/$defs/…",
 *   "#/definitions/…", any "#/…" pointer), one rule per target;
 * - `oneOf` is read as `anyOf` (overlapping branches are the schema's risk);
 *   `allOf` takes one schema; a $ref cycle that reaches itself before any
 *   token is refused; one that needs infinite output is not detected.
 *
 * `looseSchema` converts what it can and loosens the rest (dropping the
 * keywords it cannot enforce), for tools whose arguments are a hint rather
 * than a contract (not `strict`); what it loosened is reported.
 *
 * Every value rule matches the value alone; whitespace (`space`, at most a
 * newline and 20 blanks) sits inside objects and arrays only.
 */
import { gbnfLiteral } from "./_gbnf_rules.ts";
import { SchemaWalk } from "./_gbnf_schema.ts";
import { RuleTable, SchemaError } from "./_gbnf_table.ts";

export { GBNF_LIMITS, SchemaError } from "./_gbnf_table.ts";

/** Options of the converter. */
export interface GbnfOptions {
  /** OpenAI strict semantics: objects take no extra keys unless `additionalProperties` is a schema. */
  strict?: boolean;
}

/** Builds one GBNF grammar from several parts; rule names are unique and deterministic. */
export class GbnfBuilder {
  readonly #table = new RuleTable();
  readonly #strict: boolean;

  constructor(opts: GbnfOptions = {}) {
    this.#strict = opts.strict ?? false;
  }

  /**
   * Adds rules for `schema`; returns the rule name that matches one JSON value
   * valid against it. Throws SchemaError, leaving the builder as it was.
   */
  schema(schema: unknown, name = "json", opts: GbnfOptions = {}): string {
    const saved = this.#table.save();
    try {
      return new SchemaWalk(
        this.#table,
        schema,
        name,
        opts.strict ?? this.#strict,
      ).run();
    } catch (err) {
      this.#table.restore(saved);
      throw err;
    }
  }

  /**
   * Like `schema`, but a part the converter cannot enforce is loosened
   * instead of refused (see _gbnf_schema.ts): returns the rule, which
   * matches a JSON object, and the paths loosened (empty when the grammar
   * is exact; "" when the whole schema was read as any object). For tool
   * arguments that are not `strict`.
   */
  looseSchema(
    schema: unknown,
    name = "json",
    opts: GbnfOptions = {},
  ): { rule: string; loosened: string[] } {
    const saved = this.#table.save();
    const walk = new SchemaWalk(
      this.#table,
      schema,
      name,
      opts.strict ?? this.#strict,
      true,
    );
    try {
      const rule = walk.run();
      if (walk.loosened.includes("")) {
        return { rule: this.#table.prim("object"), loosened: [""] };
      }
      return { rule, loosened: walk.loosened };
    } catch (err) {
      // a $ref cycle without tokens (found after the walk): any object
      this.#table.restore(saved);
      if (!(err instanceof SchemaError)) throw err;
      return { rule: this.#table.prim("object"), loosened: [""] };
    }
  }

  /** A GBNF literal for a string, escaped ("\"<tool_call>\\n\"" etc.). */
  literal(text: string): string {
    return gbnfLiteral(text);
  }

  /**
   * Adds (or reuses) a named rule with a raw GBNF body; returns its name.
   * Bodies may use the shared rules (`space`, `string`, `value`, …).
   */
  rule(name: string, body: string): string {
    return this.#table.add(name, body, "");
  }

  /** The whole grammar text with `root ::= rootBody` first. Throws if a rule is used but never defined. */
  build(rootBody: string): string {
    return this.#table.build(rootBody);
  }
}

/** A grammar for one JSON value valid against `schema` (root rule "root"). */
export function jsonSchemaToGbnf(
  schema: unknown,
  opts: GbnfOptions = {},
): string {
  const b = new GbnfBuilder(opts);
  return b.build(b.schema(schema));
}

/** A grammar for any JSON object (response_format json_object). */
export const JSON_OBJECT_GBNF: string = jsonSchemaToGbnf({ type: "object" });
