/**
 * Memory amounts given on the command line: a share of the memory there is
 * (`50%`) or a size (`8GiB`, `512MiB`, `2G`, bytes).
 */

/** A memory amount: a share (0 < share ≤ 1) of what there is, or bytes. */
export type MemorySpec = { share: number } | { bytes: number };

const UNITS: Record<string, number> = {
  "": 1,
  b: 1,
  k: 1024,
  kb: 1024,
  kib: 1024,
  m: 1024 ** 2,
  mb: 1024 ** 2,
  mib: 1024 ** 2,
  g: 1024 ** 3,
  gb: 1024 ** 3,
  gib: 1024 ** 3,
  t: 1024 ** 4,
  tb: 1024 ** 4,
  tib: 1024 ** 4,
};

/** Parses `50%`, `8GiB`, `0` …; null when `raw` is not one. */
export function parseMemorySpec(raw: string): MemorySpec | null {
  const s = raw.trim().toLowerCase();
  const pct = /^(\d+(?:\.\d+)?)\s*%$/.exec(s);
  if (pct) {
    const share = Number(pct[1]) / 100;
    return share >= 0 && share <= 1 ? { share } : null;
  }
  const m = /^(\d+(?:\.\d+)?)\s*([a-z]*)$/.exec(s);
  const unit = m ? UNITS[m[2]!] : undefined;
  if (!m || unit === undefined) return null;
  const bytes = Math.floor(Number(m[1]) * unit);
  return Number.isSafeInteger(bytes) ? { bytes } : null;
}

/** The bytes `spec` stands for, out of `available` bytes. */
export function memoryBytes(spec: MemorySpec, available: number): number {
  return "bytes" in spec
    ? spec.bytes
    : Math.floor(spec.share * Math.max(0, available));
}

/** Memory the system can give now (available, else free), in bytes. */
export function availableMemory(): number {
  try {
    const m = Deno.systemMemoryInfo();
    return m.available || m.free;
  } catch {
    return 0;
  }
}
