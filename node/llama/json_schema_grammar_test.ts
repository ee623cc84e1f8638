/**
 * The JSON Schema → GBNF converter: grammar text, acceptance by the real
 * llama.cpp (every grammar built here goes through
 * llama_sampler_init_grammar), and generation on the random-weight fixture
 * model, whose output must end by EOG, parse, and validate with ajv.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Ajv2020 } from "ajv/dist/2020.js";
import { writeFixtureModel } from "../../tools/fixture_model.ts";
import { cstr, type Llama, openLlama } from "./ffi.ts";
import { LoadedLlama } from "./model.ts";
import {
  GbnfBuilder,
  type GbnfOptions,
  JSON_OBJECT_GBNF,
  jsonSchemaToGbnf,
  SchemaError,
} from "./json_schema_grammar.ts";
import { outputGrammar } from "./constraints.ts";
import { parseOutputControls } from "../../protocol/openai/output_controls.ts";

let shared: Promise<{ llama: Llama; m: LoadedLlama; dir: string }> | null =
  null;

/** The fixture model, loaded once for the whole file (closed by the last test). */
function model() {
  return shared ??= (async () => {
    const dir = await Deno.makeTempDir({ prefix: "orchard-gbnf-" });
    const path = join(dir, "tiny.gguf");
    await writeFixtureModel(path);
    const llama = openLlama();
    const m = await LoadedLlama.load(llama, {
      path,
      ctxPerSeq: 512,
      slots: 1,
      threads: 1,
      batch: 512,
    });
    return { llama, m, dir };
  })();
}

/** Tests share the loaded library and model across test boundaries. */
function test(name: string, fn: () => void | Promise<void>) {
  Deno.test({ name, sanitizeResources: false, sanitizeOps: false, fn });
}

/** Asserts that llama.cpp parses `grammar`; returns it. */
async function accepted(grammar: string): Promise<string> {
  const { llama, m } = await model();
  const s = llama.symbols;
  const g = s.llama_sampler_init_grammar(m.vocab, cstr(grammar), cstr("root"));
  assert.ok(g, `llama.cpp refused the grammar:\n${grammar}`);
  s.llama_sampler_free(g);
  return grammar;
}

async function gbnf(schema: unknown, opts?: GbnfOptions): Promise<string> {
  return await accepted(jsonSchemaToGbnf(schema, opts));
}

function ruleOf(grammar: string, name: string): string {
  const line = grammar.split("\n").find((l) => l.startsWith(`${name} ::= `));
  assert.ok(line, `no rule ${name} in:\n${grammar}`);
  return line.slice(name.length + 5);
}

/** A JS RegExp for a rule (recursion cut at 3 levels), to check exactly which strings it takes. */
function toRegExp(grammar: string, rule = "root"): RegExp {
  const rules = new Map(
    grammar.trim().split("\n").map((l) => {
      const i = l.indexOf(" ::= ");
      return [l.slice(0, i), l.slice(i + 5)] as const;
    }),
  );
  const conv = (body: string, open: string[] = []): string =>
    body.replace(
      /"((?:[^"\\]|\\.)*)"|\[((?:[^\]\\]|\\.)*)\]|([a-zA-Z][a-zA-Z0-9-]*)|\{(\d+)(,?)(\d*)\}|(\()|\s+/g,
      (_, lit, cls, ref, a, comma, b, group) => {
        if (group !== undefined) return "(?:";
        if (lit !== undefined) {
          return (JSON.parse(`"${lit}"`) as string).replace(
            /[.*+?^${}()|[\]\\]/g,
            "\\$&",
          );
        }
        if (cls !== undefined) {
          return `[${
            cls.replace(
              /\\U([0-9A-F]{8})/g,
              (_: string, h: string) => `\\u{${parseInt(h, 16).toString(16)}}`,
            )
          }]`;
        }
        if (ref !== undefined) {
          if (open.filter((r) => r === ref).length >= 3) return "(?!)";
          return `(?:${conv(rules.get(ref)!, [...open, ref])})`;
        }
        if (a !== undefined) return `{${a}${comma}${b}}`;
        return "";
      },
    );
  return new RegExp(`^(?:${conv(rules.get(rule)!)})$`, "u");
}

function throwsSchemaError(fn: () => unknown, path: string, what: RegExp) {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof SchemaError, String(e));
    assert.equal(e.path, path);
    assert.match(e.message, what);
    return true;
  });
}

// --- grammar text ---

