import assert from "node:assert/strict";
import { decodeTime } from "ulid";
import { idBoundAt, newId, newIdAt } from "./ids.ts";

const ULID = /^[0-9abcdefghjkmnpqrstvwxyz]{26}$/;

Deno.test("newId: lower-case ULIDs, strictly increasing, time-ordered", () => {
  const ids = Array.from({ length: 10_000 }, () => newId());
  for (const id of ids) assert.match(id, ULID);
  for (let i = 1; i < ids.length; i++) assert.ok(ids[i - 1]! < ids[i]!);
  assert.equal(new Set(ids).size, ids.length);
  const t = decodeTime(ids.at(-1)!.toUpperCase());
  assert.ok(Math.abs(t - Date.now()) < 5_000);
});

Deno.test("newIdAt: ids of a moment sit between that moment's bounds; their random parts differ across moments", () => {
  const seen = new Set<string>();
  for (let ms = 1_700_000_000_000; ms < 1_700_000_000_200; ms++) {
    const id = newIdAt(ms);
    assert.ok(idBoundAt(ms, false) <= id && id <= idBoundAt(ms, true));
    seen.add(id.slice(10));
  }
  // 80 random bits each: 200 moments give 200 different random parts.
  assert.equal(seen.size, 200);
});

Deno.test("newId after an id for a future moment still says now (a reservation's deadline does not shift audit or usage ids)", () => {
  const future = Date.now() + 11 * 60_000;
  const deadline = newIdAt(future);
  assert.equal(decodeTime(deadline.toUpperCase()), future);
  const id = newId();
  assert.ok(Math.abs(decodeTime(id.toUpperCase()) - Date.now()) < 5_000);
  assert.ok(id >= idBoundAt(Date.now() - 5_000, false));
  assert.ok(id <= idBoundAt(Date.now() + 5_000, true));
});
