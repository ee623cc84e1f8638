/**
 * `deno task node service …` and the one-command join: the launchd plist
 * and systemd unit, generated on any machine in a temporary HOME and
 * checked (plutil / systemd-analyze where present, else parsed here), and
 * the portal's join command run as printed in a clean HOME against a
 * running gateway, then the service it installed run as systemd would.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { generateEd25519 } from "../lib/jwt.ts";
import { loadSavedFlags, saveFlags } from "../node/flags.ts";
import { saveIdentity } from "../node/identity.ts";
import {
  NO_RESTART_EXIT,
  runServiceCommand,
  type ServiceContext,
} from "../node/service.ts";
import { startFakeUpstream, startGateway, until } from "./_fleet.ts";
import {
  parsePlist,
  parseUnit,
  type PlistValue,
  runIfPresent,
  unitWords,
  verifyUnit,
} from "./fixtures/service_files.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");

/** A machine for `runServiceCommand`: this OS, HOME = `home`, managers faked. */
function machine(home: string, env: Record<string, string> = {}) {
  const out: string[] = [];
  const err: string[] = [];
  const ran: string[] = [];
  const vars: Record<string, string> = {
    HOME: home,
    PATH: "/usr/local/bin:/usr/bin:/bin",
    USER: "tester",
    ...env,
  };
  const ctx: ServiceContext = {
    hostOs: Deno.build.os,
    env: (n) => vars[n],
    cwd: home,
    uid: 501,
    denoPath: Deno.execPath(),
    root: ROOT,
    out: (l) => out.push(l),
    err: (l) => err.push(l),
    exec: (argv) => {
      ran.push(argv.join(" "));
      return Promise.resolve({ code: 0, output: "" });
    },
    which: (name) => `/usr/bin/${name}`,
  };
  return {
    ctx,
    out,
    err,
    ran,
    text: () => [...out, ...err].join("\n"),
    reset() {
      out.length = 0;
      err.length = 0;
      ran.length = 0;
    },
  };
}

async function enrolledIdentity(stateDir: string, gatewayUrl: string) {
  const { privateJwk, publicJwk } = await generateEd25519();
  await saveIdentity(stateDir, {
    privateJwk,
    publicJwk,
    enrollment: {
      nodeId: "node-123",
      gatewayUrl,
      gatewayJwks: { keys: [] },
      enrolledAt: new Date().toISOString(),
    },
  });
}

