/**
 * Token counts for the usage an upstream does not report. With the model's
 * own tokenizer where this machine has it: a Hugging Face `tokenizer.json`
 * (read with `@huggingface/tokenizers`) in the folder the engine loads the
 * model from — Exo's model folders, the Hugging Face hub cache that
 * mlx_lm.server and older Exo use, a folder named in
 * ORCHARD_TOKENIZER_DIRS, or the model id itself when it is a path — and
 * the chat rendered with the model's template first (`tokenizer_config.json`
 * or `chat_template.jinja`), as the engine does. Without one, an estimate
 * from the text's words, numbers, CJK characters and punctuation plus a
 * typical template's overhead; the basis (`counted` or `estimated`) goes
 * with the usage to the client and the usage record.
 *
 * Nothing is downloaded: a model whose tokenizer is not on disk is
 * estimated, and looked for again a few minutes later.
 */
import { Tokenizer } from "@huggingface/tokenizers";
import { join } from "node:path";
import { log } from "../../lib/log.ts";
import { ChatTemplate } from "../llama/chat_template.ts";

type Json = Record<string, unknown>;

/** How a usage figure was made when the upstream reported none. */
export type UsageBasis = "counted" | "estimated";

/** Counts tokens of a model's prompts and generated text. */
export interface TokenCounter {
  /** "counted" with the model's tokenizer, "estimated" without one. */
  readonly basis: UsageBasis;
  /** Tokens of generated text. */
  text(s: string): number;
  /** Tokens of a request's prompt: a chat as its template renders it, a prompt or embedding input as given. */
  prompt(body: Json, kind: "chat" | "text" | "embedding"): number;
}

/** Tokens a typical chat template adds per message (role markers, separators). */
export const PER_MESSAGE = 4;
/** Tokens a typical chat template adds per prompt (BOS, the assistant turn's opening). */
export const PER_PROMPT = 3;

const CJK_CLASS =
  "[\\p{Script=Han}\\p{Script=Hiragana}\\p{Script=Katakana}\\p{Script=Hangul}]";
/** Text in pieces: a CJK character, a word, a number, punctuation, whitespace. */
const PIECES = new RegExp(
  `${CJK_CLASS}|(?:(?!${CJK_CLASS})[\\p{L}\\p{M}])+|\\p{N}+|[^\\s\\p{L}\\p{M}\\p{N}]+|\\s+`,
  "gu",
);
const ASCII_WORD = /^[A-Za-z]+$/;

/**
 * Typical BPE token count of text without its tokenizer: a word is a token
 * (a long one one per 8 letters; non-ASCII words one per 3), a number one
 * per 3 digits, a CJK character one, punctuation one per 2 characters, and
 * whitespace other than the single space before a word one per run.
 */
export function estimateTokens(text: string): number {
  let n = 0;
  for (const [p] of text.matchAll(PIECES)) {
    if (/^\s/u.test(p)) {
      if (p !== " ") n += 1;
    } else if (/^\p{N}/u.test(p)) n += Math.ceil(p.length / 3);
    else if (/^[\p{L}\p{M}]/u.test(p)) {
      // a CJK character is a piece of its own: one token
      n += Math.ceil(p.length / (ASCII_WORD.test(p) ? 8 : 3));
    } else n += Math.ceil(p.length / 2);
  }
  return n;
}

/** The text of a message's content (a string, or parts with `text`). */
function contentText(v: unknown): string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) return "";
  let s = "";
  for (const p of v) {
    const t = (p as Json | null)?.text;
    if (typeof t === "string") s += (s ? "\n" : "") + t;
  }
  return s;
}

/** What a message says: content, reasoning, name and tool calls. */
function messageText(m: unknown): string {
  const o = (m ?? {}) as Json;
  let s = contentText(o.content);
  if (typeof o.reasoning_content === "string") s += o.reasoning_content;
  if (typeof o.name === "string") s += " " + o.name;
  if (Array.isArray(o.tool_calls)) s += " " + JSON.stringify(o.tool_calls);
  return s;
}

