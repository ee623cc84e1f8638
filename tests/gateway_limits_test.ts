/** Exactness of admission through the whole gateway under concurrency. */
import assert from "node:assert/strict";
import { priceTinyChat } from "./_helpers.ts";
import { awayFromMinuteEdge, createWorld } from "../gateway/_testing.ts";
import { parseSSE } from "../lib/sse.ts";
import { listAudit } from "../store/audit.ts";
import { setKeyBudget, setTenantBudget } from "../store/budgets.ts";
import { perMillion } from "../store/money.ts";
import { SYSTEM } from "../store/principal.ts";
import {
  counterValue,
  countReservations,
  windowOf,
} from "../store/quota/mod.ts";
import { type CommitStats, denokvLimits } from "../store/quota/_testing.ts";

Deno.test("500 concurrent requests against a 100-request window admit exactly 100", async () => {
  await awayFromMinuteEdge();
  const w = await createWorld({ limits: { rpm: 100 } });
  try {
    const body = {
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 5,
    };
    const statuses = await Promise.all(Array.from({ length: 500 }, async () => {
      const r = await w.post("/v1/chat/completions", body);
      await r.body?.cancel();
      return r.status;
    }));
    assert.equal(statuses.filter((s) => s === 200).length, 100);
    assert.equal(statuses.filter((s) => s === 429).length, 400);
    assert.equal(w.up.requests.length, 100);
  } finally {
    await w.close();
  }
});

Deno.test("100 concurrent streams against a small daily quota never exceed it and leave no reservation", async () => {
  const quota = 2000;
  const w = await createWorld({
    limits: { tokensPerDay: quota, concurrency: 50 },
  });
  try {
    const body = {
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 20,
      stream: true,
      stream_options: { include_usage: true },
    };
    const billed = await Promise.all(Array.from({ length: 100 }, async () => {
      const r = await w.post("/v1/chat/completions", body);
      if (r.status !== 200) {
        await r.body?.cancel();
        return 0;
      }
      const text = await r.text();
      const usage = parseSSE(text).filter((e) => e.data.startsWith("{")).map(
        (e) => JSON.parse(e.data),
      ).find((c) => c.usage)?.usage;
      return usage.total_tokens as number;
    }));
    await w.gw.idle();
    const used = await counterValue(
      w.store,
      `t:${w.tenant.id}`,
      windowOf("day", Date.now())[0],
    );
    const sum = billed.reduce((a, b) => a + b, 0);
    assert.ok(sum > 0 && sum <= quota, `billed ${sum}`);
    assert.equal(used, sum, "the counter holds exactly what was billed");
    assert.equal(await countReservations(w.store), 0);
    assert.equal(await counterValue(w.store, `t:${w.tenant.id}`, "conc"), 0);
  } finally {
    await w.close();
  }
});

Deno.test("key limits are tighter than the tenant's and refused requests consume nothing", async () => {
  await awayFromMinuteEdge();
  const w = await createWorld({ limits: { rpm: 100 } });
  try {
    const tight = await w.newKey({ limits: { rpm: 2 } });
    const body = {
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
    };
    const codes: number[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await w.post("/v1/chat/completions", body, {
        authorization: `Bearer ${tight.key}`,
      });
      codes.push(r.status);
      await r.body?.cancel();
    }
    assert.deepEqual(codes, [200, 200, 429]);
    const r = await w.post("/v1/chat/completions", body);
    assert.equal(r.status, 200);
    assert.equal(
      r.headers.get("x-ratelimit-remaining-requests"),
      "97",
      "refused requests consume nothing",
    );
    await r.body?.cancel();
  } finally {
    await w.close();
  }
});

Deno.test("a busy key's requests are admitted from leases and every counter ends exact", async () => {
  await awayFromMinuteEdge();
  const w = await createWorld({
    limits: { rpm: 100_000, tokensPerDay: 10_000_000, concurrency: 1000 },
  });
  try {
    const body = {
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 20,
    };
    let commits = 0;
    const atomic = w.kv.atomic.bind(w.kv);
    w.kv.atomic = () => {
      const op = atomic();
      const commit = op.commit.bind(op);
      op.commit = () => {
        commits++;
        return commit();
      };
      return op;
    };
    let billed = 0;
    let lastRemaining = Infinity;
    for (let wave = 0; wave < 10; wave++) {
      const rs = await Promise.all(
        Array.from({ length: 30 }, () => w.post("/v1/chat/completions", body)),
      );
      for (const r of rs) {
        assert.equal(r.status, 200);
        billed += (await r.json()).usage.total_tokens;
      }
      // One at a time, the remaining requests drop by exactly one, lease or not.
      const r = await w.post("/v1/chat/completions", body);
      billed += (await r.json()).usage.total_tokens;
      const remaining = Number(r.headers.get("x-ratelimit-remaining-requests"));
      assert.ok(remaining < lastRemaining);
      const again = await w.post("/v1/chat/completions", body);
      billed += (await again.json()).usage.total_tokens;
      assert.equal(
        Number(again.headers.get("x-ratelimit-remaining-requests")),
        remaining - 1,
      );
      lastRemaining = remaining - 1;
    }
    await w.gw.idle();
    // Admissions, lease settlements and usage writes: far fewer than one
    // commit per request.
    assert.ok(commits <= 40, `${commits} commits for 320 requests`);
    const t = `t:${w.tenant.id}`;
    assert.equal(w.up.requests.length, 320);
    assert.equal(
      await counterValue(w.store, t, windowOf("rpm", Date.now())[0]),
      320,
    );
    assert.equal(
      await counterValue(w.store, t, windowOf("day", Date.now())[0]),
      billed,
    );
    assert.equal(await counterValue(w.store, t, "conc"), 0);
    assert.equal(await countReservations(w.store), 0);
  } finally {
    await w.close();
  }
});