Deno.test("service install writes a launchd plist and a systemd unit with the node's settings, never a join token, and refuses a node not enrolled", async () => {
  const home = await Deno.makeTempDir({ prefix: "orchard-home-" });
  const stateDir = `${home}/.orchard/node`;
  const m = machine(home);
  try {
    // Not enrolled: refused, with what to run first.
    assert.equal(
      await runServiceCommand(["install", "--os", "darwin"], m.ctx),
      1,
    );
    assert.match(m.text(), /not enrolled yet/);
    assert.match(m.text(), /deno task node join --gateway URL --join TOKEN/);
    m.reset();
    assert.equal(
      await runServiceCommand(["install", "--join", "a.b"], m.ctx),
      2,
    );
    assert.match(m.text(), /never stores a join token/);

    await enrolledIdentity(stateDir, "https://gw.example");
    // What `deno task node join` saves: the settings, not the token.
    await saveFlags(stateDir, {
      gateway: "https://gw.example",
      join: "tok.secret-join",
      engine: "openai",
      upstream: "http://127.0.0.1:52415",
      "upstream-key": "sk-upstream-secret",
      port: "8200",
    });
    assert.equal(
      (await Deno.readTextFile(`${stateDir}/options.json`)).includes(
        "tok.secret-join",
      ),
      false,
    );
    assert.equal((await loadSavedFlags(stateDir)).port, "8200");

    // macOS: a LaunchAgent, generated here (launchctl printed, not run).
    m.reset();
    assert.equal(
      await runServiceCommand(
        ["install", "--os", "darwin", "--name", "Studio <1> & 2"],
        m.ctx,
      ),
      0,
      m.text(),
    );
    const plistPath = `${home}/Library/LaunchAgents/dev.orchard.node.plist`;
    const plistText = await Deno.readTextFile(plistPath);
    assert.equal((await Deno.stat(plistPath)).mode! & 0o777, 0o600); // holds the upstream key
    assert.equal(plistText.includes("tok.secret-join"), false);
    const lint = await runIfPresent(["plutil", "-lint", plistPath]);
    if (lint) assert.equal(lint.code, 0, lint.stdout + lint.stderr);
    const plist = parsePlist(plistText) as Record<string, PlistValue>;
    assert.equal(plist.Label, "dev.orchard.node");
    assert.equal(plist.RunAtLoad, true);
    assert.deepEqual(plist.KeepAlive, { SuccessfulExit: false });
    assert.equal(plist.WorkingDirectory, ROOT);
    const logs = `${home}/Library/Logs/Orchard/`;
    assert.ok(String(plist.StandardOutPath).startsWith(logs));
    assert.ok(String(plist.StandardErrorPath).startsWith(logs));
    assert.ok((await Deno.stat(logs)).isDirectory);
    const args = plist.ProgramArguments as string[];
    assert.deepEqual(args.slice(0, 4), [
      Deno.execPath(),
      "run",
      "-A",
      `${ROOT}/node/main.ts`,
    ]);
    const flag = (a: string[], f: string) => a[a.indexOf(f) + 1];
    assert.equal(flag(args, "--gateway"), "https://gw.example");
    assert.equal(flag(args, "--engine"), "openai");
    assert.equal(flag(args, "--upstream"), "http://127.0.0.1:52415");
    assert.equal(flag(args, "--port"), "8200");
    assert.equal(flag(args, "--name"), "Studio <1> & 2");
    assert.equal(flag(args, "--state-dir"), stateDir);
    assert.equal(args.includes("--join"), false);
    assert.equal(args.join(" ").includes("sk-upstream-secret"), false);
    const env = plist.EnvironmentVariables as Record<string, string>;
    assert.equal(env.ORCHARD_NODE_SERVICE, "launchd");
    assert.equal(env.ORCHARD_UPSTREAM_API_KEY, "sk-upstream-secret");
    assert.equal(env.PATH, "/usr/local/bin:/usr/bin:/bin");
    assert.deepEqual(m.ran, []); // another OS than this one: printed only
    assert.match(
      m.text(),
      new RegExp(`launchctl bootstrap gui/501 ${plistPath}`),
    );

    // Linux: a systemd user unit (systemctl "run": faked here).
    m.reset();
    const linux = Deno.build.os === "linux";
    assert.equal(
      await runServiceCommand(
        ["install", "--os", "linux", "--name", '50% $HOME "q"'],
        m.ctx,
      ),
      0,
      m.text(),
    );
    const unitPath = `${home}/.config/systemd/user/orchard-node.service`;
    const unitText = await Deno.readTextFile(unitPath);
    assert.equal(unitText.includes("tok.secret-join"), false);
    const unit = parseUnit(unitText);
    const svc = unit.Service!;
    assert.deepEqual(svc.Restart, ["always"]);
    assert.deepEqual(svc.RestartPreventExitStatus, ["2 3"]);
    assert.deepEqual(NO_RESTART_EXIT, [2, 3]);
    assert.deepEqual(svc.StandardOutput, ["journal"]);
    assert.deepEqual(unit.Install!.WantedBy, ["default.target"]);
    assert.deepEqual(unitWords(svc.WorkingDirectory![0]!), [ROOT]);
    const exec = unitWords(svc.ExecStart![0]!);
    assert.equal(exec[0], Deno.execPath());
    assert.equal(flag(exec, "--name"), '50% $HOME "q"');
    assert.equal(flag(exec, "--port"), "8200");
    assert.equal(exec.includes("--join"), false);
    const unitEnv = Object.fromEntries(
      svc.Environment!.map((e) => {
        const [w] = unitWords(e, false);
        return [w!.slice(0, w!.indexOf("=")), w!.slice(w!.indexOf("=") + 1)];
      }),
    );
    assert.equal(unitEnv.ORCHARD_NODE_SERVICE, "systemd");
    assert.equal(unitEnv.ORCHARD_UPSTREAM_API_KEY, "sk-upstream-secret");
    const verified = await verifyUnit(unitPath, home);
    if (verified) {
      assert.equal(verified.code, 0, verified.stderr);
      assert.doesNotMatch(verified.stderr, /orchard-node/, verified.stderr);
    }
    if (linux) {
      assert.deepEqual(m.ran, [
        "systemctl --user daemon-reload",
        "systemctl --user enable orchard-node.service",
        "systemctl --user restart orchard-node.service",
      ]);
    }

    // Enrolled elsewhere: refused.
    m.reset();
    assert.equal(
      await runServiceCommand(
        ["install", "--os", "linux", "--gateway", "https://other.example"],
        m.ctx,
      ),
      1,
    );
    assert.match(m.text(), /enrolled with https:\/\/gw\.example/);

    // status, uninstall, status
    m.reset();
    assert.equal(
      await runServiceCommand(["status", "--os", "linux"], m.ctx),
      0,
    );
    assert.match(m.text(), new RegExp(`Installed: ${unitPath}`));
    assert.match(m.text(), /node-123, enrolled with https:\/\/gw\.example/);
    m.reset();
    assert.equal(
      await runServiceCommand(["uninstall", "--os", "linux"], m.ctx),
      0,
    );
    await assert.rejects(() => Deno.stat(unitPath), Deno.errors.NotFound);
    if (linux) {
      assert.deepEqual(m.ran, [
        "systemctl --user disable --now orchard-node.service",
        "systemctl --user daemon-reload",
      ]);
    }
    assert.equal(
      await runServiceCommand(["status", "--os", "linux"], m.ctx),
      1,
    );
    assert.equal(
      await runServiceCommand(["uninstall", "--os", "darwin"], m.ctx),
      0,
    );
    await assert.rejects(() => Deno.stat(plistPath), Deno.errors.NotFound);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

/** Deno's cache directory (a fresh HOME would download every package again). */
async function denoDir(): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json"],
    stdout: "piped",
    stderr: "null",
  }).output();
  return JSON.parse(new TextDecoder().decode(out.stdout)).denoDir;
}