test("jsonSchemaToGbnf() keeps declared property order", async () => {
  const g = await gbnf({
    type: "object",
    properties: {
      zeta: { type: "string" },
      alpha: { type: "integer" },
      mid: { type: "boolean" },
    },
    required: ["zeta", "alpha", "mid"],
    additionalProperties: false,
  });
  assert.equal(
    ruleOf(g, "json"),
    `"{" space json-zeta-kv "," space json-alpha-kv "," space json-mid-kv space "}"`,
  );
  assert.equal(
    ruleOf(g, "json-alpha-kv"),
    `"\\"alpha\\"" space ":" space integer`,
  );
  assert.ok(g.startsWith("root ::= json\n"));
});

test("jsonSchemaToGbnf() lets optional properties be left out in order", async () => {
  const g = await gbnf({
    type: "object",
    properties: {
      a: { type: "null" },
      b: { type: "null" },
      c: { type: "null" },
    },
    required: ["b"],
    additionalProperties: false,
  });
  assert.equal(
    ruleOf(g, "json"),
    `"{" space (json-a-kv "," space)? json-b-kv ("," space json-c-kv)? space "}"`,
  );
  const re = toRegExp(g);
  for (
    const ok of [
      '{"b":null}',
      '{"a":null,"b":null}',
      '{ "b": null,\n  "c": null }',
    ]
  ) {
    assert.match(ok, re);
  }
  for (const bad of ["{}", '{"b":null,"a":null}', '{"b":null,}']) {
    assert.doesNotMatch(bad, re);
  }
});

test("jsonSchemaToGbnf() allows extra keys unless additionalProperties is false or strict", async () => {
  const schema = {
    type: "object",
    properties: { ab: { type: "boolean" } },
    required: ["ab"],
  };
  const open = toRegExp(await gbnf(schema));
  assert.match('{"ab":true,"x":[1,{"y":null}],"a":"b"}', open);
  assert.doesNotMatch('{"ab":true,"ab":false}', open); // a declared key never comes back
  const strict = toRegExp(await gbnf(schema, { strict: true }));
  assert.match('{"ab":true}', strict);
  assert.doesNotMatch('{"ab":true,"x":1}', strict);
  const typed = toRegExp(
    await gbnf({ ...schema, additionalProperties: { type: "integer" } }, {
      strict: true,
    }),
  );
  assert.match('{"ab":true,"x":1,"abc":2}', typed);
  assert.doesNotMatch('{"ab":true,"x":"1"}', typed);
});

test("jsonSchemaToGbnf() enforces integer bounds exactly", async () => {
  const cases: [Record<string, number>, number, number][] = [
    [{ minimum: 0, maximum: 100 }, 0, 100],
    [{ minimum: -42, maximum: 7 }, -42, 7],
    [{ exclusiveMinimum: 3, exclusiveMaximum: 250 }, 4, 249],
    [{ minimum: -250, maximum: -17 }, -250, -17],
    [{ minimum: 95 }, 95, Infinity],
    [{ maximum: -5 }, -Infinity, -5],
    [{ minimum: 1.5, maximum: 9.5 }, 2, 9],
  ];
  for (const [bounds, lo, hi] of cases) {
    const re = toRegExp(await gbnf({ type: "integer", ...bounds }));
    for (let n = -300; n <= 300; n++) {
      assert.equal(
        re.test(String(n)),
        n >= lo && n <= hi,
        `${n} vs ${JSON.stringify(bounds)}`,
      );
    }
    assert.doesNotMatch("007", re);
  }
  assert.equal(
    ruleOf(await gbnf({ type: "integer", minimum: 0, maximum: 100 }), "json"),
    `[0-9] | [1-9] [0-9] | "100"`,
  );
});

test("jsonSchemaToGbnf() enforces integral bounds on numbers", async () => {
  const check = async (
    bounds: Record<string, number>,
    ok: string[],
    bad: string[],
  ) => {
    const re = toRegExp(await gbnf({ type: "number", ...bounds }));
    for (const s of ok) {
      assert.match(s, re, `${s} vs ${JSON.stringify(bounds)}`);
    }
    for (const s of bad) {
      assert.doesNotMatch(s, re, `${s} vs ${JSON.stringify(bounds)}`);
    }
  };
  await check({ minimum: 0, maximum: 1 }, ["0", "0.5", "1", "1.000", "0.999"], [
    "-0.1",
    "1.01",
    "2",
    "1e0",
  ]);
  await check({ exclusiveMinimum: 0 }, ["0.001", "3", "12.5"], [
    "0",
    "0.000",
    "-1",
  ]);
  await check({ minimum: -2, exclusiveMaximum: 0 }, ["-2", "-1.5", "-0.01"], [
    "0",
    "-2.1",
    "-0",
    "-2.5",
  ]);
  throwsSchemaError(
    () => jsonSchemaToGbnf({ type: "number", maximum: 0.5 }),
    "maximum",
    /fractional bound/,
  );
});