Deno.test("on a remote KV allowing 10 checks a commit (denokv), a key and its tenant with every limit and hard budget (12 counters) admit exactly", async () => {
  await awayFromMinuteEdge(10_000);
  const every = {
    rpm: 100_000,
    tpm: 100_000_000,
    concurrency: 10_000,
    tokensPerDay: 100_000_000,
    tokensPerMonth: 1_000_000_000,
  };
  let stats: CommitStats | null = null;
  const w = await createWorld({
    limits: every,
    // The gateway checks at most 10 counters a commit, as on denokv, whose
    // limits this KV enforces.
    config: { kvUrl: "http://denokv.invalid" },
    onKv: (kv) => stats = denokvLimits(kv),
  });
  try {
    await priceTinyChat(w.store);
    const key = await w.newKey({ limits: { ...every, rpm: 30 } });
    for (const [unit, amount] of [["money", "1000"], ["tokens", 1e6]]) {
      const b = { amount, hard: true };
      await setTenantBudget(w.store, SYSTEM, w.tenant.id, unit as never, b);
      await setKeyBudget(w.store, SYSTEM, key.id, unit as never, b);
    }
    const body = {
      model: "tiny-chat",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 5,
    };
    const rs = await Promise.all(Array.from({ length: 100 }, async () => {
      const r = await w.post("/v1/chat/completions", body, {
        authorization: `Bearer ${key.key}`,
      });
      return { status: r.status, body: await r.json() };
    }));
    const ok = rs.filter((r) => r.status === 200);
    assert.equal(
      ok.length,
      30,
      JSON.stringify(rs.find((r) => r.status >= 500)),
    );
    assert.equal(rs.filter((r) => r.status === 429).length, 70);
    assert.equal(w.up.requests.length, 30);
    await w.gw.idle();
    const tokens = ok.reduce((a, r) => a + r.body.usage.total_tokens, 0);
    const money = ok.reduce(
      (a, r) =>
        a + perMillion(r.body.usage.prompt_tokens, 1_000_000_000) +
        perMillion(r.body.usage.completion_tokens, 2_000_000_000),
      0,
    );
    const now = Date.now();
    for (const s of [`t:${w.tenant.id}`, `k:${key.id}`]) {
      const used = (kind: "rpm" | "day" | "month" | "spend") =>
        counterValue(w.store, s, windowOf(kind, now)[0]);
      assert.equal(await used("rpm"), 30, s);
      assert.equal(await used("day"), tokens, s);
      assert.equal(await used("month"), tokens, s);
      assert.equal(await used("spend"), money, s);
      assert.equal(await counterValue(w.store, s, "conc"), 0, s);
    }
    assert.equal(await countReservations(w.store), 0);
    assert.ok(stats!.mostChecks <= 10, `${stats!.mostChecks} checks`);
  } finally {
    await w.close();
  }
});

Deno.test("an admin action taken while limited traffic flows is in the audit log filtered up to now (a reservation's deadline does not date it ~11 minutes ahead)", async () => {
  const w = await createWorld({ limits: { rpm: 100, tpm: 1_000_000 } });
  try {
    const res = await w.post("/v1/chat/completions", {
      model: "tiny-chat",
      messages: [{ role: "user", content: "hi" }],
    });
    assert.equal(res.status, 200);
    await res.body?.cancel();
    const { id } = await w.newKey({ name: "made during traffic" });
    const now = Date.now();
    const page = await listAudit(w.kv, SYSTEM, {
      action: "key.create",
      from: now - 60_000,
      to: now,
    });
    const entry = page.items.find((e) => e.target.id === id);
    assert.ok(
      entry,
      "the key's creation is missing from the audit log up to now",
    );
    assert.ok(Math.abs(Date.parse(entry.at) - now) < 5_000);
  } finally {
    await w.close();
  }
});
