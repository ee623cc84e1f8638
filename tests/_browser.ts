/** Launches Debian's Chromium through playwright-core for browser tests. */
import { type Browser, chromium } from "playwright-core";

/** Where screenshots from browser tests are saved (CI keeps them as artifacts). */
export const ARTIFACTS =
  new URL("../test-artifacts/", import.meta.url).pathname;

/** Finds the Chromium binary (CHROMIUM_PATH, else Debian's). */
export function chromiumPath(): string {
  const candidates = [
    Deno.env.get("CHROMIUM_PATH"),
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
  ];
  for (const p of candidates) {
    if (!p) continue;
    try {
      if (Deno.statSync(p).isFile) return p;
    } catch { /* next */ }
  }
  throw new Error(
    "Cannot run browser tests: Chromium not found. Install Debian's chromium (apt-get install chromium) or set CHROMIUM_PATH.",
  );
}

/** Launches headless Chromium with the flags this sandbox needs. */
export async function launchBrowser(): Promise<Browser> {
  await Deno.mkdir(ARTIFACTS, { recursive: true });
  return await chromium.launch({
    executablePath: chromiumPath(),
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-dev-shm-usage",
    ],
  });
}
