import assert from "node:assert/strict";
import { outputGrammar } from "./constraints.ts";
import { parseOutputControls } from "../../protocol/openai/output_controls.ts";
import { OpenAIError } from "../../protocol/openai/errors.ts";

type Obj = Record<string, unknown>;

/** Claude Code's 24 interactive tools, as chat tools. */
const CLAUDE_TOOLS = (JSON.parse(
  Deno.readTextFileSync(
    new URL(
      "../../tests/fixtures/agents/claude_code_interactive.json",
      import.meta.url,
    ),
  ),
).body.tools as Obj[]).map((t) => ({
  type: "function",
  function: { name: t.name, parameters: t.input_schema },
}));

const UNENFORCEABLE = {
  type: "object",
  properties: { to: { type: "string", allOf: [{ pattern: "^a" }, {}] } },
};

const tool = (name: string, parameters: Obj, strict?: boolean) => ({
  type: "function",
  function: { name, parameters, ...(strict === undefined ? {} : { strict }) },
});

Deno.test("outputGrammar() loosens Claude Code's one unenforceable tool schema and names it", () => {
  for (const tool_choice of ["auto", "required"]) {
    const g = outputGrammar(
      parseOutputControls({ tools: CLAUDE_TOOLS, tool_choice }),
      "hermes",
    );
    assert.deepEqual(g.loose, ["SendMessage"], tool_choice);
    assert.ok(g.spec?.gbnf.includes('"\\"SendMessage\\""'));
  }
});

Deno.test("outputGrammar() refuses an unenforceable schema on a strict tool, naming it", () => {
  const tools = [tool("A", { type: "object" }), tool("B", UNENFORCEABLE, true)];
  assert.throws(
    () => outputGrammar(parseOutputControls({ tools }), "hermes"),
    (e) =>
      e instanceof OpenAIError && e.status === 400 &&
      e.param === "tools[1].function.parameters" &&
      /"type" next to "allOf"/.test(e.message),
  );
  const ok = outputGrammar(
    parseOutputControls({ tools: [tool("B", UNENFORCEABLE, false)] }),
    "mistral",
  );
  assert.deepEqual(ok.loose, ["B"]);
});

Deno.test("outputGrammar() reports nothing loose when every schema is exact", () => {
  const g = outputGrammar(
    parseOutputControls({ tools: [tool("A", { type: "object" })] }),
    "llama3",
  );
  assert.deepEqual(g.loose, []);
  assert.equal(outputGrammar(parseOutputControls({}), "hermes").spec, null);
});
