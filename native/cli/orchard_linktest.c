/* orchard-linktest: the probe and link test as a child process, so the node can kill a hung
 * verbs call. Built from the same sources as liborchard.
 *
 *   orchard-linktest probe [--timeout-ms N] [--skip-rdma] [--skip-gpu]
 *   orchard-linktest listen --port P [--host H] [options]
 *   orchard-linktest connect --host H --port P [options]
 *
 * The token comes from env ORCHARD_LINKTEST_TOKEN (preferred: argv is visible to other users)
 * or --token. Options: --timeout-ms --iterations --warmup --msg-bytes --bw-bytes
 * --bw-msg-bytes --transport auto|tcp|rdma --device NAME --gid-index N.
 * listen prints {"event":"listening","port":N} first; each command ends with one JSON line.
 * Exit status: 0 ok, 1 test failed, 2 usage error. SIGTERM/SIGINT cancel cleanly. */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/orchard.h"

static orch_linktest *g_lt;

static void on_signal(int sig) {
  (void)sig;
  if (g_lt) orch_linktest_cancel(g_lt);
}

static int usage(const char *why) {
  fprintf(stderr, "orchard-linktest: %s\nusage: orchard-linktest probe|listen|connect [options] (see native/README.md)\n", why);
  return 2;
}

static int print_result(orch_linktest *lt, int32_t rc) {
  size_t need = 0;
  orch_linktest_result_json(lt, NULL, 0, &need);
  char *buf = need ? malloc(need) : NULL;
  if (buf && orch_linktest_result_json(lt, buf, need, &need) == ORCH_OK) {
    printf("%s\n", buf);
  } else {
    printf("{\"schema\":\"orchard.linktest/1\",\"status\":\"failed\",\"error\":\"%s\"}\n", orch_status_str(rc));
  }
  free(buf);
  fflush(stdout);
  return rc == ORCH_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage("missing command");
  const char *cmd = argv[1];
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART: blocked calls return EINTR */
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (strcmp(cmd, "probe") == 0) {
    uint32_t timeout = 5000, flags = ORCH_PROBE_DEFAULT;
    for (int i = 2; i < argc; i++) {
      if (strcmp(argv[i], "--timeout-ms") == 0 && i + 1 < argc) timeout = (uint32_t)strtoul(argv[++i], NULL, 10);
      else if (strcmp(argv[i], "--skip-rdma") == 0) flags |= ORCH_PROBE_SKIP_RDMA;
      else if (strcmp(argv[i], "--skip-gpu") == 0) flags |= ORCH_PROBE_SKIP_GPU;
      else return usage("unknown probe option");
    }
    char *json = orch_probe_json(flags, timeout);
    if (!json) return 1;
    printf("%s\n", json);
    orch_free(json);
    return 0;
  }
  bool listen = strcmp(cmd, "listen") == 0;
  if (!listen && strcmp(cmd, "connect") != 0) return usage("unknown command");
  if (orch_linktest_create(&g_lt) != ORCH_OK) return 1;
  const char *host = NULL;
  long port = listen ? 0 : -1;
  const char *env_token = getenv("ORCHARD_LINKTEST_TOKEN");
  if (env_token && env_token[0] && orch_linktest_set_option(g_lt, "token", env_token) != ORCH_OK) {
    return usage("invalid token");
  }
  static const struct {
    const char *flag, *key;
  } opts[] = {{"--token", "token"},         {"--timeout-ms", "timeout_ms"}, {"--iterations", "iterations"},
              {"--warmup", "warmup"},       {"--msg-bytes", "msg_bytes"},   {"--bw-bytes", "bw_bytes"},
              {"--bw-msg-bytes", "bw_msg_bytes"}, {"--transport", "transport"}, {"--device", "device"},
              {"--gid-index", "gid_index"}};
  for (int i = 2; i < argc; i++) {
    if (i + 1 >= argc) return usage("option without a value");
    const char *flag = argv[i], *val = argv[++i];
    if (strcmp(flag, "--host") == 0) {
      host = val;
      continue;
    }
    if (strcmp(flag, "--port") == 0) {
      char *end;
      port = strtol(val, &end, 10);
      if (*end || port < 0 || port > 65535) return usage("bad --port");
      continue;
    }
    size_t k = 0;
    while (k < sizeof opts / sizeof opts[0] && strcmp(opts[k].flag, flag) != 0) k++;
    if (k == sizeof opts / sizeof opts[0]) return usage("unknown option");
    if (orch_linktest_set_option(g_lt, opts[k].key, val) != ORCH_OK) return usage("invalid option value");
  }
  int32_t rc;
  if (listen) {
    rc = orch_linktest_listen(g_lt, host, (uint16_t)port);
    if (rc != ORCH_OK) {
      fprintf(stderr, "orchard-linktest: cannot listen: %s\n", orch_status_str(rc));
      orch_linktest_destroy(g_lt);
      return 1;
    }
    printf("{\"event\":\"listening\",\"port\":%u}\n", orch_linktest_port(g_lt));
    fflush(stdout);
    rc = orch_linktest_accept_run(g_lt);
  } else {
    if (!host || port <= 0) return usage("connect needs --host and --port");
    rc = orch_linktest_connect_run(g_lt, host, (uint16_t)port);
  }
  if (rc == ORCH_ERR_STATE) {
    orch_linktest_destroy(g_lt);
    return usage("a token is required (env ORCHARD_LINKTEST_TOKEN or --token)");
  }
  int code = print_result(g_lt, rc);
  orch_linktest *lt = g_lt;
  g_lt = NULL;
  orch_linktest_destroy(lt);
  return code;
}