test("jsonSchemaToGbnf() turns type arrays, nullable, enum and const into alternatives", async () => {
  assert.equal(
    ruleOf(await gbnf({ type: ["string", "null"] }), "json"),
    "string | null",
  );
  assert.equal(
    ruleOf(await gbnf({ enum: ['a"b', 1, null, { k: [true] }] }), "json"),
    `"\\"a\\\\\\"b\\"" | "1" | "null" | "{\\"k\\":[true]}"`,
  );
  assert.equal(
    ruleOf(await gbnf({ type: "string", enum: ["x", 2] }), "json"),
    `"\\"x\\""`,
  );
  assert.equal(
    ruleOf(await gbnf({ const: "on", nullable: true }), "json"),
    `"\\"on\\"" | "null"`,
  );
  assert.equal(
    ruleOf(await gbnf({ type: "integer", nullable: true }), "json"),
    "integer | null",
  );
  const any = await gbnf({ description: "anything" });
  assert.ok(any.startsWith("root ::= value\n"));
});

test("jsonSchemaToGbnf() bounds string lengths in code points", async () => {
  const g = await gbnf({ type: "string", minLength: 2, maxLength: 4 });
  assert.equal(ruleOf(g, "json"), `"\\"" char{2,4} "\\""`);
  const re = toRegExp(g);
  assert.match('"ab"', re);
  assert.match('"\\u00e9\\n€"', re);
  assert.doesNotMatch('"a"', re);
  assert.doesNotMatch('"abcde"', re);
  assert.doesNotMatch('"\\ud83d\\ude00"', re); // surrogate escapes would count as two
  assert.doesNotMatch('"a\nb"', re); // raw control characters
});

test("jsonSchemaToGbnf() composes counts above llama.cpp's repetition limit", async () => {
  const g = await gbnf({ type: "string", maxLength: 2500 });
  assert.equal(ruleOf(g, "json"), `"\\"" json-chars-upto-2500 "\\""`);
  assert.equal(
    ruleOf(g, "json-chars-upto-2500"),
    "json-chars-below-1000 | json-chars-1000 json-chars-upto-1500",
  );
  assert.equal(
    ruleOf(g, "json-chars-upto-1500"),
    "json-chars-below-1000 | json-chars-1000 char{0,500}",
  );
  const re = toRegExp(g);
  for (const n of [0, 999, 1000, 1001, 2000, 2500]) {
    assert.match(`"${"x".repeat(n)}"`, re);
  }
  assert.doesNotMatch(`"${"x".repeat(2501)}"`, re);
  await gbnf({ type: "array", minItems: 1500, maxItems: 4000 });
});

test("jsonSchemaToGbnf() writes exact formats", async () => {
  const g = await gbnf({
    type: "array",
    prefixItems: [
      { type: "string", format: "date" },
      { type: "string", format: "time" },
      { type: "string", format: "date-time" },
      { type: "string", format: "uuid" },
      { type: "string", format: "email" },
    ],
    items: false,
    minItems: 5,
  });
  assert.equal(
    ruleOf(g, "json"),
    `"[" space date-string "," space time-string "," space date-time-string "," space uuid-string "," space string space "]"`,
  );
  const [date, time, dateTime, uuid, email] = [
    "date-string",
    "time-string",
    "date-time-string",
    "uuid-string",
    "string",
  ].map((rule) => toRegExp(g, rule));
  assert.match('"2024-02-28"', date!);
  assert.doesNotMatch('"2024-02-30"', date!);
  assert.doesNotMatch('"2024-04-31"', date!);
  assert.match('"23:59:59.123+05:30"', time!);
  assert.doesNotMatch('"24:00:00Z"', time!);
  assert.match('"2024-12-31T00:00:00Z"', dateTime!);
  assert.match('"123e4567-e89b-12d3-a456-426614174000"', uuid!);
  assert.match('"not an email"', email!);
});