/** The strings (or token arrays) of a `prompt` or `input`. */
function inputs(v: unknown): (string | number)[] {
  if (typeof v === "string") return [v];
  if (!Array.isArray(v)) return [];
  if (v.every((x) => typeof x === "number")) return [v.length];
  return v.flatMap((x): (string | number)[] =>
    typeof x === "string"
      ? [x]
      : Array.isArray(x) && x.every((t) => typeof t === "number")
      ? [x.length]
      : []
  );
}

/** A chat's tokens as a typical template lays it out, with `count` for text. */
function chatTokens(body: Json, count: (s: string) => number): number {
  const msgs = Array.isArray(body.messages) ? body.messages : [];
  let n = PER_PROMPT;
  for (const m of msgs) n += PER_MESSAGE + count(messageText(m));
  if (Array.isArray(body.tools) && body.tools.length > 0) {
    n += count(JSON.stringify(body.tools));
  }
  return n;
}

function promptTokens(
  body: Json,
  kind: "chat" | "text" | "embedding",
  count: (s: string) => number,
): number {
  if (kind === "chat") return chatTokens(body, count);
  let n = 0;
  for (const x of inputs(kind === "text" ? body.prompt : body.input)) {
    n += typeof x === "number" ? x : count(x);
  }
  return n;
}

/** Counts without a tokenizer (see {@linkcode estimateTokens}). */
export const ESTIMATOR: TokenCounter = {
  basis: "estimated",
  text: estimateTokens,
  prompt: (body, kind) => promptTokens(body, kind, estimateTokens),
};

/** A model's tokenizer files, as found on disk. */
export interface TokenizerFiles {
  /** `tokenizer.json`, parsed. */
  tokenizer: Json;
  /** `tokenizer_config.json`, parsed (empty when absent). */
  config: Json;
  /** A chat template from `chat_template.jinja` or `chat_template.json`, when the config has none. */
  chatTemplate: string | null;
}

const special = (v: unknown): string =>
  typeof v === "string"
    ? v
    : typeof (v as Json | null)?.content === "string"
    ? (v as Json).content as string
    : "";

/** The template to render a chat with: the config's (named "tool_use" when tools are offered) or the file's. */
function templateSource(files: TokenizerFiles, tools: boolean): string | null {
  const t = files.config.chat_template;
  if (typeof t === "string") return t;
  if (Array.isArray(t)) {
    const named = (n: string) =>
      (t as Json[]).find((x) => x?.name === n)?.template;
    const pick = (tools ? named("tool_use") : undefined) ?? named("default") ??
      (t[0] as Json | undefined)?.template;
    if (typeof pick === "string") return pick;
  }
  return files.chatTemplate;
}

/** A counter from a model's tokenizer files; throws when the tokenizer cannot be built. */
export function tokenizerCounter(files: TokenizerFiles): TokenCounter {
  const tok = new Tokenizer(files.tokenizer, files.config);
  const count = (s: string) =>
    s ? tok.encode(s, { add_special_tokens: false }).ids.length : 0;
  const specials = {
    bosToken: special(files.config.bos_token),
    eosToken: special(files.config.eos_token),
  };
  const templates = new Map<string, ChatTemplate | null>();
  const compiled = (source: string) => {
    if (!templates.has(source)) {
      let t: ChatTemplate | null = null;
      try {
        t = new ChatTemplate(source, specials);
      } catch (err) {
        log.warn("cannot use the model's chat template to count tokens", {
          error: String(err),
        });
      }
      templates.set(source, t);
    }
    return templates.get(source)!;
  };
  return {
    basis: "counted",
    text: count,
    prompt(body, kind) {
      if (kind === "chat") {
        const tools = Array.isArray(body.tools) && body.tools.length > 0
          ? body.tools
          : null;
        const source = templateSource(files, tools !== null);
        const t = source ? compiled(source) : null;
        if (t && Array.isArray(body.messages)) {
          try {
            return count(t.render(body.messages, { tools }));
          } catch { /* a conversation it refuses: counted as a typical one */ }
        }
        return chatTokens(body, count);
      }
      let n = 0;
      for (const x of inputs(kind === "text" ? body.prompt : body.input)) {
        n += typeof x === "number"
          ? x
          : tok.encode(x, { add_special_tokens: true }).ids.length;
      }
      return n;
    },
  };
}

