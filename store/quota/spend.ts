/**
 * Spend rules: a hard money budget is a quota whose unit is micro-units, a
 * request's tokens at its model's prices (store/pricing.ts), counted with
 * the statement's own rounding (`perMillion`, store/money.ts). A request
 * reserves its worst case in money (its prompt's upper bound at the prompt
 * price, the rest of its tokens at the completion price) in the same commit
 * as its tokens, and settles to what its billed tokens cost.
 */
import { perMillion } from "../money.ts";
import type { RequestPrice } from "./types.ts";

/**
 * What `tokens` cost at `price`: the first `price.prompt` of them at the
 * prompt price, the rest at the completion price (micro-units). Free
 * without a price.
 */
export function worstCost(price: RequestPrice | undefined, tokens: number) {
  if (!price) return 0;
  const prompt = Math.min(tokens, price.prompt);
  return perMillion(prompt, price.promptPerMillion) +
    perMillion(Math.max(0, tokens - prompt), price.completionPerMillion);
}

/** What a request's billed tokens cost (micro-units). */
export function billedCost(
  price: Pick<RequestPrice, "promptPerMillion" | "completionPerMillion">,
  promptTokens: number,
  completionTokens: number,
): number {
  return perMillion(promptTokens, price.promptPerMillion) +
    perMillion(completionTokens, price.completionPerMillion);
}

/**
 * The most tokens a request can take within `room` micro-units: its prompt
 * (all of it, or nothing fits: -1) and as many completion tokens as the
 * rest pays for (Infinity when completions are free).
 */
export function affordableTokens(
  price: RequestPrice | undefined,
  room: number,
): number {
  if (!price) return room > 0 ? Infinity : -1;
  const promptCost = perMillion(price.prompt, price.promptPerMillion);
  const left = room - promptCost;
  if (room <= 0 || left < 0) return -1;
  const p = Math.round(price.completionPerMillion);
  if (p <= 0) return Infinity;
  // perMillion(c, p) = floor((c·p + 500000) / 10^6) ≤ left
  //   ⇔ c·p ≤ (left + 1)·10^6 − 500001
  const most = (BigInt(left + 1) * 1_000_000n - 500_001n) / BigInt(p);
  return price.prompt + Number(most);
}
