import * as assert from "node:assert/strict";
import { InFlight } from "./in_flight.ts";

Deno.test("InFlight aborts a request's signal when its connection's signal aborts", () => {
  const requests = new InFlight();
  const conn = new AbortController();
  const req = requests.begin("req_1", conn.signal);
  assert.equal(req.signal.aborted, false);
  conn.abort(new DOMException("gone", "AbortError"));
  assert.equal(req.signal.aborted, true);
  assert.equal((req.signal.reason as DOMException).message, "gone");
  req.end();
});

Deno.test("InFlight.cancel() aborts the request with that id until it ends", () => {
  const requests = new InFlight();
  const conn = new AbortController();
  const a = requests.begin("req_a", conn.signal);
  const b = requests.begin("req_b", conn.signal);
  assert.equal(requests.cancel("req_a"), true);
  assert.equal(a.signal.aborted, true);
  assert.equal(b.signal.aborted, false);
  b.end();
  assert.equal(requests.cancel("req_b"), false, "ended: nothing to cancel");
  assert.equal(b.signal.aborted, false);
  assert.equal(requests.cancel("req_unknown"), false);
  a.end();
});

Deno.test("InFlight requests without an id are cancelled only by their connection or cancel()", () => {
  const requests = new InFlight();
  const conn = new AbortController();
  const req = requests.begin(null, conn.signal);
  req.cancel();
  assert.equal(req.signal.aborted, true);
  req.end();
  conn.abort(); // after end: no listener left, nothing happens
});
