/**
 * Quotas and budgets that count what was used: a day or month limit set
 * mid-window starts from the window's real usage; a refusal caused only
 * by what requests in flight hold is a retryable 429; one for quota
 * really spent says what is left and what the request needs, and stops
 * retries; a request larger than the limit itself fails at once, and the
 * openai SDK does not retry it.
 */
import assert from "node:assert/strict";
import { priceTinyChat } from "./_helpers.ts";
import OpenAI from "openai";
import { createWorld, type World } from "../gateway/_testing.ts";
import { updateApiKey } from "../store/api_keys.ts";
import { listAlerts } from "../store/budget_alerts.ts";
import { setTenantBudget } from "../store/budgets.ts";
import { setTenantLimits } from "../store/limits.ts";
import { SYSTEM } from "../store/principal.ts";
import { counterValue, quotaStatus, windowOf } from "../store/quota/mod.ts";
import type { UsageRecord } from "../store/usage.ts";
import { writeUsage } from "../store/usage_rollups.ts";

const chat: OpenAI.ChatCompletionCreateParamsNonStreaming = {
  model: "tiny-chat",
  messages: [{ role: "user", content: "Hi" }],
  max_tokens: 5,
};

function used(w: World, tokens: number): UsageRecord {
  return {
    id: crypto.randomUUID(),
    at: new Date().toISOString(),
    requestId: "before",
    tenantId: w.tenant.id,
    keyId: w.keyId,
    model: "tiny-chat",
    nodeId: null,
    endpoint: "chat",
    promptTokens: tokens - 136,
    completionTokens: 136,
    latencyMs: 5,
    ttftMs: null,
    status: 200,
    outcome: "ok",
  };
}

/** The request's worst case in tokens, as the gateway counts it (from a too-large refusal). */
async function worstCase(w: World): Promise<number> {
  await setTenantLimits(w.store, SYSTEM, w.tenant.id, { tpm: 1 });
  const r = await w.post("/v1/chat/completions", chat);
  const { error } = await r.json();
  await setTenantLimits(w.store, SYSTEM, w.tenant.id, {});
  const m = /Requested (\d+)\./.exec(error.message);
  assert.ok(m, error.message);
  return Number(m[1]);
}

/** OpenAI SDK over a fetch that counts the requests it sends. */
function countingClient(w: World, maxRetries = 2) {
  const sent = { n: 0 };
  const client = new OpenAI({
    apiKey: w.key,
    baseURL: `${w.url}/v1`,
    maxRetries,
    fetch: (input: RequestInfo | URL, init?: RequestInit) => {
      sent.n++;
      return fetch(input, init);
    },
  });
  return { client, sent };
}

Deno.test("a tokens/month limit set after 1,136 tokens shows and enforces 1,136 used", async () => {
  const w = await createWorld();
  try {
    const need = await worstCase(w);
    await writeUsage(w.store, [used(w, 1_136)]);
    // one token short of what is left for the request's worst case
    await setTenantLimits(w.store, SYSTEM, w.tenant.id, {
      tokensPerMonth: 1_136 + need - 1,
    });
    const month = (await quotaStatus(w.store, SYSTEM, w.tenant.id))
      .find((q) => q.field === "tokensPerMonth")!;
    assert.equal(month.used, 1_136);
    const refused = await w.post("/v1/chat/completions", chat);
    assert.equal(refused.status, 429);
    assert.equal(refused.headers.get("x-should-retry"), "false");
    const { error } = await refused.json();
    assert.equal(error.code, "insufficient_quota");
    assert.match(
      error.message,
      new RegExp(
        `tokens per month \\(limit ${1_136 + need - 1}\\) has ${
          need - 1
        } tokens left; this request needs up to ${need} tokens`,
      ),
    );
    assert.equal(w.up.requests.length, 0, "a refused request reaches no node");
    // set again (or raised), the count stays what was used: never twice
    await setTenantLimits(w.store, SYSTEM, w.tenant.id, {
      tokensPerMonth: 1_136 + need,
    });
    assert.equal(
      await counterValue(
        w.store,
        `t:${w.tenant.id}`,
        windowOf("month", Date.now())[0],
      ),
      1_136,
    );
    const ok = await w.post("/v1/chat/completions", chat);
    assert.equal(ok.status, 200);
    await ok.body?.cancel();

    // a key's own tokens/day limit starts from what the key used today
    await updateApiKey(w.store, SYSTEM, w.keyId, {
      limits: { tokensPerDay: 100_000 },
    });
    await w.gw.idle();
    assert.ok(
      await counterValue(
        w.store,
        `k:${w.keyId}`,
        windowOf("day", Date.now())[0],
      ) >= 1_136,
    );
  } finally {
    await w.close();
  }
});

