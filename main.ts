// deno-lint-ignore-file no-console -- entry point: prints the setup link and the listening address.
/**
 * `deno task start`: portal + gateway on one port over Deno KV (an embedded
 * file under ORCHARD_DATA_DIR, or a remote KV at ORCHARD_KV_URL), plus a
 * local node worker so one machine works end to end.
 */
import { loadConfig } from "./config.ts";
import { buildIslands } from "./lib/islands_build.ts";
import { log } from "./lib/log.ts";
import { createOrchardApp } from "./server.tsx";
import { registerEnvAdminToken } from "./store/admin_tokens.ts";
import { bootstrapAdmin } from "./store/sessions.ts";
import { createStore } from "./store/store.ts";

/** Opens KV: remote when ORCHARD_KV_URL is set, else a local file (one process only). */
async function openKv(dataDir: string, kvUrl: string | null): Promise<Deno.Kv> {
  if (kvUrl) return await Deno.openKv(kvUrl);
  if (dataDir === ":memory:") return await Deno.openKv(":memory:");
  await Deno.mkdir(dataDir, { recursive: true });
  return await Deno.openKv(`${dataDir.replace(/\/+$/, "")}/orchard.kv`);
}

if (import.meta.main) {
  const config = loadConfig();
  const kv = await openKv(config.dataDir, config.kvUrl);
  const store = await createStore(kv);
  if (config.adminToken) await registerEnvAdminToken(store, config.adminToken);
  const boot = await bootstrapAdmin(store, {
    email: config.adminEmail ?? undefined,
    password: config.adminPassword ?? undefined,
  });
  if (boot?.created) {
    log.info("created the first platform admin", { email: boot.created });
  }
  const islands = await buildIslands();
  const deps = { store, config };
  const app = createOrchardApp(deps, islands);
  const server = Deno.serve({
    port: config.port,
    hostname: config.hostname,
    onListen: ({ port }) => {
      console.log(`Orchard listening on http://localhost:${port}`);
      if (boot?.setupToken) {
        console.log(
          `\nNo admin exists yet. Open this one-time setup link to create one:\n  ${config.publicUrl}/setup?token=${boot.setupToken}\n`,
        );
      }
    },
  }, app.fetch);
  const stop = async () => {
    await server.shutdown();
    kv.close();
    Deno.exit(0);
  };
  Deno.addSignalListener("SIGINT", stop);
  Deno.addSignalListener("SIGTERM", stop);
}
