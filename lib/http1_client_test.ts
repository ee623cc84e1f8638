import * as assert from "node:assert/strict";
import { Http1Client, Http1Error } from "./http1_client.ts";

/** A TCP server whose every connection is driven by `script` (raw bytes). */
function rawServer(
  script: (conn: Deno.TcpConn, index: number) => Promise<void>,
): { url: string; connections: () => number; close: () => Promise<void> } {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const open = new Set<Deno.TcpConn>();
  const running: Promise<void>[] = [];
  let n = 0;
  const accepting = (async () => {
    for await (const conn of listener) {
      open.add(conn);
      running.push(
        script(conn, n++).catch(() => {}).finally(() => {
          open.delete(conn);
          try {
            conn.close();
          } catch { /* closed by the script */ }
        }),
      );
    }
  })();
  return {
    url: `http://127.0.0.1:${listener.addr.port}`,
    connections: () => n,
    close: async () => {
      listener.close();
      await accepting.catch(() => {});
      for (const c of open) {
        try {
          c.close();
        } catch { /* closed */ }
      }
      await Promise.all(running);
    },
  };
}

const enc = new TextEncoder();
const dec = new TextDecoder();

/** Reads one request head and its content-length body; null at the connection's end. */
async function readRequest(
  conn: Deno.Conn,
): Promise<{ head: string; body: string } | null> {
  let buf = "";
  const chunk = new Uint8Array(65536);
  for (;;) {
    const end = buf.indexOf("\r\n\r\n");
    if (end >= 0) {
      const head = buf.slice(0, end);
      const len = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
      while (buf.length < end + 4 + len) {
        const n = await conn.read(chunk);
        if (n === null) return null;
        buf += dec.decode(chunk.subarray(0, n));
      }
      return { head, body: buf.slice(end + 4, end + 4 + len) };
    }
    const n = await conn.read(chunk);
    if (n === null) return null;
    buf += dec.decode(chunk.subarray(0, n));
  }
}

const write = (conn: Deno.Conn, s: string) => conn.write(enc.encode(s));

/** The error `f` rejects with (fails when it resolves). */
async function rejection(f: () => Promise<unknown>): Promise<unknown> {
  try {
    await f();
  } catch (e) {
    return e;
  }
  throw new assert.AssertionError({ message: "expected a rejection" });
}

Deno.test("Http1Client reuses one keep-alive connection for sequential requests", async () => {
  const heads: string[] = [];
  const srv = rawServer(async (conn) => {
    for (;;) {
      const req = await readRequest(conn);
      if (!req) return;
      heads.push(req.head);
      const body = JSON.stringify({ echo: req.body });
      await write(
        conn,
        `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`,
      );
    }
  });
  const client = new Http1Client();
  try {
    for (let i = 0; i < 3; i++) {
      const res = await client.request(srv.url, "/v1/chat", {
        headers: {
          "content-type": "application/json",
          "x-request-id": `r${i}`,
        },
        body: `{"i":${i}}`,
      });
      assert.deepEqual(res.status, 200);
      assert.deepEqual(res.headers.get("Content-Type"), "application/json");
      assert.deepEqual(JSON.parse(await res.text()), { echo: `{"i":${i}}` });
    }
    assert.deepEqual(srv.connections(), 1);
    assert.deepEqual(client.idleConnections, 1);
    assert.ok(heads[2]!.startsWith("POST /v1/chat HTTP/1.1\r\n"));
    assert.ok(heads[2]!.includes("\r\nx-request-id: r2"));
    assert.ok(heads[2]!.includes("\r\ncontent-length: 7"));
  } finally {
    client.closeIdle();
    await srv.close();
  }
});

Deno.test("Http1Client reads chunked bodies split at every byte, with 1xx heads and trailers", async () => {
  const srv = rawServer(async (conn) => {
    await readRequest(conn);
    const wire = "HTTP/1.1 100 Continue\r\n\r\n" +
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n" +
      "6;ext=1\r\ndata: \r\n" + "9\r\nhello\n\nda\r\n" + "3\r\nta:\r\n" +
      "0\r\nx-trailer: 1\r\n\r\n";
    for (const ch of wire) {
      await write(conn, ch); // one byte a write: every boundary split
      await new Promise((r) => setTimeout(r, 0));
    }
    await readRequest(conn); // stays open: the connection is reusable
  });
  const client = new Http1Client();
  try {
    const res = await client.request(srv.url, "/x", { body: "{}" });
    assert.deepEqual(res.status, 200);
    assert.deepEqual(await res.text(), "data: hello\n\ndata:");
    assert.deepEqual(client.idleConnections, 1);
  } finally {
    client.closeIdle();
    await srv.close();
  }
});

Deno.test("Http1Client streams a body to its end and reads close-delimited bodies", async () => {
  const srv = rawServer(async (conn, i) => {
    await readRequest(conn);
    if (i === 0) {
      await write(
        conn,
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
      );
      for (const part of ["one ", "two ", "three"]) {
        await write(conn, `${part.length.toString(16)}\r\n${part}\r\n`);
        await new Promise((r) => setTimeout(r, 5));
      }
      await write(conn, "0\r\n\r\n");
      await readRequest(conn);
    } else {
      await write(conn, "HTTP/1.1 200 OK\r\n\r\nuntil the end");
    }
  });
  const client = new Http1Client();
  try {
    const res = await client.request(srv.url, "/a", {});
    const parts: string[] = [];
    for await (const p of res.body()) parts.push(dec.decode(p));
    assert.deepEqual(parts.join(""), "one two three");
    assert.ok(parts.length >= 2, "pieces come as they arrive");
    assert.deepEqual(client.idleConnections, 1);
    client.closeIdle();
    const closing = await client.request(srv.url, "/b", {});
    assert.deepEqual(await closing.text(), "until the end");
    assert.deepEqual(
      client.idleConnections,
      0,
      "a close-delimited body ends its connection",
    );
  } finally {
    client.closeIdle();
    await srv.close();
  }
});

