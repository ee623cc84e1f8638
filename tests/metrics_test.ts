/**
 * `/metrics` after mixed traffic through a real gateway: Prometheus's own
 * `promtool check metrics` accepts the scrape, and the per-tenant, per-model
 * and per-node series count what clients got.
 */
import assert from "node:assert/strict";
import { createWorld, readSSE } from "../gateway/_testing.ts";

/** Runs `promtool check metrics` on a scrape; resolves with its exit code and output. */
async function promtool(scrape: string) {
  const child = new Deno.Command("promtool", {
    args: ["check", "metrics"],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const w = child.stdin.getWriter();
  await w.write(new TextEncoder().encode(scrape));
  await w.close();
  const out = await child.output();
  const dec = new TextDecoder();
  return {
    code: out.code,
    text: dec.decode(out.stdout) + dec.decode(out.stderr),
  };
}

const hasPromtool = await new Deno.Command("promtool", { args: ["--version"] })
  .output().then((o) => o.success, () => false);

Deno.test({
  name:
    "/metrics after mixed traffic passes promtool check metrics, and the per-tenant series count each result",
  // CI installs Debian's `prometheus` (.ci/apt-packages.txt) for promtool.
  ignore: !hasPromtool,
}, async () => {
  const w = await createWorld({ limits: { rpm: 3 } });
  try {
    const chat = (extra: Record<string, unknown> = {}, key = w.key) =>
      fetch(`${w.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${key}`,
          "content-type": "application/json",
        },
        body: JSON.stringify({
          model: "tiny-chat",
          messages: [{ role: "user", content: "Hi" }],
          ...extra,
        }),
      });
    const statuses: number[] = [];
    const one = async (res: Promise<Response>) => {
      const r = await res;
      statuses.push(r.status);
      if (r.headers.get("content-type")?.includes("event-stream")) {
        await readSSE(r);
      } else await r.body?.cancel();
    };
    await one(chat());
    await one(chat({ stream: true }));
    await one(chat({ temperature: "hot" })); // 400
    await one(chat({}, "orch_not_a_key")); // 401
    await one(chat()); // the third in the minute: ok
    await one(chat()); // rpm 3: 429
    assert.deepEqual(statuses, [200, 200, 400, 401, 200, 429]);
    await w.gw.idle();
    const res = await fetch(`${w.url}/metrics`);
    assert.equal(res.status, 200);
    const scrape = await res.text();
    const check = await promtool(scrape);
    assert.equal(check.code, 0, check.text);
    assert.equal(check.text.trim(), "", "no lint problems");
    const line = (re: RegExp) =>
      assert.match(scrape, re, `missing ${re}\n${scrape}`);
    const slug = w.tenant.slug;
    line(
      new RegExp(
        `^orchard_tenant_requests_total\\{tenant="${slug}",result="ok"\\} 3$`,
        "m",
      ),
    );
    line(
      new RegExp(
        `^orchard_tenant_requests_total\\{tenant="${slug}",result="limited"\\} 1$`,
        "m",
      ),
    );
    line(
      new RegExp(
        `^orchard_tenant_requests_total\\{tenant="${slug}",result="client_error"\\} 1$`,
        "m",
      ),
    );
    line(
      /^orchard_tenant_requests_total\{tenant="_none",result="client_error"\} 1$/m,
    );
    line(/^orchard_node_requests_total\{node="node-a",result="ok"\} 3$/m);
    line(/^orchard_model_ttft_seconds_count\{model="tiny-chat"\} \d+$/m);
    line(/^orchard_node_up\{node="node-a"\} 1$/m);
    line(/^orchard_node_slots\{node="node-a"\} 8$/m);
  } finally {
    await w.close();
  }
});
