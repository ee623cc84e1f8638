/**
 * Tool calls in OpenAI's exact shapes, from whatever an engine sent: one
 * owner for the openai engine (upstream quirks) and the gateway (untrusted
 * nodes).
 *
 * A final message's call is `{id, type: "function", function: {name,
 * arguments}}` with `arguments` a JSON string. In a stream, the first delta
 * of each call carries `index`, `id`, `type` and `function.name`; later
 * deltas carry only `index` and `function.arguments`, the pieces
 * concatenating to the arguments. Quirks repaired: `arguments` sent as an
 * object (Exo before its October 2025 fix, Ollama's native shape); a missing
 * or null `id`, `type` or `index` (mlx_lm.server's older releases); the name
 * (and id) repeated in every delta; extra keys inside `function` (Exo's
 * `function.id`); `index` on a final message's calls (Exo).
 */

const isObj = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === "object" && !Array.isArray(v);

/** A fresh tool-call id with OpenAI's prefix. */
export function toolCallId(): string {
  return `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
}

function argumentsText(v: unknown, whole: boolean): string {
  if (typeof v === "string") return v;
  if (v === undefined || v === null) return whole ? "{}" : "";
  return JSON.stringify(v);
}

/** A final message's tool calls in exact shapes; null when there are none or one is malformed. */
export function normaliseToolCalls(
  list: unknown,
): Record<string, unknown>[] | null {
  if (!Array.isArray(list) || list.length === 0) return null;
  const out: Record<string, unknown>[] = [];
  for (const tc of list) {
    if (!isObj(tc) || !isObj(tc.function)) return null;
    out.push({
      id: typeof tc.id === "string" && tc.id ? tc.id : toolCallId(),
      type: "function",
      function: {
        name: typeof tc.function.name === "string" ? tc.function.name : "",
        arguments: argumentsText(tc.function.arguments, true),
      },
    });
  }
  return out;
}

/**
 * The finish reason of a choice that made tool calls: engines that say
 * "stop" (or nothing) after calling tools meant "tool_calls".
 */
export function toolFinishReason(reason: unknown): unknown {
  return reason === "stop" || reason === null || reason === undefined
    ? "tool_calls"
    : reason;
}

interface Call {
  index: number;
  id: string | null;
  name: string;
  args: string;
}

function completeJson(s: string): boolean {
  try {
    JSON.parse(s);
    return true;
  } catch {
    return false;
  }
}

/** Normalises the tool-call deltas of one streamed choice, call by call. */
export class ToolCallDeltas {
  readonly #calls = new Map<number, Call>();
  readonly #byId = new Map<string, number>();
  #current: Call | null = null;

  /** How many distinct calls have been seen. */
  get count(): number {
    return this.#calls.size;
  }

  /**
   * The deltas of one chunk in exact shapes; null when one is malformed
   * (not an object, or a `function` that is not an object).
   */
  push(deltas: unknown[]): Record<string, unknown>[] | null {
    const out: Record<string, unknown>[] = [];
    for (const d of deltas) {
      if (!isObj(d)) return null;
      const fn = d.function ?? {};
      if (!isObj(fn)) return null;
      const id = typeof d.id === "string" && d.id ? d.id : null;
      const name = typeof fn.name === "string" ? fn.name : "";
      const whole = fn.arguments !== undefined && fn.arguments !== null &&
        typeof fn.arguments !== "string";
      const args = argumentsText(fn.arguments, false);
      const index = this.#indexOf(d.index, id, name);
      let call = this.#calls.get(index);
      if (!call) {
        call = { index, id: id ?? toolCallId(), name, args };
        this.#calls.set(index, call);
        this.#byId.set(call.id!, index);
        out.push({
          index,
          id: call.id,
          type: "function",
          function: { name, arguments: args },
        });
      } else {
        // The name goes out once; a late one only when the first had none.
        const late = call.name === "" && name !== "";
        if (late) call.name = name;
        // A whole object after pieces restates the call: send nothing new.
        const piece = whole && call.args !== "" ? "" : args;
        call.args += piece;
        out.push({
          index,
          function: late ? { name, arguments: piece } : { arguments: piece },
        });
      }
      this.#current = call;
    }
    return out;
  }

  /** The call a delta belongs to: its index, else its id, else guessed from the name. */
  #indexOf(index: unknown, id: string | null, name: string): number {
    if (Number.isSafeInteger(index) && (index as number) >= 0) {
      return index as number;
    }
    const next = this.#calls.size === 0
      ? 0
      : Math.max(...this.#calls.keys()) + 1;
    if (id !== null) return this.#byId.get(id) ?? next;
    const cur = this.#current;
    if (cur === null) return next;
    const another = name !== "" && cur.name !== "" &&
      (name !== cur.name || completeJson(cur.args));
    return another ? next : cur.index;
  }
}
