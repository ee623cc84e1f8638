/** Renders a page to a full HTML document with only the island scripts it uses. */
import type { VNode } from "preact";
import { renderToString } from "preact-render-to-string";
import { IslandsUsed } from "../components/Island.tsx";
import type { IslandManifest } from "../lib/islands_build.ts";

/** Renders `body` inside the HTML document. */
export function renderPage(
  title: string,
  body: VNode,
  islands: IslandManifest,
): string {
  const used = new Set<string>();
  const html = renderToString(
    <IslandsUsed.Provider value={used}>{body}</IslandsUsed.Provider>,
  );
  const scripts = [...used].map((name) => {
    const src = islands[name];
    if (!src) throw new Error(`Cannot render island ${name}: it was not built`);
    return `<script type="module" src="${src}"></script>`;
  }).join("");
  return `<!doctype html><html lang="en"><head><meta charset="utf-8">` +
    `<meta name="viewport" content="width=device-width, initial-scale=1">` +
    `<title>${escapeHtml(title)} · Orchard</title>` +
    `<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">` +
    `<link rel="stylesheet" href="/static/app.css">${scripts}</head>` +
    `<body>${html}</body></html>`;
}

/** Escapes text for HTML. */
export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);
}