test("jsonSchemaToGbnf() converts simple patterns", async () => {
  const cases: [string, string[], string[]][] = [
    ["^[A-Z]{2}-\\d{3}$", ['"AB-123"'], ['"AB-12"', '"ab-123"', '"AB-1234"']],
    ["^(foo|ba[rz])+\\.txt$", ['"foo.txt"', '"barbaz.txt"'], [
      '"qux.txt"',
      '"foo.txt2"',
    ]],
    ["colou?r", ['"color"', '"my colour!"'], ['"colr"']],
    ['^a"b\\\\c\\n$', ['"a\\"b\\\\c\\n"'], ['"a\\"b\\\\c"']],
    ["^[^a-y]$", ['"z"', '"\\""', '"é"'], ['"a"', '"zz"']],
    ["^\\w+@\\w+\\.com$|^n/a$", ['"me@x.com"', '"n/a"'], ['"me@x.org"']],
  ];
  for (const [pattern, ok, bad] of cases) {
    const g = await gbnf({ type: "string", pattern });
    const re = toRegExp(g);
    for (const s of ok) {
      assert.match(s, re, `${s} vs ${pattern}`);
      assert.match(JSON.parse(s), new RegExp(pattern, "u"));
    }
    for (const s of bad) assert.doesNotMatch(s, re, `${s} vs ${pattern}`);
  }
  assert.equal(
    ruleOf(
      await gbnf({ type: "string", pattern: "^[A-Z]{2}-\\d{3}$" }),
      "json",
    ),
    `"\\"" [A-Z]{2} "-" [0-9]{3} "\\""`,
  );
});

test("jsonSchemaToGbnf() gives each $ref target one rule, so recursion works", async () => {
  const g = await gbnf({
    $defs: {
      Node: {
        type: "object",
        properties: {
          value: { type: "integer" },
          children: { type: "array", items: { $ref: "#/$defs/Node" } },
        },
        required: ["value"],
        additionalProperties: false,
      },
    },
    type: "object",
    properties: {
      root: { $ref: "#/$defs/Node" },
      other: { $ref: "#/definitions/Leaf" },
    },
    definitions: { Leaf: { type: "boolean" } },
    required: ["root", "other"],
    additionalProperties: false,
  });
  assert.equal(
    ruleOf(g, "json-root-kv"),
    `"\\"root\\"" space ":" space json-defs-Node`,
  );
  assert.match(ruleOf(g, "json-defs-Node-children"), /json-defs-Node\b/);
  assert.equal(ruleOf(g, "json-definitions-Leaf"), "boolean");
});

test("jsonSchemaToGbnf() handles awkward keys, root references and older tuple forms", async () => {
  const g = await gbnf({
    type: "object",
    properties: {
      "名前": { type: "string", maxLength: 3 },
      "": { type: "null" },
      'a"b\\c': { type: "boolean" },
      never: false,
      pair: {
        type: "array",
        items: [{ type: "integer" }, { type: "null" }],
        additionalItems: false,
      },
    },
  });
  const re = toRegExp(g);
  assert.match('{"名前":"ab","":null,"a\\"b\\\\c":true}', re);
  assert.match('{"pair":[1,null],"other":1}', re);
  assert.doesNotMatch('{"pair":[1,null,2]}', re);
  assert.doesNotMatch('{"never":1}', re); // neither as declared nor as extra key
  const tree = toRegExp(
    await gbnf({
      type: "object",
      properties: { kid: { $ref: "#" } },
      additionalProperties: false,
    }),
  );
  assert.match('{"kid":{"kid":{}}}', tree);
});

test("JSON_OBJECT_GBNF matches any JSON object and only objects", async () => {
  await accepted(JSON_OBJECT_GBNF);
  assert.ok(JSON_OBJECT_GBNF.startsWith("root ::= object\n"));
  const re = toRegExp(JSON_OBJECT_GBNF);
  assert.match('{"a": "b", "c": 1.5e3, "d": [{}, null, [true]]}', re);
  assert.doesNotMatch("[1]", re);
});