Deno.test("a refusal only for what requests in flight hold is a retryable 429; quota really spent is not", async () => {
  // answered at once, without waiting for the requests in flight
  const w = await createWorld({ gateway: { heldWaitMs: 0 } });
  try {
    const need = await worstCase(w);
    await setTenantLimits(w.store, SYSTEM, w.tenant.id, {
      tokensPerDay: 2 * need + Math.floor(need / 2),
    });
    w.up.script.prefillMs = 400;
    // two streams wait 400 ms for their first token, holding their worst case
    const inFlight = [0, 1].map(async () => {
      const r = await w.post("/v1/chat/completions", { ...chat, stream: true });
      return { status: r.status, text: await r.text() };
    });
    const deadline = Date.now() + 5_000;
    while (w.up.requests.length < 2 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.equal(w.up.requests.length, 2, "both hold their worst case");
    const busy = await w.post("/v1/chat/completions", chat);
    assert.equal(busy.status, 429);
    assert.equal(busy.headers.get("x-should-retry"), null);
    assert.equal(busy.headers.get("retry-after"), "2");
    const { error } = await busy.json();
    assert.equal(error.code, "rate_limit_exceeded");
    assert.match(error.message, /held by requests in flight/);
    assert.match(error.message, new RegExp(`needs up to ${need} tokens`));

    // the openai SDK retries it, and once they settle it is served
    const { client, sent } = countingClient(w);
    const served = await client.chat.completions.create(chat);
    assert.equal(served.choices[0]!.message.content, "Hello world!");
    for (const r of await Promise.all(inFlight)) {
      assert.equal(r.status, 200);
      assert.match(r.text, /data: \[DONE\]/);
    }
    assert.ok(sent.n >= 2, `${sent.n} sent: refused, then retried`);
    w.up.script.prefillMs = 0;

    // Spent for real: what is left is under the request's worst case.
    await w.gw.idle();
    const day = windowOf("day", Date.now())[0];
    const spent = await counterValue(w.store, `t:${w.tenant.id}`, day);
    await setTenantLimits(w.store, SYSTEM, w.tenant.id, {
      tokensPerDay: spent + need - 1,
    });
    const { client: once, sent: tries } = countingClient(w);
    const e = await once.chat.completions.create(chat).catch((e) => e);
    assert.ok(e instanceof OpenAI.RateLimitError, String(e));
    assert.equal(e.code, "insufficient_quota");
    assert.equal(tries.n, 1, "x-should-retry: false stops the SDK");
    assert.match(
      e.message,
      new RegExp(
        `has ${need - 1} tokens left; this request needs up to ${need}`,
      ),
    );
  } finally {
    await w.close();
  }
});

Deno.test("a request larger than tpm or a budget's whole amount fails at once: the openai SDK does not retry", async () => {
  const w = await createWorld({ limits: { tpm: 50 } });
  try {
    const { client, sent } = countingClient(w);
    const started = performance.now();
    const big: OpenAI.ChatCompletionCreateParamsNonStreaming = {
      model: "tiny-chat",
      messages: [{ role: "user", content: "word ".repeat(200) }],
      max_tokens: 5,
    };
    const e = await client.chat.completions.create(big).catch((e) => e);
    assert.ok(e instanceof OpenAI.RateLimitError, String(e));
    assert.equal(sent.n, 1, "no retries");
    assert.ok(performance.now() - started < 2_000, "fails at once");
    assert.equal(e.code, "rate_limit_exceeded");
    assert.equal(e.headers.get("x-should-retry"), "false");
    assert.equal(e.headers.get("retry-after"), null);
    assert.match(
      e.message,
      /^429 Request too large for tiny-chat for your organization on tokens per min \(TPM\): Limit 50, Requested \d+\. The input or output tokens must be reduced/,
    );
    assert.equal(w.up.requests.length, 0);

    // a hard budget smaller than the request's worst case, likewise
    await setTenantLimits(w.store, SYSTEM, w.tenant.id, {});
    const need = await worstCase(w);
    await setTenantBudget(w.store, SYSTEM, w.tenant.id, "tokens", {
      amount: need - 1,
      hard: true,
    });
    const { client: c2, sent: s2 } = countingClient(w);
    const b = await c2.chat.completions.create(chat).catch((e) => e);
    assert.ok(b instanceof OpenAI.RateLimitError, String(b));
    assert.equal(s2.n, 1);
    assert.equal(b.headers.get("retry-after"), null);
    assert.match(
      b.message,
      new RegExp(
        `Request too large for your organization's monthly token budget of ${
          need - 1
        } tokens: Limit ${need - 1} tokens, Requested ${need} tokens`,
      ),
    );
    // a request too large for the budget is no sign the budget is reached
    await w.gw.idle();
    assert.deepEqual(
      (await listAlerts(w.store, SYSTEM, w.tenant.id)).items,
      [],
    );
  } finally {
    await w.close();
  }
});

Deno.test("200 concurrent requests against a hard budget of 1.00 wait for what requests in flight hold, and the openai SDK spends it up to the limit, never past it", async () => {
  const w = await createWorld();
  try {
    await priceTinyChat(w.store);
    await setTenantBudget(w.store, SYSTEM, w.tenant.id, "money", {
      amount: "1.00",
      hard: true,
    });
    const budget = 1_000_000;
    const { client } = countingClient(w);
    const results = await Promise.all(
      Array.from(
        { length: 200 },
        () =>
          client.chat.completions.create(chat).then(
            (c) => c.usage!,
            (e) => e as InstanceType<typeof OpenAI.APIError>,
          ),
      ),
    );
    const served = results.filter((r) => !(r instanceof OpenAI.APIError)) as {
      prompt_tokens: number;
      completion_tokens: number;
    }[];
    const refused = results.filter((r) =>
      r instanceof OpenAI.APIError
    ) as InstanceType<typeof OpenAI.APIError>[];
    const spent = served.reduce(
      (a, u) => a + u.prompt_tokens * 1000 + u.completion_tokens * 2000,
      0,
    );
    assert.ok(spent <= budget, `spent ${spent} of ${budget}`);
    // each request's worst case (its prompt bound and max_tokens) is about
    // three times what it costs: a wave admits a third of what it could
    // pay for, the rest wait for it to settle and are admitted then
    const worst = Number(
      /needs up to 0\.(\d+) EUR/.exec(refused[0]!.message)?.[1]?.padEnd(6, "0"),
    );
    assert.ok(worst > 0, refused[0]!.message);
    assert.ok(
      budget - spent < worst,
      `used up to the limit: ${spent} of ${budget}, a request needs ${worst}`,
    );
    assert.ok(served.length > budget / worst, `${served.length} served`);
    // what is left is too little for any of them: used up, not retryable
    for (const e of refused) {
      assert.equal(e.status, 429);
      assert.equal(e.code, "insufficient_quota", e.message);
      assert.equal(e.headers?.get("x-should-retry"), "false");
    }
    await w.gw.idle();
    assert.equal(
      await counterValue(
        w.store,
        `t:${w.tenant.id}`,
        windowOf("spend", Date.now())[0],
      ),
      spent,
      "the budget's counter holds exactly what was billed",
    );
  } finally {
    await w.close();
  }
});
