/**
 * The command that joins a machine to this gateway, as the portal and the
 * admin API print it: enroll with the join token, then install the node as
 * a service (launchd on macOS, systemd on Linux) so it runs at every login
 * or boot. Pasted into a terminal in a checkout of this repository on a
 * machine with Deno (README, "Add a Mac").
 */

/** Whether `url`'s host is a loopback name or address. */
export function isLoopbackUrl(url: string): boolean {
  let host: string;
  try {
    host = new URL(url).hostname.replace(/^\[|\]$/g, "").toLowerCase();
  } catch {
    return false;
  }
  return host === "localhost" || host.endsWith(".localhost") ||
    /^127\./.test(host) || host === "::1";
}

/**
 * The gateway URL a new node should use: the public URL, unless that is
 * loopback (ORCHARD_PUBLIC_URL unset) and the admin reached this gateway
 * at another address, which then is the better guess.
 */
export function gatewayUrlForNodes(
  publicUrl: string,
  requestUrl?: string,
): string {
  const pub = publicUrl.replace(/\/+$/, "");
  if (!requestUrl || !isLoopbackUrl(pub)) return pub;
  const origin = new URL(requestUrl).origin;
  return isLoopbackUrl(origin) ? pub : origin;
}

/** Quotes a word for a POSIX shell when it needs it. */
export function shellQuote(word: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(word)
    ? word
    : `'${word.replaceAll("'", `'"'"'`)}'`;
}

/** What the portal and the admin API show to add a node. */
export interface JoinCommand {
  /** Enroll, then install the service: one line to paste. */
  command: string;
  /** The gateway URL in it. */
  gatewayUrl: string;
  /** Set when that URL is loopback: other machines cannot use it. */
  warning?: string;
}

/** Builds the join command for `token`. */
export function joinCommand(
  publicUrl: string,
  token: string,
  requestUrl?: string,
): JoinCommand {
  const gatewayUrl = gatewayUrlForNodes(publicUrl, requestUrl);
  const command = `deno task node join --gateway ${shellQuote(gatewayUrl)} ` +
    `--join ${shellQuote(token)} && deno task node service install`;
  return isLoopbackUrl(gatewayUrl)
    ? {
      command,
      gatewayUrl,
      warning:
        `${gatewayUrl} is a loopback address: only this machine can join with it. Set ORCHARD_PUBLIC_URL to the address other machines reach this gateway at.`,
    }
    : { command, gatewayUrl };
}