test("GbnfBuilder composes a tool-call grammar from literals and schemas", async () => {
  const b = new GbnfBuilder({ strict: true });
  const defs = (type: string) => ({
    $defs: { Arg: { type } },
    type: "object",
    properties: { x: { $ref: "#/$defs/Arg" } },
    required: ["x"],
  });
  const weather = b.schema(defs("string"), "tool-weather");
  const add = b.schema(defs("integer"), "tool-add");
  const call = (name: string, args: string) =>
    b.rule(
      `call-${name}`,
      `${b.literal(`{"name": "${name}", "arguments": `)} ${args} ${
        b.literal("}")
      }`,
    );
  const body = `${b.literal("<tool_call>\n")} (${call("weather", weather)} | ${
    call("add", add)
  }) ${b.literal("\n</tool_call>")}`;
  assert.equal(b.literal("<tool_call>\n"), `"<tool_call>\\n"`);
  const g = await accepted(b.build(body));
  assert.equal(ruleOf(g, "tool-weather-defs-Arg"), "string");
  assert.equal(ruleOf(g, "tool-add-defs-Arg"), "integer");
  const re = toRegExp(g);
  assert.match(
    '<tool_call>\n{"name": "add", "arguments": {"x": 4}}\n</tool_call>',
    re,
  );
  assert.doesNotMatch(
    '<tool_call>\n{"name": "add", "arguments": {"x": "4"}}\n</tool_call>',
    re,
  );
  assert.throws(() => new GbnfBuilder().build("missing-rule"), /missing-rule/);
});

test("GbnfBuilder.rule() reuses identical rules and renames clashing ones", async () => {
  const b = new GbnfBuilder();
  assert.equal(b.rule("x", '"a"'), "x");
  assert.equal(b.rule("x", '"a"'), "x");
  assert.equal(b.rule("x", '"b"'), "x-2");
  assert.equal(b.rule("string", '"s"'), "string-2"); // shared rule names stay theirs
  assert.equal(b.rule("my rule!", '"c"'), "my-rule");
  const g = await accepted(b.build("x x-2 string-2 my-rule space string"));
  assert.match(g, /^space ::= /m); // shared rules used by raw bodies are added
  assert.match(g, /^string ::= "\\"" char\* "\\""$/m);
});

test("GbnfBuilder.schema() leaves the builder unchanged when it throws", async () => {
  const b = new GbnfBuilder();
  const ok = b.schema({ type: "boolean" }, "a");
  const before = b.build(ok);
  assert.throws(
    () => b.schema({ type: "object", properties: { x: { not: {} } } }, "b"),
    SchemaError,
  );
  assert.equal(b.build(ok), before);
  await accepted(before);
});

// --- refusals ---

test("jsonSchemaToGbnf() refuses an unknown keyword and names its path", () => {
  throwsSchemaError(
    () =>
      jsonSchemaToGbnf({
        type: "object",
        properties: {
          tags: { type: "array", items: { type: "string" }, uniqueItems: true },
        },
      }),
    "properties.tags.uniqueItems",
    /unsupported keyword "uniqueItems"/,
  );
  throwsSchemaError(
    () => jsonSchemaToGbnf({ type: "integer", multipleOf: 5 }),
    "multipleOf",
    /multipleOf/,
  );
});

test("jsonSchemaToGbnf() refuses an unsupported pattern and names its path", () => {
  for (
    const pattern of ["^(?=a)b$", "^(a)\\1$", "\\bword\\b", "^\\p{L}+$", "^a$b"]
  ) {
    throwsSchemaError(
      () =>
        jsonSchemaToGbnf({
          type: "object",
          properties: { code: { type: "string", pattern } },
        }),
      "properties.code.pattern",
      /not supported/,
    );
  }
  throwsSchemaError(
    () => jsonSchemaToGbnf({ type: "string", pattern: "(" }),
    "pattern",
    /invalid regular expression/,
  );
});

test("jsonSchemaToGbnf() refuses a schema nested deeper than 32 levels", () => {
  let schema: unknown = { type: "string" };
  for (let i = 0; i < 40; i++) schema = { type: "array", items: schema };
  throwsSchemaError(
    () => jsonSchemaToGbnf(schema),
    Array(33).fill("items").join("."),
    /deeper than 32/,
  );
});

test("jsonSchemaToGbnf() refuses grammars with too many rules", () => {
  const properties = Object.fromEntries(
    Array.from(
      { length: 1200 },
      (_, i) => [`p${i}`, { type: "string", maxLength: 3 }],
    ),
  );
  throwsSchemaError(
    () => jsonSchemaToGbnf({ type: "object", properties }),
    "properties.p999",
    /more than 2000 rules/,
  );
  const long = Object.fromEntries(
    Array.from(
      { length: 60 },
      (_, i) => [`p${i}`, { type: "string", maxLength: 1999 }],
    ),
  );
  throwsSchemaError(
    () => jsonSchemaToGbnf({ type: "object", properties: long }),
    "properties.p50",
    /expand to more than 100000 rules/,
  );
});

test("jsonSchemaToGbnf() refuses constraints it cannot enforce", async () => {
  const cases: [unknown, string, RegExp][] = [
    [{ allOf: [{ type: "string" }, { maxLength: 3 }] }, "allOf", /exactly one/],
    [{ $ref: "https://example.com/s.json" }, "$ref", /only local/],
    [{ $ref: "#/$defs/Missing" }, "$ref", /does not resolve/],
    [
      {
        $defs: { A: { anyOf: [{ $ref: "#/$defs/A" }, { type: "null" }] } },
        $ref: "#/$defs/A",
      },
      "$defs.A",
      /left recursion/,
    ],
    [
      {
        type: "object",
        properties: { a: { type: "string" } },
        minProperties: 2,
      },
      "minProperties",
      /minProperties/,
    ],
    [{ type: "string", anyOf: [{ maxLength: 2 }] }, "type", /next to "anyOf"/],
    [{ type: "string", format: "date", maxLength: 3 }, "format", /format date/],
    [{ type: "integer", minimum: 5, maximum: 4 }, "", /no integer/],
    [{ type: "array", items: false, minItems: 1 }, "minItems", /minItems/],
    [false, "", /admits no value/],
  ];
  for (const [schema, path, what] of cases) {
    throwsSchemaError(() => jsonSchemaToGbnf(schema), path, what);
  }
  // minProperties 1 over optional keys is one shape: at least one of them
  const one = {
    type: "object",
    properties: { a: { type: "null" } },
    minProperties: 1,
  };
  const re = toRegExp(await gbnf(one));
  assert.doesNotMatch("{}", re);
  assert.match('{"a":null}', re);
});

// --- generation on the fixture model ---

const PROMPT =
  "<|im_start|>user\nJSON please<|im_end|>\n<|im_start|>assistant\n";
const MAX_TOKENS = 400;

/** Samples up to MAX_TOKENS with grammar + greedy (seed null) or grammar + dist(seed). */
function generate(
  m: LoadedLlama,
  grammar: string,
  seed: number | null,
): { text: string; finished: boolean } {
  const s = m.llama.symbols;
  const chain = s.llama_sampler_chain_init(new Uint8Array([1]))!;
  const g = s.llama_sampler_init_grammar(m.vocab, cstr(grammar), cstr("root"));
  assert.ok(g, `llama.cpp refused the grammar:\n${grammar}`);
  s.llama_sampler_chain_add(chain, g); // first: masks what the grammar forbids
  s.llama_sampler_chain_add(
    chain,
    seed === null
      ? s.llama_sampler_init_greedy()
      : s.llama_sampler_init_dist(seed),
  );
  try {
    m.clearSeq(0);
    const prompt = m.tokenize(PROMPT, false);
    m.batch.clear();
    prompt.forEach((t, i) => m.batch.add(t, i, 0, i === prompt.length - 1));
    if (m.decode() !== 0) throw new Error("prompt decode failed");
    const bytes: number[] = [];
    const text = () =>
      new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array(bytes));
    for (let i = 0; i < MAX_TOKENS; i++) {
      const tok = m.sample(chain, m.batch.n - 1);
      if (m.isEog(tok)) return { text: text(), finished: true };
      bytes.push(...m.piece(tok));
      m.batch.clear();
      m.batch.add(tok, prompt.length + i, 0, true);
      if (m.decode() !== 0) throw new Error("decode failed");
    }
    return { text: text(), finished: false };
  } finally {
    s.llama_sampler_free(chain);
  }
}

