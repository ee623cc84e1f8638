/** Byte-array helpers shared by the request-body reader and the HTTP/1.1 client. */

/**
 * Joins `parts` (`size` bytes in all) into one array; a single part is
 * returned as it is, not copied. Written here: the standard library's
 * `concat` (@std/bytes) is published only on JSR, which these machines
 * cannot reach, and this is six lines.
 */
export function concat(parts: Uint8Array[], size: number): Uint8Array {
  if (parts.length === 1) return parts[0]!;
  const out = new Uint8Array(size);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}
