import { useSignal } from "@preact/signals";
import { useEffect } from "preact/hooks";

/** Props of MeshRunner: the progress of the current or last run. */
export interface MeshRunnerProps {
  running: boolean;
  done: number;
  total: number;
  failed: number;
}

/**
 * Shows "test all pairs" progress: while a run is going it polls
 * `/mesh/progress` and reloads the page when the run ends, so the matrix
 * shows the new results.
 */
export default function MeshRunner(props: MeshRunnerProps) {
  const p = useSignal(props);
  useEffect(() => {
    if (!props.running) return;
    let stop = false;
    const tick = async () => {
      if (stop) return;
      try {
        const res = await fetch("/mesh/progress", {
          headers: { accept: "application/json" },
        });
        if (res.ok) {
          const next = await res.json() as MeshRunnerProps;
          p.value = next;
          if (!next.running) {
            location.reload();
            return;
          }
        }
      } catch { /* retry on the next tick */ }
      setTimeout(tick, 500);
    };
    const t = setTimeout(tick, 300);
    return () => {
      stop = true;
      clearTimeout(t);
    };
  }, []);
  const v = p.value;
  if (!v.running && v.total === 0) return <span />;
  const pct = v.total ? Math.round((v.done / v.total) * 100) : 100;
  return (
    <div data-testid="mesh-progress" data-running={v.running ? "1" : "0"}>
      <div class="meter-row">
        <div
          class="meter"
          role="progressbar"
          aria-valuemin={0}
          aria-valuemax={v.total}
          aria-valuenow={v.done}
        >
          <span style={`width:${pct}%`} />
        </div>
        <span class="pct">{v.done} / {v.total}</span>
      </div>
      <p class="muted">
        {v.running ? "Testing pairs…" : "Last run finished"}
        {v.failed ? `, ${v.failed} failed` : ""}
      </p>
    </div>
  );
}
