/**
 * The node's identity on disk: an Ed25519 key pair generated once, and after
 * enrollment the node id and the gateway's public keys. One JSON file, mode
 * 0600, in the state directory; a restart reuses it and needs no token.
 */
import { generateEd25519 } from "../lib/jwt.ts";

/** What the state file holds. */
export interface NodeIdentity {
  privateJwk: JsonWebKey;
  publicJwk: JsonWebKey;
  /** Set after enrollment. */
  enrollment: {
    nodeId: string;
    gatewayUrl: string;
    gatewayJwks: { keys: JsonWebKey[] };
    enrolledAt: string;
  } | null;
}

/** The default state directory: `~/.orchard/node`. */
export function defaultStateDir(): string {
  const home = Deno.env.get("HOME") ?? Deno.env.get("USERPROFILE") ?? ".";
  return `${home}/.orchard/node`;
}

function file(dir: string): string {
  return `${dir.replace(/\/+$/, "")}/identity.json`;
}

/** Reads the identity in `dir` without creating one; null when there is none. */
export async function readIdentity(dir: string): Promise<NodeIdentity | null> {
  try {
    const raw = JSON.parse(await Deno.readTextFile(file(dir)));
    return { enrollment: null, ...raw } as NodeIdentity;
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return null;
    throw new Error(`Cannot read node identity in ${file(dir)}`, {
      cause: err,
    });
  }
}

/** Loads the identity from `dir`, creating a fresh key pair on first use. */
export async function loadIdentity(dir: string): Promise<NodeIdentity> {
  try {
    const raw = JSON.parse(await Deno.readTextFile(file(dir)));
    if (raw?.privateJwk?.crv !== "Ed25519" || !raw.publicJwk) {
      throw new Error("missing key pair");
    }
    return { enrollment: null, ...raw } as NodeIdentity;
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) {
      throw new Error(`Cannot read node identity in ${file(dir)}`, {
        cause: err,
      });
    }
  }
  const { privateJwk, publicJwk } = await generateEd25519();
  const id: NodeIdentity = { privateJwk, publicJwk, enrollment: null };
  await saveIdentity(dir, id);
  return id;
}

/** Writes the identity atomically (temp file + rename), readable by the owner only. */
export async function saveIdentity(
  dir: string,
  id: NodeIdentity,
): Promise<void> {
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  const tmp = `${file(dir)}.${crypto.randomUUID()}.tmp`;
  await Deno.writeTextFile(tmp, JSON.stringify(id, null, 2) + "\n", {
    mode: 0o600,
  });
  await Deno.chmod(tmp, 0o600).catch(() => {}); // mode is ignored on Windows
  await Deno.rename(tmp, file(dir));
}
