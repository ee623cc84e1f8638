import { useSignal } from "@preact/signals";
import { useEffect, useRef } from "preact/hooks";

/** One measure the heatmap can show. */
export interface HeatmapMetric {
  key: string;
  label: string;
  /** `[row][column]` values; null: no data (drawn empty). */
  values: (number | null)[][];
  /** The value drawn darkest (e.g. 1 for a share). */
  max: number;
  /** How a value reads in the tooltip: a percent or a number with a unit. */
  format: "percent" | "number";
  unit?: string;
}

/** Props of CapacityHeatmap. */
export interface CapacityHeatmapProps {
  id: string;
  title: string;
  /** Row labels, top to bottom (Mon … Sun). */
  rows: string[];
  /** Column labels, left to right (00 … 23). */
  columns: string[];
  /** The measures, the first shown first; buttons switch between them. */
  metrics: HeatmapMetric[];
}

/** The fill for a value: from near-white to the portal's --brand green as it rises. */
function colorOf(v: number, max: number): string {
  const t = max > 0 ? Math.max(0, Math.min(1, v / max)) : 0;
  const mix = (a: number, b: number) => Math.round(a + (b - a) * t);
  return `rgb(${mix(238, 47)}, ${mix(244, 111)}, ${mix(240, 79)})`;
}

function label(v: number, m: HeatmapMetric): string {
  return m.format === "percent"
    ? `${(v * 100).toFixed(1)}%`
    : `${v.toFixed(v < 10 ? 2 : 0)}${m.unit ? ` ${m.unit}` : ""}`;
}

interface Cell {
  x: string;
  y: string;
  v: number | null;
}

/**
 * A chart.js matrix (chartjs-chart-matrix) of a measure by day of week and
 * hour of day, one chart whatever the measure shown (switching redraws it
 * with the other's values). The canvas gets `data-cells` (the cells with
 * data) and `data-metric` once drawn; without JavaScript the page's tables
 * carry the figures.
 */
export default function CapacityHeatmap(props: CapacityHeatmapProps) {
  const canvas = useRef<HTMLCanvasElement>(null);
  const shown = useSignal(0);
  const chartRef = useRef<
    {
      destroy(): void;
      update(mode: "none"): void;
      data: { datasets: { data: Cell[] }[] };
    } | null
  >(null);
  const cells = (m: HeatmapMetric): Cell[] => {
    const out: Cell[] = [];
    m.values.forEach((row, r) =>
      row.forEach((v, c) =>
        out.push({ x: props.columns[c]!, y: props.rows[r]!, v })
      )
    );
    return out;
  };
  const metric = () => props.metrics[shown.value] ?? props.metrics[0]!;
  const mark = (data: Cell[]) => {
    if (!canvas.current) return;
    canvas.current.dataset.cells = String(
      data.filter((d) => d.v !== null).length,
    );
    canvas.current.dataset.metric = metric().key;
  };
  useEffect(() => {
    let cancelled = false;
    (async () => {
      const [{ Chart, registerables }, { MatrixController, MatrixElement }] =
        await Promise.all([import("chart.js"), import("chartjs-chart-matrix")]);
      if (cancelled || !canvas.current) return;
      Chart.register(...registerables, MatrixController, MatrixElement);
      const data = cells(metric());
      const cols = props.columns.length, rows = props.rows.length;
      chartRef.current = new Chart(canvas.current, {
        type: "matrix",
        data: {
          datasets: [{
            label: props.title,
            data,
            backgroundColor: (ctx: { raw?: unknown }) => {
              const v = (ctx.raw as Cell | undefined)?.v;
              return v === null || v === undefined
                ? "rgba(0,0,0,0.04)"
                : colorOf(v, metric().max);
            },
            borderWidth: 1,
            borderColor: "rgba(255,255,255,0.9)",
            width: ({ chart }: { chart: { chartArea?: { width: number } } }) =>
              (chart.chartArea?.width ?? 0) / cols - 1,
            height: (
              { chart }: { chart: { chartArea?: { height: number } } },
            ) => (chart.chartArea?.height ?? 0) / rows - 1,
          }],
        },
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,
          plugins: {
            legend: { display: false },
            tooltip: {
              callbacks: {
                title: () => "",
                label: (ctx: { raw: unknown }) => {
                  const p = ctx.raw as Cell;
                  return `${p.y} ${p.x}:00 UTC: ${
                    p.v === null ? "no data" : label(p.v, metric())
                  }`;
                },
              },
            },
          },
          scales: {
            x: {
              type: "category",
              labels: props.columns,
              offset: true,
              grid: { display: false },
              ticks: { autoSkip: true, maxRotation: 0 },
            },
            y: {
              type: "category",
              labels: props.rows,
              reverse: true,
              offset: true,
              grid: { display: false },
            },
          },
        },
      } as never);
      mark(data);
    })();
    return () => {
      cancelled = true;
      chartRef.current?.destroy();
    };
  }, []);
  const show = (i: number) => {
    shown.value = i;
    const chart = chartRef.current;
    if (!chart) return;
    const data = cells(metric());
    chart.data.datasets[0]!.data = data;
    chart.update("none");
    mark(data);
  };
  return (
    <figure class="chart heatmap">
      <figcaption>
        {props.title}: {metric().label}
      </figcaption>
      <div class="row heatmap-metrics" role="group" aria-label="Measure">
        {props.metrics.map((m, i) => (
          <button
            key={m.key}
            type="button"
            class="btn small"
            data-metric={m.key}
            aria-pressed={i === shown.value ? "true" : "false"}
            onClick={() => show(i)}
          >
            {m.label}
          </button>
        ))}
      </div>
      <div class="chart-box">
        <canvas
          ref={canvas}
          id={props.id}
          role="img"
          aria-label={`${props.title}: ${metric().label}`}
        />
      </div>
    </figure>
  );
}