Deno.test("Http1Client sends again on a new connection when an idle one was closed by the node", async () => {
  const srv = rawServer(async (conn) => {
    const req = await readRequest(conn);
    if (!req) return;
    await write(conn, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
    // The node closes the idle connection (its keep-alive timeout).
  });
  const client = new Http1Client();
  try {
    assert.deepEqual(
      await (await client.request(srv.url, "/", {})).text(),
      "ok",
    );
    await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(
      await (await client.request(srv.url, "/", {})).text(),
      "ok",
    );
    assert.deepEqual(srv.connections(), 2);
  } finally {
    client.closeIdle();
    await srv.close();
  }
});

Deno.test("Http1Client does not send again once a response began, and reports the break", async () => {
  let requests = 0;
  const srv = rawServer(async (conn) => {
    await readRequest(conn);
    requests++;
    await write(conn, "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial");
  });
  const client = new Http1Client();
  try {
    const res = await client.request(srv.url, "/", {});
    const e = await rejection(() => res.text());
    assert.ok(e instanceof Http1Error);
    assert.equal(e.kind, "closed");
    assert.deepEqual(requests, 1);
    assert.deepEqual(client.idleConnections, 0);
  } finally {
    client.closeIdle();
    await srv.close();
  }
});

Deno.test("Http1Client rejects malformed, oversized and ambiguous responses", async () => {
  const replies = [
    "HTTP/1.1 OK\r\n\r\n",
    "HTTP/1.1 200 OK\r\nbad header line\r\n\r\n",
    "HTTP/1.1 200 OK\r\ncontent-length: 3, 4\r\n\r\nabc",
    `HTTP/1.1 200 OK\r\nx-big: ${"a".repeat(70_000)}\r\n\r\n`,
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
  ];
  const srv = rawServer(async (conn, i) => {
    await readRequest(conn);
    await write(conn, replies[i]!);
    await readRequest(conn);
  });
  const client = new Http1Client();
  try {
    const kinds: string[] = [];
    for (let i = 0; i < replies.length; i++) {
      try {
        const res = await client.request(srv.url, "/", {});
        await res.text();
        kinds.push("ok");
      } catch (e) {
        kinds.push(e instanceof Http1Error ? e.kind : String(e));
      }
    }
    assert.deepEqual(kinds, [
      "malformed",
      "malformed",
      "malformed",
      "too_large",
      "malformed",
    ]);
    assert.deepEqual(client.idleConnections, 0);
  } finally {
    client.closeIdle();
    await srv.close();
  }
});

Deno.test("Http1Client caps a body's size and refuses header injection", async () => {
  const srv = rawServer(async (conn) => {
    await readRequest(conn);
    await write(
      conn,
      "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789",
    );
    await readRequest(conn);
  });
  const client = new Http1Client();
  try {
    const res = await client.request(srv.url, "/", {});
    const e = await rejection(() => res.text(5));
    assert.ok(e instanceof Http1Error);
    assert.equal(e.kind, "too_large");
    assert.ok(
      await rejection(() =>
        client.request(srv.url, "/", { headers: { "x-a": "1\r\nx-b: 2" } })
      ) instanceof TypeError,
    );
    assert.ok(
      await rejection(() => client.request(srv.url, "/a b", {})) instanceof
        TypeError,
    );
  } finally {
    client.closeIdle();
    await srv.close();
  }
});

Deno.test("Http1Client aborts: the signal's reason rejects, the connection closes", async () => {
  const closed = Promise.withResolvers<void>();
  const srv = rawServer(async (conn) => {
    await readRequest(conn);
    await write(
      conn,
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n",
    );
    // Waits for the client to go away.
    const n = await conn.read(new Uint8Array(16)).catch(() => null);
    if (n === null) closed.resolve();
  });
  const client = new Http1Client();
  try {
    const abort = new AbortController();
    const res = await client.request(srv.url, "/", { signal: abort.signal });
    const reader = res.body().getReader();
    assert.deepEqual(dec.decode((await reader.read()).value), "first");
    const pending = reader.read();
    const why = new DOMException("gone", "AbortError");
    abort.abort(why);
    assert.deepEqual(await pending.then(() => null, (e) => e), why);
    await closed.promise;
    assert.deepEqual(client.idleConnections, 0);
    assert.equal(
      await rejection(() =>
        client.request(srv.url, "/", { signal: abort.signal })
      ),
      why,
    );
  } finally {
    client.closeIdle();
    await srv.close();
  }
});

Deno.test("Http1Client reads large bodies from Deno.serve, framed either way", async () => {
  const big = "x".repeat(3_000_000);
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    (req) => {
      if (new URL(req.url).pathname === "/length") return new Response(big);
      const parts = [big.slice(0, 1_000_000), big.slice(1_000_000)];
      return new Response(
        new ReadableStream({
          pull(ctl) {
            const p = parts.shift();
            if (p === undefined) ctl.close();
            else ctl.enqueue(enc.encode(p));
          },
        }),
      );
    },
  );
  const client = new Http1Client();
  try {
    const base = `http://127.0.0.1:${server.addr.port}`;
    for (const path of ["/length", "/stream", "/length"]) {
      const res = await client.request(base, path, { method: "GET" });
      assert.deepEqual((await res.text()).length, big.length);
    }
    assert.deepEqual(client.idleConnections, 1);
  } finally {
    client.closeIdle();
    await server.shutdown();
  }
});
