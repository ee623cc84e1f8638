import { useSignal } from "@preact/signals";
import { useEffect } from "preact/hooks";

/** Props of NodesLive. */
export interface NodesLiveProps {
  /** The server-sent events endpoint. */
  src: string;
}

/** One node's live figures, as pushed by the server. */
interface LiveNode {
  id: string;
  state: string;
  inFlight: number;
  queued: number;
  slots: number;
  tokensPerSecond: number;
  lastHeartbeat: string;
}

const TONE: Record<string, string> = {
  healthy: "ok",
  draining: "warn",
  drained: "warn",
  unhealthy: "danger",
};

/**
 * Subscribes to the nodes' live events and updates the server-rendered
 * table in place (cells marked `data-node` / `data-field`): state,
 * in-flight work, tokens/s and last heartbeat. Shows whether it is live.
 */
export default function NodesLive(props: NodesLiveProps) {
  const live = useSignal(false);
  const at = useSignal("");
  useEffect(() => {
    const es = new EventSource(props.src);
    es.onopen = () => (live.value = true);
    es.onerror = () => (live.value = false);
    es.addEventListener("nodes", (ev) => {
      live.value = true;
      const nodes = JSON.parse((ev as MessageEvent).data) as LiveNode[];
      at.value = new Date().toISOString().slice(11, 19);
      for (const n of nodes) {
        const set = (field: string, value: string) => {
          const el = document.querySelector<HTMLElement>(
            `[data-node="${CSS.escape(n.id)}"] [data-field="${field}"]`,
          );
          if (el && el.textContent !== value) el.textContent = value;
          return el;
        };
        const badge = set("state", n.state);
        if (badge) badge.className = `badge ${TONE[n.state] ?? ""}`;
        set("load", `${n.inFlight} / ${n.slots} (+${n.queued} queued)`);
        set("tps", n.tokensPerSecond.toFixed(1));
        set("heartbeat", n.lastHeartbeat);
      }
    });
    return () => es.close();
  }, []);
  return (
    <span class="muted" data-testid="live" data-live={live.value ? "1" : "0"}>
      <span class={live.value ? "live-dot on" : "live-dot"} />
      {live.value
        ? `Live${at.value ? ` · updated ${at.value} UTC` : ""}`
        : "Connecting…"}
    </span>
  );
}
