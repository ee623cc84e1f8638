/**
 * Money as integer micro-units (1 unit = 1,000,000 micro), parsed from
 * decimal text without floating point, and rounded half-up to cents only
 * when a statement line is final.
 */
import { ValidationError } from "./errors.ts";

/** Micro-units in one currency unit. */
export const MICRO = 1_000_000;

/** Micro-units in one cent (the precision of statement lines). */
export const CENT = 10_000;

/** Largest amount accepted in settings: 10^12 units. */
const MAX_MICRO = 1e12 * MICRO;

/**
 * Why a JSON number is refused where money is expected: the admin API,
 * the CLI, exports and webhooks write money as decimal strings in major
 * units, and a number could mean either units or micro-units.
 */
export const MONEY_NOT_A_NUMBER =
  'must be a decimal string in major units like "0.40", not a number: a number is ambiguous between units and micro-units';

/**
 * Parses a non-negative decimal amount in major units, given as a string
 * ("12", "0.5", "1234.567891"), to micro-units exactly; a number, more
 * than 6 decimals or anything else is refused.
 */
export function parseMoney(input: unknown, field = "amount"): number {
  if (typeof input === "number") {
    throw new ValidationError(`${field}: ${MONEY_NOT_A_NUMBER}`, field);
  }
  const text = typeof input === "string" ? input.trim() : "";
  const m = /^(\d{1,13})(?:\.(\d*))?$/.exec(text);
  const frac = (m?.[2] ?? "").replace(/0+$/, "");
  if (!m || frac.length > 6) {
    throw new ValidationError(
      `${field}: must be a non-negative amount with at most 6 decimals, like 12.50`,
      field,
    );
  }
  const micro = Number(m[1]) * MICRO + Number(frac.padEnd(6, "0"));
  if (micro > MAX_MICRO) {
    throw new ValidationError(`${field}: must be at most 10^12`, field);
  }
  return micro;
}

/** Formats micro-units with `decimals` (2..6) places, rounding half-up. */
export function formatMoney(micro: number, decimals = 2): string {
  const step = 10 ** (6 - decimals);
  const rounded = roundHalfUp(micro, step);
  const neg = rounded < 0;
  const abs = Math.abs(rounded);
  const units = Math.floor(abs / MICRO);
  const frac = String(abs % MICRO).padStart(6, "0").slice(0, decimals);
  return `${neg ? "-" : ""}${units}${decimals > 0 ? "." + frac : ""}`;
}

/**
 * Micro-units as an exact decimal string in major units, with at least 2
 * decimals and no more than it needs ("400.00", "0.123456"): the form the
 * admin API, exports and webhooks read and write, so that parseMoney of
 * it gives `micro` back.
 */
export function moneyText(micro: number): string {
  const m = Math.round(micro);
  const abs = Math.abs(m);
  const frac = String(abs % MICRO).padStart(6, "0").replace(/0{1,4}$/, "");
  return `${m < 0 ? "-" : ""}${Math.floor(abs / MICRO)}.${frac.padEnd(2, "0")}`;
}

/**
 * A copy of a JSON report with every `…Micro` number written as money
 * (moneyText) under its name without the suffix (`totalMicro` → `total`;
 * `tokensMicro` → `tokensAmount` where the object already has `tokens`),
 * for the admin API and exports: the store keeps integers, the wire
 * carries decimal strings beside the report's `currency`.
 */
export function moneyJson<T>(value: T): unknown {
  if (Array.isArray(value)) return value.map((v) => moneyJson(v));
  if (value === null || typeof value !== "object") return value;
  const src = value as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(src)) {
    const m = /^(.+)Micro$/.exec(key);
    if (m && (typeof v === "number" || v === null)) {
      const name = m[1]! in src ? `${m[1]}Amount` : m[1]!;
      out[name] = v === null ? null : moneyText(v);
    } else {
      out[key] = moneyJson(v);
    }
  }
  return out;
}

/** Rounds an integer to a multiple of `step`, halves away from zero. */
export function roundHalfUp(value: number, step: number): number {
  const sign = value < 0 ? -1 : 1;
  return sign * Math.floor((Math.abs(value) + step / 2) / step) * step;
}

/** Rounds micro-units to whole cents (half-up). */
export function toCents(micro: number): number {
  return roundHalfUp(Math.round(micro), CENT);
}

/**
 * `quantity × pricePerMillion / 10^6` in micro-units, computed in BigInt so
 * large token counts lose nothing, rounded half-up to a micro-unit.
 */
export function perMillion(
  quantity: number,
  priceMicroPerMillion: number,
): number {
  const q = BigInt(Math.round(quantity));
  const p = BigInt(Math.round(priceMicroPerMillion));
  const n = q * p;
  return Number((n + 500_000n) / 1_000_000n);
}
