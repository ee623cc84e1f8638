import assert from "node:assert/strict";
import { parseRdmaResource, rdmaInUse } from "./rdma_usage.ts";

Deno.test("parseRdmaResource() reads iproute2's `rdma -j resource show` per device and skips malformed rows", () => {
  // the shape iproute2 prints (res_print_summary): ifindex, ifname, then counts
  const out = parseRdmaResource([
    {
      ifindex: 0,
      ifname: "mlx5_0",
      pd: 3,
      cq: 4,
      qp: 2,
      cm_id: 0,
      mr: 5,
      ctx: 1,
      srq: 0,
    },
    { ifindex: 1, ifname: "rxe0", pd: 0, cq: 0, qp: 0, mr: 0 },
    { ifname: "bad", qp: "2", mr: 1 },
    null,
  ]);
  assert.deepEqual([...out.entries()], [
    ["mlx5_0", { qp: 2, mr: 5, source: "rdma resource show" }],
    ["rxe0", { qp: 0, mr: 0, source: "rdma resource show" }],
  ]);
  assert.equal(parseRdmaResource({ not: "a list" }).size, 0);
});

Deno.test("rdmaInUse() is null when the tool is missing", async () => {
  assert.equal(await rdmaInUse("/nonexistent/rdma"), null);
});
