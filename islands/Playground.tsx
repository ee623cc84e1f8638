import { useSignal } from "@preact/signals";
import { SSEReader } from "../lib/sse.ts";

/** Props of Playground. */
export interface PlaygroundProps {
  /** Models some healthy node serves now (the key may allow fewer). */
  models: string[];
}

interface Turn {
  role: "user" | "assistant";
  content: string;
}

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/**
 * Chats through the gateway's `/v1/chat/completions` with a pasted tenant
 * key, streaming, and shows time to first token, tokens/s and usage. The
 * key lives only in this component's memory: never stored, never sent to
 * the portal.
 */
export default function Playground(props: PlaygroundProps) {
  const key = useSignal("");
  const models = useSignal<string[]>(props.models);
  const model = useSignal(props.models[0] ?? "");
  const input = useSignal("");
  const turns = useSignal<Turn[]>([]);
  const busy = useSignal(false);
  const error = useSignal("");
  const stats = useSignal("");

  const auth = () => ({ authorization: `Bearer ${key.value.trim()}` });

  async function loadModels() {
    error.value = "";
    try {
      const res = await fetch("/v1/models", { headers: auth() });
      const body = await res.json();
      if (!res.ok) {
        throw new Error(body?.error?.message ?? `status ${res.status}`);
      }
      models.value = (body.data as { id: string }[]).map((m) => m.id);
      if (!models.value.includes(model.value)) {
        model.value = models.value[0] ?? "";
      }
    } catch (e) {
      error.value = `Cannot list models: ${(e as Error).message}`;
    }
  }

  async function send(e: Event) {
    e.preventDefault();
    const text = input.value.trim();
    if (!text || busy.value) return;
    if (!key.value.trim()) {
      error.value = "Paste a tenant API key first (orch_…).";
      return;
    }
    error.value = "";
    stats.value = "";
    busy.value = true;
    const history: Turn[] = [...turns.value, { role: "user", content: text }];
    turns.value = [...history, { role: "assistant", content: "" }];
    input.value = "";
    const t0 = performance.now();
    let first = 0;
    let usage: Usage | null = null;
    let reply = "";
    try {
      const res = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { ...auth(), "content-type": "application/json" },
        body: JSON.stringify({
          model: model.value,
          messages: history,
          stream: true,
          stream_options: { include_usage: true },
        }),
      });
      if (!res.ok || !res.body) {
        const body = await res.json().catch(() => null);
        throw new Error(body?.error?.message ?? `status ${res.status}`);
      }
      const events = new SSEReader(res.body, { peer: "gateway" });
      for (let d = await events.next(); d !== null; d = await events.next()) {
        if (d === "[DONE]") continue;
        const chunk = JSON.parse(d);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices?.[0]?.delta?.content;
        if (typeof delta === "string" && delta) {
          if (!first) first = performance.now();
          reply += delta;
          turns.value = [...history, { role: "assistant", content: reply }];
        }
      }
      const end = performance.now();
      const u = usage as Usage | null;
      // Generation time from the first token (the whole request if it all came at once).
      const gen = Math.max(
        0.001,
        (end - (first && end > first ? first : t0)) / 1000,
      );
      stats.value = [
        `TTFT ${first ? Math.round(first - t0) : "—"} ms`,
        u && gen > 0
          ? `${(u.completion_tokens / gen).toFixed(1)} tokens/s`
          : null,
        u
          ? `usage: ${u.prompt_tokens} prompt + ${u.completion_tokens} completion = ${u.total_tokens} tokens`
          : null,
      ].filter(Boolean).join(" · ");
    } catch (err) {
      error.value = (err as Error).message;
    } finally {
      busy.value = false;
    }
  }

  return (
    <div>
      <div class="row">
        <div class="field">
          <label for="pg-key">Tenant API key</label>
          <input
            id="pg-key"
            type="password"
            autocomplete="off"
            spellcheck={false}
            placeholder="orch_…"
            value={key.value}
            onInput={(e) => (key.value = (e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field" style="flex:0">
          <button type="button" onClick={loadModels} data-testid="load-models">
            Load models
          </button>
        </div>
        <div class="field">
          <label for="pg-model">Model</label>
          <select
            id="pg-model"
            value={model.value}
            onChange={(
              e,
            ) => (model.value = (e.target as HTMLSelectElement).value)}
          >
            {models.value.map((m) => <option key={m} value={m}>{m}</option>)}
          </select>
        </div>
      </div>
      <div class="chat" data-testid="chat" aria-live="polite">
        {turns.value.length === 0 && <p class="muted">No messages yet.</p>}
        {turns.value.map((t, i) => (
          <div class="msg" key={i} data-role={t.role}>
            <b>{t.role === "user" ? "You" : model.value}</b>
            {t.content || (busy.value ? "…" : "")}
          </div>
        ))}
      </div>
      {error.value && <div class="alert error" role="alert">{error.value}</div>}
      {stats.value && (
        <p class="muted mono" data-testid="stats">{stats.value}</p>
      )}
      <form onSubmit={send}>
        <div class="field">
          <label for="pg-input">Message</label>
          <textarea
            id="pg-input"
            value={input.value}
            onInput={(
              e,
            ) => (input.value = (e.target as HTMLTextAreaElement).value)}
          />
        </div>
        <button type="submit" class="primary" disabled={busy.value}>
          {busy.value ? "Streaming…" : "Send"}
        </button>{" "}
        <button type="button" onClick={() => (turns.value = [])}>Clear</button>
      </form>
    </div>
  );
}
