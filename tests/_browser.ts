/** Chromium for the browser tests (the launcher is a shared fixture: `bench:dashboard` uses it too), and what each test does in it. */
import assert from "node:assert/strict";
import type { Page } from "playwright-core";

export { ARTIFACTS, chromiumPath, launchBrowser } from "./fixtures/browser.ts";

/** Signs in through the portal's form and waits until the page has left `/login`. */
export async function signIn(
  page: Page,
  base: string,
  email: string,
  password: string,
): Promise<void> {
  await page.goto(`${base}/login`);
  await page.fill("#f-email", email);
  await page.fill("#f-password", password);
  await page.click("button[type=submit]");
  await page.waitForURL((u) => !u.pathname.startsWith("/login"));
}

/** The page fits its viewport's width (tables scroll inside their own box). */
export async function fitsWidth(page: Page): Promise<void> {
  const [scroll, width] = await page.evaluate(() => [
    document.documentElement.scrollWidth,
    globalThis.innerWidth,
  ]);
  assert.ok(scroll <= width + 1, `page is ${scroll} px wide in ${width}`);
}
