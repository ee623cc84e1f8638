/**
 * The capacity page in Chromium at 1366 px and 390 px over a seeded month
 * of 20 nodes: the figures it shows are the report's, the heatmaps and
 * line charts draw, a node is picked, the page fits a phone's width, and
 * the exports download. Screenshots go to test-artifacts/screenshots/.
 */
import assert from "node:assert/strict";
import { buildIslands } from "../lib/islands_build.ts";
import { capacityReport } from "../store/capacity.ts";
import { formatMoney } from "../store/money.ts";
import { setPricing } from "../store/pricing.ts";
import { SYSTEM } from "../store/principal.ts";
import { fmtShare } from "../components/capacity.tsx";
import { ARTIFACTS, fitsWidth, launchBrowser, signIn } from "./_browser.ts";
import { createWorld } from "./_helpers.ts";
import { seedCapacity } from "./fixtures/capacity_seed.ts";

const SHOTS = `${ARTIFACTS}screenshots/`;

Deno.test({
  name:
    "the capacity page in Chromium at 1366 and 390 px: a seeded month of 20 nodes, figures, heatmaps, lines, a node picked, exports",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const w = await createWorld({ islands: await buildIslands() });
    const server = Deno.serve(
      { port: 0, hostname: "127.0.0.1", onListen: () => {} },
      (req, info) => w.app.fetch(req, { remoteAddr: info.remoteAddr }),
    );
    const base = `http://127.0.0.1:${server.addr.port}`;
    const browser = await launchBrowser();
    await Deno.mkdir(SHOTS, { recursive: true });
    try {
      const ids = await seedCapacity(w.store, 20);
      await setPricing(w.store, SYSTEM, {
        currency: "EUR",
        models: [],
        cluster: {
          hardwarePricePerNode: "4800",
          amortisationMonths: 36,
          idleWatts: 12,
          busyWatts: 140,
          tariffPerKwh: "0.32",
        },
      });
      const r = await capacityReport(w.store, SYSTEM);
      assert.equal(r.nodes.length, 20);
      assert.equal(r.forecast.kind, "date", r.forecastText);
      const errors: string[] = [];
      for (
        const [width, height, mobile] of [
          [1366, 900, false],
          [390, 844, true],
        ] as const
      ) {
        const page = await browser.newPage({
          viewport: { width, height },
          isMobile: mobile,
        });
        page.on("pageerror", (e) => errors.push(String(e)));
        await signIn(page, base, "root@example.com", w.password);
        await page.goto(`${base}/capacity`);
        // the figures move with the clock (the hour under way): the page
        // shows the report as of some moment between these two
        const r2 = await capacityReport(w.store, SYSTEM);
        const shows = async (selector: string, f: (x: typeof r) => string) => {
          const text = (await page.textContent(selector))!.trim();
          assert.ok(
            text === f(r) || text === f(r2),
            `${selector}: ${text}, not ${f(r)}`,
          );
        };
        await shows("[data-testid=forecast]", (x) => x.forecastText);
        assert.match(r.forecastText, /reaches 90% of capacity around \d{4}-/);
        await shows(
          "[data-testid=cluster-busy]",
          (x) => fmtShare(x.cluster.busyShare),
        );
        assert.equal(
          (await page.textContent("[data-testid=refused]"))!.trim(),
          r.cluster.refused.toLocaleString("en-US"),
        );
        assert.ok(r.cluster.refused > 0);
        assert.equal(await page.locator("tr[data-node]").count(), 20);
        await shows(
          `tr[data-node="${r.nodes[0]!.id}"] [data-testid=busy]`,
          (x) => fmtShare(x.nodes[0]!.busyShare),
        );
        await shows(
          `tr[data-model="${r.cost.models[0]!.model}"] [data-testid=per1m]`,
          (x) => `${formatMoney(x.cost.models[0]!.per1MMicro!, 4)} EUR`,
        );
        // the heatmaps and lines have drawn (every cell has capacity)
        await page.waitForSelector("#heat-busy[data-cells]");
        assert.equal(
          await page.getAttribute("#heat-busy", "data-cells"),
          "168",
        );
        // the heatmap's other measures: the same chart redrawn
        await page.click("button[data-metric=queue]");
        await page.waitForSelector("#heat-busy[data-metric=queue]");
        assert.equal(
          await page.getAttribute("#heat-busy", "data-cells"),
          "168",
        );
        await page.click("button[data-metric=busy]");
        await page.waitForSelector("#chart-busy[data-points]");
        await page.waitForSelector("#chart-queue[data-points]");
        assert.ok(
          Number(await page.getAttribute("#chart-busy", "data-points")) > 24,
        );
        await fitsWidth(page);
        await page.screenshot({
          path: `${SHOTS}capacity-${width}.png`,
          fullPage: true,
        });
        if (width === 1366) {
          // one node's charts
          await page.click(`tr[data-node="${ids[3]}"] a`);
          await page.waitForURL(/node=seed-node-03/);
          assert.equal(
            (await page.textContent("[data-testid=subject]"))!.trim(),
            "mac-03",
          );
          await page.waitForSelector("#heat-busy[data-cells]");
          await page.screenshot({
            path: `${SHOTS}capacity-node-1366.png`,
            fullPage: true,
          });
          const csv = await page.request.get(`${base}/capacity/export.csv`);
          assert.equal(csv.status(), 200);
          const rows = (await csv.text()).trimEnd().split("\r\n");
          // the cluster and 20 nodes, an hour each (one more if an hour began since)
          assert.equal((rows.length - 1) % 21, 0);
          assert.ok((rows.length - 1) / 21 - r.window.hours <= 1);
          const json = await page.request.get(`${base}/capacity/export.json`);
          assert.equal((await json.json()).nodes.length, 20);
        }
        await page.close();
      }
      assert.deepEqual(errors, []);
    } finally {
      await browser.close();
      await server.shutdown();
      await w.close();
    }
  },
});