/** Where tokenizers are looked for. */
export interface TokenizerSearch {
  /**
   * Folders holding model folders, searched in order:
   * `<dir>/<org>--<name>`, `<dir>/<org>/<name>`, `<dir>/<name>`.
   */
  dirs: string[];
  /** The Hugging Face hub cache (`models--<org>--<name>/snapshots/<rev>/`), or null. */
  hubCache: string | null;
}

/**
 * The usual places on this machine: ORCHARD_TOKENIZER_DIRS, Exo's model
 * folders (EXO_MODELS_DIRS, EXO_MODELS_DIR, EXO_DEFAULT_MODELS_DIR,
 * ~/.local/share/exo/models, ~/.exo/models, ~/.cache/exo/downloads), and
 * the hub cache (HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub).
 */
export function defaultTokenizerSearch(
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): TokenizerSearch {
  const sep = Deno.build.os === "windows" ? ";" : ":";
  const list = (v: string | undefined) => (v ?? "").split(sep).filter(Boolean);
  const home = env("HOME") ?? env("USERPROFILE") ?? null;
  const dirs = [
    ...list(env("ORCHARD_TOKENIZER_DIRS")),
    ...list(env("EXO_MODELS_DIRS")),
    ...list(env("EXO_MODELS_DIR")),
    ...list(env("EXO_DEFAULT_MODELS_DIR")),
    ...(home
      ? [
        join(home, ".local", "share", "exo", "models"),
        join(home, ".exo", "models"),
        join(home, ".cache", "exo", "downloads"),
      ]
      : []),
  ];
  const hf = env("HF_HUB_CACHE") ??
    (env("HF_HOME") ? join(env("HF_HOME")!, "hub") : null) ??
    (home ? join(home, ".cache", "huggingface", "hub") : null);
  return { dirs: [...new Set(dirs)], hubCache: hf };
}

/** A Hugging Face repo id or plain model name that is safe to join to a folder. */
const REPO = /^[A-Za-z0-9][\w.-]*(\/[A-Za-z0-9][\w.-]*)?$/;
const MAX_TOKENIZER_BYTES = 64 * 1024 * 1024;

async function isFile(path: string): Promise<boolean> {
  try {
    return (await Deno.stat(path)).isFile;
  } catch {
    return false;
  }
}

/** The folder a model's tokenizer is in, or null. `names`: the model's id and the repo ids its listing gives. */
export async function findTokenizer(
  names: string[],
  search: TokenizerSearch,
): Promise<string | null> {
  const has = (dir: string) => isFile(join(dir, "tokenizer.json"));
  for (const name of names) {
    if (name.startsWith("/") && !name.split("/").includes("..")) {
      if (await has(name)) return name; // mlx_lm.server lists a local model by its path
      continue;
    }
    if (!REPO.test(name) || name.includes("..")) continue;
    const [org, repo] = name.includes("/") ? name.split("/") : [null, name];
    for (const dir of search.dirs) {
      const tries = org
        ? [join(dir, `${org}--${repo}`), join(dir, org, repo!)]
        : [join(dir, repo!)];
      for (const d of tries) if (await has(d)) return d;
    }
    if (search.hubCache) {
      const d = await hubSnapshot(search.hubCache, name);
      if (d) return d;
    }
  }
  return null;
}

/** The hub cache's snapshot of `repo` with a tokenizer: `refs/main`'s, else the newest. */
async function hubSnapshot(hub: string, repo: string): Promise<string | null> {
  const root = join(hub, `models--${repo.replace("/", "--")}`);
  const snapshots = join(root, "snapshots");
  try {
    const main = (await Deno.readTextFile(join(root, "refs", "main"))).trim();
    if (/^[0-9a-f]{6,64}$/.test(main)) {
      const d = join(snapshots, main);
      if (await isFile(join(d, "tokenizer.json"))) return d;
    }
  } catch { /* no refs/main */ }
  let best: { dir: string; at: number } | null = null;
  try {
    for await (const e of Deno.readDir(snapshots)) {
      const d = join(snapshots, e.name);
      try {
        const st = await Deno.stat(join(d, "tokenizer.json"));
        const at = st.mtime?.getTime() ?? 0;
        if (st.isFile && (!best || at > best.at)) best = { dir: d, at };
      } catch { /* none in this snapshot */ }
    }
  } catch { /* not cached */ }
  return best?.dir ?? null;
}

