/** Chromium for the browser tests (the launcher is a shared fixture: `bench:dashboard` uses it too). */
export { ARTIFACTS, chromiumPath, launchBrowser } from "./fixtures/browser.ts";
