// deno-lint-ignore-file no-console -- entry point: prints the setup link and the listening address.
/**
 * `deno task start`: portal + gateway on one port over Deno KV (an embedded
 * file under ORCHARD_DATA_DIR, or a remote KV at ORCHARD_KV_URL), plus a
 * local node worker so one machine works end to end.
 */
import { loadConfig } from "./config.ts";
import { buildIslands } from "./lib/islands_build.ts";
import { log } from "./lib/log.ts";
import { createOrchard } from "./orchard.ts";
import { loadIdentity } from "./node/identity.ts";
import { startNodeWorker } from "./node/worker.ts";
import { localNodeOptions } from "./node/flags.ts";
import { newId } from "./store/ids.ts";
import { localInstanceId } from "./store/instances.ts";
import { createJoinToken } from "./store/join_tokens.ts";
import { getNodeRecord } from "./store/nodes.ts";
import { SYSTEM } from "./store/principal.ts";
import type { Store } from "./store/store.ts";
import { registerEnvAdminToken } from "./store/admin_tokens.ts";
import { bootstrapAdmin } from "./store/sessions.ts";
import { createStore } from "./store/store.ts";
import { secureDataDir } from "./store/data_dir.ts";

/**
 * Opens KV: remote when ORCHARD_KV_URL is set, else a local file (one
 * process only) in a data directory only this user can read (0700, files
 * 0600: store/data_dir.ts), tightened with a warning where it was not.
 */
async function openKv(dataDir: string, kvUrl: string | null): Promise<Deno.Kv> {
  if (kvUrl) return await Deno.openKv(kvUrl);
  if (dataDir === ":memory:") return await Deno.openKv(":memory:");
  // what a fresh start makes is private from the start; what an older
  // version, a copy or a restore left readable is said
  for (const t of await secureDataDir(dataDir)) {
    log.warn("data directory: permissions tightened", {
      path: t.path,
      was: t.was.toString(8),
    });
  }
  const kv = await Deno.openKv(`${dataDir.replace(/\/+$/, "")}/orchard.kv`);
  await secureDataDir(dataDir); // the KV file SQLite made follows the umask
  return kv;
}

/**
 * Starts the in-process node worker of `deno task start`: it enrolls with
 * this gateway over loopback (with a join token made here, only when it is
 * not enrolled yet) and serves the models in ORCHARD_MODELS_DIR.
 */
async function startLocalNode(
  store: Store,
  port: number,
  dataDir: string,
  modelsDir: string,
) {
  const gatewayUrl = `http://127.0.0.1:${port}`;
  const stateDir = Deno.env.get("ORCHARD_NODE_STATE_DIR") ||
    `${dataDir === ":memory:" ? await Deno.makeTempDir() : dataDir}/local-node`;
  const identity = await loadIdentity(stateDir);
  const enrolled = identity.enrollment?.gatewayUrl === gatewayUrl &&
    await getNodeRecord(store, identity.enrollment.nodeId) !== null;
  const joinToken = enrolled
    ? null
    : (await createJoinToken(store, { ...SYSTEM, label: "local node" }, {
      ttlSeconds: 300,
    })).token;
  const opts = localNodeOptions({ gatewayUrl, joinToken, modelsDir, stateDir });
  const engine = opts.engine;
  const node = await startNodeWorker(opts);
  log.info("local node serving", {
    nodeId: node.nodeId,
    url: node.url,
    engine,
  });
  return node;
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
  // An embedded KV is this process's alone: its gateway identity lives in
  // the data directory, so a restart reclaims at once what it held.
  const instanceId = config.kvUrl || config.dataDir === ":memory:"
    ? newId()
    : await localInstanceId(config.dataDir);
  const orchard = createOrchard({
    store,
    config,
    islands,
    gateway: {
      instanceId,
      // Usage survives a kill: journaled in the data directory, replayed at start.
      usageJournalDir: config.dataDir === ":memory:"
        ? undefined
        : `${config.dataDir.replace(/\/+$/, "")}/usage-journal`,
    },
  });
  await orchard.gateway.start();
  const app = orchard.app;
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
  // The stop handlers are in place before the local node starts: a SIGTERM
  // while it starts still drains and writes what the gateway holds.
  const localNode = config.localNode
    ? startLocalNode(
      store,
      config.port === 0 ? server.addr.port : config.port,
      config.dataDir,
      config.modelsDir,
    )
      .catch((err) => {
        log.error(
          "the local node did not start; the portal and gateway keep running",
          { error: String(err?.message ?? err) },
        );
        return null;
      })
    : null;
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    // New connections are refused; requests in flight get the drain time,
    // then the gateway ends them (and tells their nodes to stop).
    const late = setTimeout(
      () => orchard.gateway.stopCalls(),
      config.drainTimeoutMs,
    );
    await server.shutdown();
    clearTimeout(late);
    await (await localNode)?.close();
    await orchard.close();
    kv.close();
    Deno.exit(0);
  };
  Deno.addSignalListener("SIGINT", stop);
  Deno.addSignalListener("SIGTERM", stop);
}