function validator() {
  const ajv = new Ajv2020({ allErrors: true });
  const date = (s: string) => {
    const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s);
    if (!m) return false;
    const d = new Date(Date.UTC(+m[1]!, +m[2]! - 1, +m[3]!));
    return d.getUTCMonth() === +m[2]! - 1 && d.getUTCDate() === +m[3]!;
  };
  const time = (s: string) =>
    /^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$/
      .test(s);
  ajv.addFormat("date", date);
  ajv.addFormat("time", time);
  ajv.addFormat(
    "date-time",
    (s: string) => date(s.slice(0, 10)) && s[10] === "T" && time(s.slice(11)),
  );
  ajv.addFormat(
    "uuid",
    /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i,
  );
  return ajv;
}

const GENERATED: { what: string; schema: Record<string, unknown> }[] = [
  {
    what:
      "a nested object with enum, integer, boolean and a bounded string array",
    schema: {
      type: "object",
      properties: {
        name: { type: "string", maxLength: 12 },
        kind: { enum: ["cat", "dog", "bird"] },
        age: { type: "integer", minimum: 0, maximum: 120 },
        ok: { type: "boolean" },
        tags: {
          type: "array",
          items: { type: "string", maxLength: 6 },
          maxItems: 3,
        },
        owner: {
          type: "object",
          properties: {
            id: { type: "integer" },
            since: { type: "string", format: "date" },
          },
          required: ["id", "since"],
        },
      },
      required: ["name", "kind", "age", "ok", "tags", "owner"],
    },
  },
  {
    what: "anyOf",
    schema: {
      anyOf: [
        { type: "integer", minimum: -5, maximum: 5 },
        { type: "string", minLength: 1, maxLength: 4 },
        {
          type: "object",
          properties: { x: { type: "number", minimum: 0, maximum: 1 } },
          required: ["x"],
        },
      ],
    },
  },
  {
    what: "type arrays with null",
    schema: {
      type: "object",
      properties: {
        note: { type: ["string", "null"], maxLength: 10 },
        score: { type: ["integer", "null"], minimum: 1, maximum: 5 },
        list: {
          type: ["array", "null"],
          items: { type: "boolean" },
          maxItems: 2,
        },
      },
      required: ["note", "score", "list"],
    },
  },
  {
    what: "const values",
    schema: {
      type: "object",
      properties: {
        version: { const: 2 },
        mode: { const: "fast" },
        flags: { const: [1, true, null] },
      },
      required: ["version", "mode", "flags"],
    },
  },
  {
    what: "formats, a pattern and a tuple",
    schema: {
      type: "object",
      properties: {
        id: { type: "string", format: "uuid" },
        code: { type: "string", pattern: "^[A-Z]{2}-\\d{3}$" },
        at: { type: "string", format: "date-time" },
        pair: {
          type: "array",
          prefixItems: [{ type: "boolean" }, {
            type: "number",
            minimum: -1,
            maximum: 1,
          }],
          items: false,
          minItems: 2,
        },
      },
      required: ["id", "code", "at", "pair"],
    },
  },
];

