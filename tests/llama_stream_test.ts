/**
 * Streaming as the user sees it: a real gateway process, a real node
 * process and its model child on the `small` fixture model (~100 M
 * parameters, so a decode step takes milliseconds, as on real hardware),
 * the official openai SDK as the client, and every text event timed when
 * it reaches the client.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startCluster } from "./fixtures/cluster.ts";
import {
  median,
  percentile,
  timeChatStream,
} from "./fixtures/stream_timing.ts";

const TOKENS = 300;

function body(i: number, maxTokens = TOKENS) {
  return {
    model: "small",
    messages: [{ role: "user" as const, content: `Tell me story number ${i}` }],
    max_tokens: maxTokens,
    temperature: 0,
  };
}

Deno.test({
  name:
    "llama streams reach the client as they are decoded, fairly across concurrent streams",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  await using cluster = await startCluster({
    models: [{ name: "small", size: "small" }],
    slots: 4,
  });
  const client = new OpenAI({
    apiKey: cluster.apiKey,
    baseURL: `${cluster.url}/v1`,
    maxRetries: 0,
    timeout: 120_000,
  });
  // load the model and touch its weights once
  await client.chat.completions.create({ ...body(0, 8) });
  let step = 0;
  let solo = 0;

  await t.step(
    "one 300-token stream: text arrives steadily, not at the end",
    async () => {
      const s = await timeChatStream(client, body(1));
      assert.equal(s.usage?.completion_tokens, TOKENS);
      step = median(s.gaps);
      solo = s.firstText;
      assert.ok(
        s.shareAtHalf >= 0.4,
        `only ${(s.shareAtHalf * 100).toFixed(0)}% of the text by half time`,
      );
      // one event per decode step: the gaps are the steps themselves
      assert.ok(s.events.length >= TOKENS * 0.9, `${s.events.length} events`);
      // nine gaps in ten are one decode step; the rest are the machine's:
      // on 2 shared cores a bare llama_decode loop stalls 50-150 ms about
      // twice a second too (bench:engine prints both), so the worst gap is
      // bounded by that, not by 3 steps
      const p90 = percentile(s.gaps, 0.9);
      assert.ok(
        p90 <= 3 * step,
        `p90 gap ${p90.toFixed(1)} ms, median step ${step.toFixed(1)} ms`,
      );
      const worst = s.gaps.at(-1)!;
      assert.ok(worst <= 250, `a gap of ${worst.toFixed(0)} ms`);
    },
  );

  await t.step(
    "four concurrent streams each start within a few steps and progress every second",
    async () => {
      const runs = await Promise.all(
        [1, 2, 3, 4].map((i) => timeChatStream(client, body(10 + i))),
      );
      for (const [i, s] of runs.entries()) {
        assert.equal(s.usage?.completion_tokens, TOKENS, `stream ${i}`);
        // admitted at once: its prefill shares steps with the other three
        assert.ok(
          s.firstText <= 4 * solo + 3 * step * 4 + 250,
          `stream ${i} first text at ${s.firstText.toFixed(0)} ms (alone: ${
            solo.toFixed(0)
          } ms)`,
        );
        assert.ok(
          s.gaps.at(-1)! < 1000,
          `stream ${i} stalled ${s.gaps.at(-1)!.toFixed(0)} ms`,
        );
        assert.ok(s.shareAtHalf >= 0.35, `stream ${i}: ${s.shareAtHalf}`);
      }
    },
  );

  await t.step(
    "eight streams on four slots: four queue, then stream the same way",
    async () => {
      const runs = await Promise.all(
        [1, 2, 3, 4, 5, 6, 7, 8].map((i) =>
          timeChatStream(client, body(20 + i, 150))
        ),
      );
      const byStart = [...runs].sort((a, b) => a.firstText - b.firstText);
      const firstFinish = Math.min(...runs.map((s) => s.lastText));
      // the last four began only when slots freed up
      for (const s of byStart.slice(4)) {
        assert.ok(
          s.firstText >= firstFinish - 50,
          `a queued stream started at ${
            s.firstText.toFixed(0)
          } ms, before any slot freed (${firstFinish.toFixed(0)} ms)`,
        );
      }
      for (const s of runs) {
        assert.equal(s.usage?.completion_tokens, 150);
        assert.ok(s.gaps.at(-1)! < 1000, `stalled ${s.gaps.at(-1)} ms`);
      }
    },
  );
});
