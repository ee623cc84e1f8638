import { useEffect, useRef } from "preact/hooks";

/** Props of CapacityHeatmap. */
export interface CapacityHeatmapProps {
  id: string;
  title: string;
  /** Row labels, top to bottom (Mon … Sun). */
  rows: string[];
  /** Column labels, left to right (00 … 23). */
  columns: string[];
  /** `[row][column]` values; null: no data (drawn empty). */
  values: (number | null)[][];
  /** The value drawn darkest (e.g. 1 for a share). */
  max: number;
  /** How a value reads in the tooltip: a percent or a number with a unit. */
  format: "percent" | "number";
  unit?: string;
}

/** The heatmap's fill for a value: from pale to the portal's green, darker as it rises. */
function colorOf(v: number, max: number): string {
  const t = max > 0 ? Math.max(0, Math.min(1, v / max)) : 0;
  // from near-white to the portal's --brand green
  const mix = (a: number, b: number) => Math.round(a + (b - a) * t);
  return `rgb(${mix(238, 47)}, ${mix(244, 111)}, ${mix(240, 79)})`;
}

function label(v: number, p: CapacityHeatmapProps): string {
  return p.format === "percent"
    ? `${(v * 100).toFixed(1)}%`
    : `${v.toFixed(v < 10 ? 2 : 0)}${p.unit ? ` ${p.unit}` : ""}`;
}

/**
 * A chart.js matrix (chartjs-chart-matrix) of values by day of week and
 * hour of day. The canvas gets `data-cells` (the cells with data) once
 * drawn; without JavaScript the page's tables carry the figures.
 */
export default function CapacityHeatmap(props: CapacityHeatmapProps) {
  const canvas = useRef<HTMLCanvasElement>(null);
  useEffect(() => {
    let chart: { destroy(): void } | null = null;
    let cancelled = false;
    (async () => {
      const [{ Chart, registerables }, { MatrixController, MatrixElement }] =
        await Promise.all([import("chart.js"), import("chartjs-chart-matrix")]);
      if (cancelled || !canvas.current) return;
      Chart.register(...registerables, MatrixController, MatrixElement);
      const data: { x: string; y: string; v: number | null }[] = [];
      props.values.forEach((row, r) =>
        row.forEach((v, c) =>
          data.push({ x: props.columns[c]!, y: props.rows[r]!, v })
        )
      );
      const cols = props.columns.length, rows = props.rows.length;
      chart = new Chart(canvas.current, {
        type: "matrix",
        data: {
          datasets: [{
            label: props.title,
            data,
            backgroundColor: (ctx: { raw?: unknown }) => {
              const v = (ctx.raw as { v: number | null } | undefined)?.v;
              return v === null || v === undefined
                ? "rgba(0,0,0,0.04)"
                : colorOf(v, props.max);
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
                  const p = ctx.raw as {
                    x: string;
                    y: string;
                    v: number | null;
                  };
                  return `${p.y} ${p.x}:00 UTC: ${
                    p.v === null ? "no capacity" : label(p.v, props)
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
              offset: true,
              grid: { display: false },
            },
          },
        },
      } as never);
      canvas.current.dataset.cells = String(
        data.filter((d) => d.v !== null).length,
      );
    })();
    return () => {
      cancelled = true;
      chart?.destroy();
    };
  }, []);
  return (
    <figure class="chart heatmap">
      <figcaption>{props.title}</figcaption>
      <div class="chart-box">
        <canvas
          ref={canvas}
          id={props.id}
          role="img"
          aria-label={props.title}
        />
      </div>
    </figure>
  );
}
