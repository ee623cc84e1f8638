/**
 * The tenant page's data retention card without a browser: a tenant admin
 * chooses periods (POST/redirect/GET; a period outside the bounds is a
 * readable 400), downloads the export; a viewer reads only; a platform
 * admin deletes a tenant after confirming; the statement's footer states
 * the periods.
 */
import assert from "node:assert/strict";
import { createWorld, portalLogin, type TestWorld } from "./_helpers.ts";

function client(w: TestWorld, auth: { cookie: string; csrf: string }) {
  const headers = {
    cookie: auth.cookie,
    origin: "http://localhost",
    host: "localhost",
  };
  return {
    get: (path: string) =>
      Promise.resolve(
        w.app.request(path, { headers: { cookie: auth.cookie } }),
      ),
    post: (path: string, form: Record<string, string>) =>
      Promise.resolve(w.app.request(path, {
        method: "POST",
        headers: {
          ...headers,
          "content-type": "application/x-www-form-urlencoded",
        },
        body: new URLSearchParams({
          ...form,
          _csrf: auth.csrf,
          _once: crypto.randomUUID(),
        }),
      })),
  };
}

Deno.test("tenant page: retention chosen within bounds, export downloaded, deletion confirmed by a platform admin; the statement footer states the periods", async () => {
  const w = await createWorld();
  try {
    const a = w.tenantA.id, b = w.tenantB.id;
    const admin = client(w, await portalLogin(w, "a-admin@example.com"));
    let html = await (await admin.get(`/tenants/${a}`)).text();
    assert.match(html, /Data retention/);
    assert.match(html, /data-retention="usage"[\s\S]*?90 days/);
    let res = await admin.post(`/tenants/${a}/retention`, {
      usage: "14",
      audit: "",
      responses: "3",
    });
    assert.equal(res.status, 303);
    assert.equal(res.headers.get("location"), `/tenants/${a}#retention`);
    html = await (await admin.get(`/tenants/${a}`)).text();
    assert.match(html, /data-retention="usage"[\s\S]*?14 days/);
    assert.match(html, /data-retention="responses"[\s\S]*?3 days/);
    assert.match(html, /data-retention="audit"[\s\S]*?365 days/);
    res = await admin.post(`/tenants/${a}/retention`, { usage: "5000" });
    assert.equal(res.status, 400);
    const err = await res.text();
    assert.match(err, /must be between 1 and 730 days/);
    assert.doesNotMatch(err, /usage: /); // the label, not the field path
    res = await admin.get(`/tenants/${a}/export`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-disposition")!, /attachment/);
    assert.equal((await res.json()).tenant.id, a);
    assert.ok(!html.includes("Delete tenant"));
    const statement = await (await admin.get(
      `/tenants/${a}/statements/${new Date().toISOString().slice(0, 7)}`,
    )).text();
    assert.match(
      statement,
      /usage records \(the request log\) 14 days, audit entries 365 days/,
    );

    const viewer = client(w, await portalLogin(w, "a-viewer@example.com"));
    html = await (await viewer.get(`/tenants/${a}`)).text();
    assert.match(html, /14 days/);
    assert.ok(!html.includes("Export records"));
    assert.equal((await viewer.get(`/tenants/${a}/export`)).status, 403);
    assert.equal(
      (await viewer.post(`/tenants/${a}/retention`, { usage: "20" })).status,
      403,
    );
    assert.equal(
      (await admin.post(`/tenants/${a}/delete`, { confirm: "1" })).status,
      403,
    );

    const root = client(w, await portalLogin(w, "root@example.com"));
    res = await root.post(`/tenants/${b}/delete`, {});
    assert.equal(res.status, 200); // asks first
    assert.match(await res.text(), /Yes, delete/);
    res = await root.post(`/tenants/${b}/delete`, { confirm: "1" });
    assert.equal(res.status, 303);
    html = await (await root.get(`/tenants/${b}`)).text();
    assert.match(html, /deletion scheduled/);
    assert.match(html, /Cancel deletion/);
    res = await root.post(`/tenants/${b}/deletion/cancel`, {});
    assert.equal(res.status, 303);
    html = await (await root.get(`/tenants/${b}`)).text();
    assert.doesNotMatch(html, /deletion scheduled/);
  } finally {
    await w.close();
  }
});
