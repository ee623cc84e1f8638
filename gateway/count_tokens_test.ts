import assert from "node:assert/strict";
import { createWorld, MODELS } from "./_testing.ts";

const BODY = {
  model: "tiny-chat",
  max_tokens: 16,
  system: "Be brief.",
  messages: [{ role: "user", content: "Hello there" }],
};

/** A node answering `POST /orchard/count_tokens` with `answer`, recording the bodies it got. */
function countingNode(answer: (body: Record<string, unknown>) => Response) {
  const got: Record<string, unknown>[] = [];
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    async (req) => {
      const url = new URL(req.url);
      if (req.method !== "POST" || url.pathname !== "/orchard/count_tokens") {
        return new Response("not found", { status: 404 });
      }
      const body = await req.json();
      got.push(body);
      return answer(body);
    },
  );
  return {
    url: `http://127.0.0.1:${server.addr.port}`,
    got,
    close: () => server.shutdown(),
  };
}

async function count(w: Awaited<ReturnType<typeof createWorld>>) {
  const res = await w.post("/v1/messages/count_tokens", BODY);
  return {
    status: res.status,
    header: res.headers.get("x-orchard-token-count"),
    body: await res.json(),
  };
}

Deno.test("countTokens() asks a node serving the model, with the chat request it would be sent", async () => {
  const w = await createWorld();
  const node = countingNode(() =>
    Response.json({ prompt_tokens: 1234, context_length: 2048 })
  );
  try {
    // node-a (the scripted upstream) cannot count: the next node does
    w.fleet.add("node-b", node.url, MODELS);
    const r = await count(w);
    assert.equal(r.status, 200);
    assert.deepEqual(r.body, { input_tokens: 1234 });
    assert.equal(r.header, "exact");
    const sent = node.got[0]!;
    assert.equal(sent.model, "tiny-chat");
    assert.deepEqual(sent.messages, [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hello there" },
    ]);
  } finally {
    await node.close();
    await w.close();
  }
});

Deno.test("countTokens() answers the estimate, and says so, when no node can count", async () => {
  const w = await createWorld();
  try {
    w.fleet.list[0]!.url = "http://127.0.0.1:9"; // nothing listens there
    const r = await count(w);
    assert.equal(r.status, 200);
    assert.ok(r.body.input_tokens > 0);
    assert.match(r.header!, /^estimate/);
  } finally {
    await w.close();
  }
});

Deno.test("countTokens() passes a node's refusal of the request on in Anthropic's shape", async () => {
  const w = await createWorld();
  const node = countingNode(() =>
    Response.json({
      error: {
        message:
          "The model's chat template refused these messages: roles must alternate",
        type: "invalid_request_error",
        param: "messages",
        code: "invalid_value",
      },
    }, { status: 400 })
  );
  try {
    w.fleet.list[0]!.url = node.url;
    const r = await count(w);
    assert.equal(r.status, 400);
    assert.equal(r.body.type, "error");
    assert.equal(r.body.error.type, "invalid_request_error");
    assert.match(r.body.error.message, /roles must alternate/);
  } finally {
    await node.close();
    await w.close();
  }
});