Deno.test("the join command, pasted as printed in a clean HOME, enrolls the node and installs a service that runs it without a token, and that stays stopped once the gateway removes the node", async () => {
  const gw = await startGateway({ ownPublicUrl: true });
  const up = startFakeUpstream();
  const home = await Deno.makeTempDir({ prefix: "orchard-fresh-home-" });
  let service: Deno.ChildProcess | null = null;
  try {
    const res = await gw.admin("POST", "/join-tokens", {});
    assert.equal(res.status, 201);
    const { command, token } = await res.json();
    assert.equal(
      command,
      `deno task node join --gateway ${gw.url} --join ${token} && deno task node service install`,
    );

    // The machine: deno on PATH, and systemctl/launchctl that only log.
    const bin = `${home}/bin`;
    await Deno.mkdir(bin);
    await Deno.symlink(Deno.execPath(), `${bin}/deno`);
    for (const tool of ["systemctl", "launchctl"]) {
      await Deno.writeTextFile(
        `${bin}/${tool}`,
        `#!/bin/sh\necho "${tool} $*" >> "$HOME/manager.log"\n`,
        { mode: 0o755 },
      );
    }
    const env = {
      HOME: home,
      PATH: `${bin}:/usr/bin:/bin`,
      DENO_DIR: await denoDir(),
      ORCHARD_SERVICE_OS: "linux",
      // How this node serves: set in the environment before pasting.
      ORCHARD_NODE_ENGINE: "openai",
      ORCHARD_UPSTREAM_URL: up.url,
      ORCHARD_NODE_HOST: "127.0.0.1",
      ORCHARD_LOG_LEVEL: "error",
    };
    const pasted = await new Deno.Command("/bin/sh", {
      args: ["-c", command],
      cwd: ROOT,
      env,
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const said = new TextDecoder().decode(pasted.stdout) +
      new TextDecoder().decode(pasted.stderr);
    assert.equal(pasted.code, 0, said);
    const nodeId = /Orchard node (\S+) joined/.exec(said)?.[1];
    assert.ok(nodeId, said);
    assert.match(said, /the gateway reaches it at http:\/\/127\.0\.0\.1:\d+/);
    assert.deepEqual(
      (await Deno.readTextFile(`${home}/manager.log`)).trim().split("\n"),
      [
        "systemctl --user daemon-reload",
        "systemctl --user enable orchard-node.service",
        "systemctl --user restart orchard-node.service",
      ],
    );

    // The unit, checked, then run as systemd runs it: no token anywhere.
    const unitPath = `${home}/.config/systemd/user/orchard-node.service`;
    const unitText = await Deno.readTextFile(unitPath);
    assert.equal(unitText.includes(token), false);
    const verified = await verifyUnit(unitPath, home);
    if (verified) assert.equal(verified.code, 0, verified.stderr);
    const svc = parseUnit(unitText).Service!;
    const exec = unitWords(svc.ExecStart![0]!);
    const unitEnv = Object.fromEntries(
      svc.Environment!.map((e) => {
        const w = unitWords(e, false)[0]!;
        return [w.slice(0, w.indexOf("=")), w.slice(w.indexOf("=") + 1)];
      }),
    );
    assert.equal(unitEnv.ORCHARD_JOIN_TOKEN, undefined);
    service = new Deno.Command(exec[0]!, {
      args: exec.slice(1),
      cwd: unitWords(svc.WorkingDirectory![0]!)[0],
      env: { ...unitEnv, HOME: home },
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const reader = service.stdout.pipeThrough(new TextDecoderStream())
      .getReader();
    let first = "";
    while (!first.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) break;
      first += value;
    }
    reader.releaseLock();
    assert.match(first, new RegExp(`^Orchard node ${nodeId} serving at`));
    const node = await until("healthy and reachable", async () => {
      const r = await gw.admin("GET", `/nodes/${nodeId}`);
      const n = await r.json();
      return n.state === "healthy" && n.reachable === true ? n : null;
    }, 30_000);
    assert.equal(node.engine, "openai");

    // Removed by the gateway: it stops with an exit status the unit does not restart.
    const del = await gw.admin("DELETE", `/nodes/${nodeId}`);
    assert.equal(del.status, 200);
    await del.body?.cancel();
    const status = await service.status;
    const err = await new Response(service.stderr).text();
    await service.stdout.cancel().catch(() => {});
    service = null;
    assert.equal(status.code, 3, err);
    assert.ok(
      svc.RestartPreventExitStatus![0]!.split(" ").includes("3"),
      "systemd does not restart it",
    );
    assert.match(err, /removed from the gateway/);
    assert.match(
      err,
      /deno task node join --gateway \S+ --join TOKEN && deno task node service install/,
    );
  } finally {
    if (service) {
      service.kill("SIGKILL");
      await service.status;
      await service.stdout.cancel().catch(() => {});
      await service.stderr.cancel().catch(() => {});
    }
    await gw.close();
    await up.close();
    await Deno.remove(home, { recursive: true });
  }
});