async function readJson(path: string, optional: boolean): Promise<Json> {
  try {
    const st = await Deno.stat(path);
    if (st.size > MAX_TOKENIZER_BYTES) {
      throw new Error(`${path} is larger than 64 MiB`);
    }
    const v = JSON.parse(await Deno.readTextFile(path));
    if (v === null || typeof v !== "object" || Array.isArray(v)) {
      throw new Error(`${path} is not a JSON object`);
    }
    return v as Json;
  } catch (err) {
    if (optional && err instanceof Deno.errors.NotFound) return {};
    throw err;
  }
}

/** Reads a model folder's tokenizer files. */
export async function readTokenizerFiles(dir: string): Promise<TokenizerFiles> {
  const tokenizer = await readJson(join(dir, "tokenizer.json"), false);
  const config = await readJson(join(dir, "tokenizer_config.json"), true);
  let chatTemplate: string | null = null;
  try {
    chatTemplate = await Deno.readTextFile(join(dir, "chat_template.jinja"));
  } catch {
    const t = (await readJson(join(dir, "chat_template.json"), true).catch(
      () => ({} as Json),
    )).chat_template;
    if (typeof t === "string") chatTemplate = t;
  }
  return { tokenizer, config, chatTemplate };
}

/** Options of {@linkcode TokenCounters}. */
export interface TokenCountersOptions {
  /** Where to look (default {@linkcode defaultTokenizerSearch}). */
  search?: TokenizerSearch;
  /** How long a model without a tokenizer is estimated before looking again (default 5 min). */
  retryMs?: number;
  now?: () => number;
}

/** Each served model's counter, loaded once (on first need) and kept while it is served. */
export class TokenCounters {
  readonly #search: TokenizerSearch;
  readonly #retryMs: number;
  readonly #now: () => number;
  readonly #byModel = new Map<
    string,
    { counter: Promise<TokenCounter>; at: number; names: string }
  >();

  constructor(opts: TokenCountersOptions = {}) {
    this.#search = opts.search ?? defaultTokenizerSearch();
    this.#retryMs = opts.retryMs ?? 300_000;
    this.#now = opts.now ?? Date.now;
  }

  /** The counter of `model` (`names`: its id and the repo ids its listing gives); the estimator when no tokenizer is found. */
  get(model: string, names: string[] = [model]): Promise<TokenCounter> {
    const key = names.join("\n");
    const hit = this.#byModel.get(model);
    if (hit && hit.names === key) {
      const stale = this.#now() - hit.at > this.#retryMs;
      if (!stale) return hit.counter;
      // a miss is looked for again; a tokenizer found stays
      const retry = hit.counter.then((c) =>
        c.basis === "counted" ? c : this.#load(model, names)
      );
      this.#byModel.set(model, { counter: retry, at: this.#now(), names: key });
      return retry;
    }
    const counter = this.#load(model, names);
    this.#byModel.set(model, { counter, at: this.#now(), names: key });
    return counter;
  }

  async #load(model: string, names: string[]): Promise<TokenCounter> {
    let dir: string | null = null;
    try {
      dir = await findTokenizer(names, this.#search);
      if (!dir) {
        log.debug("no tokenizer on disk: usage is estimated", { model });
        return ESTIMATOR;
      }
      const counter = tokenizerCounter(await readTokenizerFiles(dir));
      log.info("usage counted with the model's tokenizer", { model, dir });
      return counter;
    } catch (err) {
      log.warn("cannot load the model's tokenizer: usage is estimated", {
        model,
        dir,
        error: String(err),
      });
      return ESTIMATOR;
    }
  }

  /** Forgets the counters of models no longer served. */
  retain(models: ReadonlySet<string>): void {
    for (const id of this.#byModel.keys()) {
      if (!models.has(id)) this.#byModel.delete(id);
    }
  }
}
