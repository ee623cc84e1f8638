/**
 * `/settings` (platform admins only): chargeback prices per model and the
 * cluster cost model, validated by the pricing store and audited.
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { Alert, Card, Field, fmtTime, PostForm } from "../components/ui.tsx";
import { ALLOCATION_RULES, RULE_LABEL } from "../store/allocation.ts";
import { ValidationError } from "../store/errors.ts";
import { moneyText } from "../store/money.ts";
import { getPricing, type Pricing, setPricing } from "../store/pricing.ts";
import { requirePlatform } from "../store/principal.ts";
import type { PortalEnv } from "./_env.ts";
import {
  type Flash,
  FlashMessages,
  redirectWithFlash,
  takeFlash,
} from "./_flash.tsx";
import { page, str } from "./_page.tsx";
import {
  getRequestLogSettings,
  setRequestLogSettings,
} from "../store/request_log.ts";

type C = Context<PortalEnv>;

/** The form's values, as text (what was typed is shown back on errors). */
type FormValues = Record<string, string>;

const EXTRA_ROWS = 3;
const MAX_ROWS = 200;

const LABELS: Record<string, string> = {
  currency: "Currency",
  hardwarePricePerNode: "Hardware price per node",
  amortisationMonths: "Amortisation (months)",
  idleWatts: "Idle power per node (W)",
  busyWatts: "Busy power per node (W)",
  tariffPerKwh: "Tariff per kWh",
  allocation: "Split shared nodes' busy cost by",
  promptPerMillion: "prompt price",
  completionPerMillion: "completion price",
  model: "model",
};

function valuesOf(p: Pricing): FormValues {
  const v: FormValues = {
    currency: p.currency,
    hardwarePricePerNode: moneyText(p.cluster.hardwarePricePerNode),
    amortisationMonths: String(p.cluster.amortisationMonths),
    idleWatts: String(p.cluster.idleWatts),
    busyWatts: String(p.cluster.busyWatts),
    tariffPerKwh: moneyText(p.cluster.tariffPerKwh),
    allocation: p.cluster.allocation,
  };
  p.models.forEach((m, i) => {
    v[`model_${i}`] = m.model;
    v[`prompt_${i}`] = moneyText(m.promptPerMillion);
    v[`completion_${i}`] = moneyText(m.completionPerMillion);
  });
  return v;
}

function rowCount(v: FormValues): number {
  let n = 0;
  while (`model_${n}` in v && n < MAX_ROWS) n++;
  return n;
}

/** Turns a schema path like `models.2.promptPerMillion` into words. */
function readable(err: ValidationError): string {
  const [field, ...rest] = err.message.split(": ");
  const parts = (field ?? "").split(".");
  const last = parts.at(-1) ?? "";
  const what = parts[0] === "models" && parts.length === 3
    ? `Model row ${Number(parts[1]) + 1}, ${LABELS[last] ?? last}`
    : parts[0] === "models"
    ? "Model prices"
    : LABELS[last] ?? field;
  return `${what}: ${rest.join(": ")}`;
}

function inputOf(v: FormValues): Record<string, unknown> {
  const models = [];
  for (let i = 0; i < rowCount(v); i++) {
    const model = (v[`model_${i}`] ?? "").trim();
    const prompt = (v[`prompt_${i}`] ?? "").trim();
    const completion = (v[`completion_${i}`] ?? "").trim();
    if (!model && !prompt && !completion) continue;
    models.push({
      model,
      promptPerMillion: prompt || "0",
      completionPerMillion: completion || "0",
    });
  }
  return {
    currency: v.currency ?? "",
    models,
    cluster: {
      hardwarePricePerNode: v.hardwarePricePerNode || "0",
      amortisationMonths: v.amortisationMonths ?? "",
      idleWatts: v.idleWatts || "0",
      busyWatts: v.busyWatts || "0",
      tariffPerKwh: v.tariffPerKwh || "0",
      allocation: v.allocation || "busy_time",
    },
  };
}

function field(v: FormValues, name: string, hint?: string) {
  return (
    <div class="field">
      <label for={`s-${name}`}>
        {LABELS[name]} {hint && <span class="hint">{hint}</span>}
      </label>
      <input
        id={`s-${name}`}
        name={name}
        type="text"
        inputMode={name === "currency" ? "text" : "decimal"}
        value={v[name] ?? ""}
        required
        maxLength={40}
      />
    </div>
  );
}