for (const { what, schema } of GENERATED) {
  test(`jsonSchemaToGbnf() grammars make the model emit valid JSON: ${what}`, async () => {
    const { m } = await model();
    const grammar = await gbnf(schema, { strict: true });
    const validate = validator().compile(schema);
    for (const seed of [null, 1, 2, 3]) {
      const { text, finished } = generate(m, grammar, seed);
      const run = `${seed === null ? "greedy" : `seed ${seed}`}: ${
        JSON.stringify(text)
      }`;
      assert.ok(
        finished,
        `did not finish within ${MAX_TOKENS} tokens (${run})`,
      );
      const value = JSON.parse(text);
      assert.ok(validate(value), `${run}\n${JSON.stringify(validate.errors)}`);
    }
  });
}

test("jsonSchemaToGbnf() grammars let the model recurse through $ref and still emit valid JSON", async () => {
  // no grammar can bound recursion depth, and greedy decoding on random
  // weights keeps opening children (each step valid), so this samples and
  // asks that most runs close the tree
  const schema = {
    $defs: {
      Node: {
        type: "object",
        properties: {
          v: { type: "integer", minimum: 0, maximum: 9 },
          kids: { type: "array", items: { $ref: "#/$defs/Node" }, maxItems: 2 },
        },
        required: ["v"],
      },
    },
    $ref: "#/$defs/Node",
  };
  const { m } = await model();
  const grammar = await gbnf(schema, { strict: true });
  const validate = validator().compile(schema);
  const depths: number[] = [];
  for (let seed = 1; seed <= 8; seed++) {
    const { text, finished } = generate(m, grammar, seed);
    if (!finished) continue;
    const value = JSON.parse(text);
    assert.ok(
      validate(value),
      `seed ${seed}: ${text}\n${JSON.stringify(validate.errors)}`,
    );
    depths.push(depth(value));
  }
  assert.ok(depths.length >= 4, `only ${depths.length} of 8 runs finished`);
  assert.ok(Math.max(...depths) >= 3, `depths ${depths}`);
});

/** Nesting depth of a JSON value. */
function depth(v: unknown): number {
  if (typeof v !== "object" || v === null) return 0;
  return 1 + Math.max(0, ...Object.values(v).map(depth));
}

