import { useEffect, useRef } from "preact/hooks";

/** One series of a usage chart. */
export interface UsageDataset {
  label: string;
  data: number[];
  type: "bar" | "line";
  color: string;
  /** Right-hand axis (for a second unit). */
  right?: boolean;
  /** Bars with the same stack id are stacked. */
  stack?: string;
}

/** Props of UsageChart. */
export interface UsageChartProps {
  id: string;
  title: string;
  labels: string[];
  datasets: UsageDataset[];
  leftTitle: string;
  rightTitle?: string;
}

/**
 * A chart.js chart of usage buckets. The canvas gets `data-points` (the
 * number of non-zero points drawn) once rendered; without JavaScript the
 * figure's caption and the page's tables carry the numbers.
 */
export default function UsageChart(props: UsageChartProps) {
  const canvas = useRef<HTMLCanvasElement>(null);
  useEffect(() => {
    let chart: { destroy(): void } | null = null;
    let cancelled = false;
    (async () => {
      const { Chart, registerables } = await import("chart.js");
      if (cancelled || !canvas.current) return;
      Chart.register(...registerables);
      const stacked = props.datasets.some((d) => d.stack);
      chart = new Chart(canvas.current, {
        data: {
          labels: props.labels,
          datasets: props.datasets.map((d) => ({
            type: d.type,
            label: d.label,
            data: d.data,
            backgroundColor: d.type === "bar" ? d.color : "transparent",
            borderColor: d.color,
            borderWidth: d.type === "line" ? 2 : 0,
            pointRadius: 0,
            yAxisID: d.right ? "y1" : "y",
            stack: d.stack,
            order: d.type === "line" ? 0 : 1,
          })),
        },
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,
          interaction: { mode: "index", intersect: false },
          scales: {
            // label sizes from a sample: measuring every label of a
            // month of hours costs more than drawing the chart
            x: { stacked, ticks: { maxTicksLimit: 12, sampleSize: 24 } },
            y: {
              stacked,
              beginAtZero: true,
              title: { display: true, text: props.leftTitle },
            },
            ...(props.rightTitle
              ? {
                y1: {
                  position: "right" as const,
                  beginAtZero: true,
                  grid: { drawOnChartArea: false },
                  title: { display: true, text: props.rightTitle },
                },
              }
              : {}),
          },
          plugins: { legend: { position: "bottom" } },
        },
      });
      const points = props.datasets.reduce(
        (n, d) => n + d.data.filter((v) => v > 0).length,
        0,
      );
      canvas.current.dataset.points = String(points);
    })();
    return () => {
      cancelled = true;
      chart?.destroy();
    };
  }, []);
  return (
    <figure class="chart">
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