async function view(
  c: C,
  flash: Flash & {
    error?: string;
    values?: FormValues;
    /** The retention typed when it was refused. */
    retention?: string;
  } = {},
) {
  const [pricing, log] = await Promise.all([
    getPricing(c.get("deps").store),
    getRequestLogSettings(c.get("deps").store),
  ]);
  const v = flash.values ?? valuesOf(pricing);
  const rows = rowCount(v) + EXTRA_ROWS;
  return page(
    c,
    "Settings",
    "/settings",
    (
      <>
        <h1>Settings</h1>
        <p class="sub">
          Chargeback: what tenants pay for tokens, and what the cluster costs.
          {pricing.updatedAt &&
            ` Last changed ${
              fmtTime(pricing.updatedAt)
            } by ${pricing.updatedBy}.`}{" "}
          <a href="/settings/sso">Single sign-on</a>
        </p>
        <FlashMessages flash={flash} />
        {flash.error && <Alert tone="error">{flash.error}</Alert>}
        <PostForm action="/settings" csrf={c.get("csrf")} id="pricing-form">
          <div class="grid2">
            <Card title="Cluster cost model">
              <p class="muted">
                Each node's hardware price is spread over the amortisation
                months; energy is idle power all month plus the extra busy power
                while serving, at the tariff. A shared node's busy hours are
                split among tenants by the rule below; its idle hours are the
                provider's own cost (the "Idle capacity (provider)" line of{" "}
                <a href="/chargeback">Chargeback</a>). A dedicated node costs
                its tenant everything.
              </p>
              {field(v, "currency", "ISO 4217, e.g. EUR")}
              {field(v, "hardwarePricePerNode")}
              {field(v, "amortisationMonths")}
              <div class="row">
                {field(v, "idleWatts")}
                {field(v, "busyWatts")}
              </div>
              {field(v, "tariffPerKwh")}
              <div class="field">
                <label for="s-allocation">{LABELS.allocation}</label>
                <select id="s-allocation" name="allocation">
                  {ALLOCATION_RULES.map((r) => (
                    <option key={r} value={r} selected={v.allocation === r}>
                      {RULE_LABEL[r]}
                    </option>
                  ))}
                </select>
              </div>
            </Card>
            <Card title="Token prices (per 1M tokens)">
              <table class="price-table">
                <thead>
                  <tr>
                    <th>Model</th>
                    <th>Prompt</th>
                    <th>Completion</th>
                  </tr>
                </thead>
                <tbody>
                  {Array.from(
                    { length: rows },
                    (_, i) => (
                      <tr key={i} data-row={i}>
                        <td>
                          <input
                            type="text"
                            name={`model_${i}`}
                            aria-label={`Model row ${i + 1}`}
                            value={v[`model_${i}`] ?? ""}
                            maxLength={200}
                          />
                        </td>
                        <td>
                          <input
                            type="text"
                            inputMode="decimal"
                            name={`prompt_${i}`}
                            aria-label={`Prompt price row ${i + 1}`}
                            value={v[`prompt_${i}`] ?? ""}
                            maxLength={40}
                          />
                        </td>
                        <td>
                          <input
                            type="text"
                            inputMode="decimal"
                            name={`completion_${i}`}
                            aria-label={`Completion price row ${i + 1}`}
                            value={v[`completion_${i}`] ?? ""}
                            maxLength={40}
                          />
                        </td>
                      </tr>
                    ),
                  )}
                </tbody>
              </table>
              <p class="muted">
                Clear a row to remove it. Models without a price are free.
              </p>
            </Card>
          </div>
          <button class="primary" type="submit">Save settings</button>
        </PostForm>
        <Card title="Request log" id="request-log">
          <FlashMessages flash={flash} section="request-log" />
          <PostForm
            action="/settings/request-log"
            csrf={c.get("csrf")}
            id="request-log-form"
            class="row"
            style="align-items:flex-end"
          >
            <Field
              label="Keep requests for (days)"
              name="retentionDays"
              type="number"
              min={log.minDays}
              max={log.maxDays}
              required
              value={flash.retention ?? log.retentionDays}
              hint={`${log.minDays} to ${log.maxDays} (the retention bounds); for tenants that chose no period of their own; applies to requests logged from now on`}
            />
            <div class="field" style="flex:0">
              <button type="submit">Save retention</button>
            </div>
          </PostForm>
        </Card>
      </>
    ),
    flash.error ? 400 : 200,
  );
}

/** `/settings`. */
export const settingsRoutes = new Hono<PortalEnv>()
  .get("/", async (c) => {
    requirePlatform(c.get("principal")!);
    return await view(c, await takeFlash(c));
  })
  .post("/", async (c) => {
    const p = c.get("principal")!;
    requirePlatform(p);
    const body = await c.req.parseBody();
    const values: FormValues = {};
    for (const [k, val] of Object.entries(body)) {
      if (!k.startsWith("_") && k.length < 40) {
        values[k] = str(val).slice(0, 400);
      }
    }
    try {
      await setPricing(c.get("deps").store, p, inputOf(values));
    } catch (err) {
      if (!(err instanceof ValidationError)) throw err;
      return view(c, { error: readable(err), values });
    }
    return await redirectWithFlash(c, "/settings", { ok: "Settings saved." });
  })
  .get("/request-log", (c) => {
    requirePlatform(c.get("principal")!);
    return c.redirect("/settings#request-log", 303);
  })
  .post("/request-log", async (c) => {
    const p = c.get("principal")!;
    requirePlatform(p);
    const days = str((await c.req.parseBody()).retentionDays).trim();
    try {
      await setRequestLogSettings(c.get("deps").store, p, {
        retentionDays: days === "" ? NaN : Number(days),
      });
    } catch (err) {
      if (!(err instanceof ValidationError)) throw err;
      return view(c, {
        error: readable(err),
        retention: days.slice(0, 20),
      });
    }
    return await redirectWithFlash(c, "/settings#request-log", {
      section: "request-log",
      ok: `Requests are kept ${days} days.`,
    });
  });