test("GbnfBuilder tool-call grammars make the model emit a parsable call", async () => {
  const { m } = await model();
  const b = new GbnfBuilder({ strict: true });
  const args = b.schema({
    type: "object",
    properties: {
      city: { type: "string", maxLength: 8 },
      days: { type: "integer", minimum: 1, maximum: 7 },
    },
    required: ["city", "days"],
  }, "tool-weather");
  const grammar = await accepted(
    b.build(
      `${b.literal('<tool_call>\n{"name": "weather", "arguments": ')} ${args} ${
        b.literal("}\n</tool_call>")
      }`,
    ),
  );
  for (const seed of [null, 7]) {
    const { text, finished } = generate(m, grammar, seed);
    assert.ok(finished, text);
    const call = JSON.parse(
      text.replace(/^<tool_call>\n|\n<\/tool_call>$/g, ""),
    );
    assert.equal(call.name, "weather");
    assert.deepEqual(Object.keys(call.arguments), ["city", "days"]);
  }
});

test("looseSchema() drops what it cannot enforce, keeps the rest exact and says where", async () => {
  const b = new GbnfBuilder();
  // Claude Code's SendMessage: a string with allOf of two patterns
  const { rule, loosened } = b.looseSchema({
    type: "object",
    properties: {
      to: {
        type: "string",
        allOf: [{ pattern: "^[^\\n\\r]*$" }, { pattern: "^[\\s\\S]{0,300}$" }],
      },
      n: { type: "integer", minimum: 1, maximum: 3, not: { const: 2 } },
    },
    required: ["to", "n"],
    additionalProperties: false,
  }, "tool-0");
  assert.deepEqual(loosened, ["properties.to.allOf", "properties.n.not"]);
  const re = toRegExp(await accepted(b.build(rule)));
  assert.match('{"to": "main", "n": 2}', re);
  assert.match('{"to": "a\\nb", "n": 3}', re); // the patterns are gone
  assert.doesNotMatch('{"to": 1, "n": 2}', re); // the type stays
  assert.doesNotMatch('{"to": "main", "n": 4}', re); // so do the bounds
  assert.doesNotMatch('{"to": "main"}', re); // and required
});

test("looseSchema() is exact where schema() is, and reads a schema it cannot convert at all as any object", async () => {
  const exact = { type: "object", properties: { a: { type: "string" } } };
  const b = new GbnfBuilder();
  const r = b.looseSchema(exact, "t");
  assert.deepEqual(r.loosened, []);
  const e = new GbnfBuilder();
  assert.equal(b.build(r.rule), e.build(e.schema(exact, "t")));
  const cyclic = {
    $defs: { A: { anyOf: [{ $ref: "#/$defs/A" }, { type: "null" }] } },
    $ref: "#/$defs/A",
  };
  const c = new GbnfBuilder();
  const any = c.looseSchema(cyclic, "t");
  assert.deepEqual(any.loosened, [""]);
  const re = toRegExp(await accepted(c.build(any.rule)));
  assert.match('{"x": [1, "y"]}', re);
  assert.doesNotMatch("null", re);
});

test("jsonSchemaToGbnf() takes propertyNames that every object meets (Claude Code's AskUserQuestion)", async () => {
  const re = toRegExp(
    await gbnf({
      type: "object",
      propertyNames: { type: "string" },
      additionalProperties: { type: "string" },
    }),
  );
  assert.match('{"q": "a"}', re);
  assert.doesNotMatch('{"q": 1}', re);
  throwsSchemaError(
    () => jsonSchemaToGbnf({ type: "object", propertyNames: { maxLength: 3 } }),
    "propertyNames",
    /unsupported keyword/,
  );
});

test("llama.cpp takes the tool-call grammar of Claude Code's 24 interactive tools, one of them loosened", async () => {
  const capture = JSON.parse(
    await Deno.readTextFile(
      new URL(
        "../../tests/fixtures/agents/claude_code_interactive.json",
        import.meta.url,
      ),
    ),
  );
  const tools = (capture.body.tools as Record<string, unknown>[]).map((t) => ({
    type: "function",
    function: { name: t.name, parameters: t.input_schema },
  }));
  for (const family of ["hermes", "llama3", "mistral"] as const) {
    const g = outputGrammar(parseOutputControls({ tools }), family);
    assert.deepEqual(g.loose, ["SendMessage"]);
    await accepted(g.spec!.gbnf);
  }
});

test("the shared fixture model closes", async () => {
  if (!shared) return;
  const { llama, m, dir } = await shared;
  m.close();
  llama.close();
  await Deno.remove(dir, { recursive: true });
  shared = null;
});
