/* Verbs support: libibverbs (Linux) or librdma (macOS 26.2+) opened with dlopen at run time,
 * the probe's device/port enumeration (time-boxed in a worker thread) and the RDMA endpoint
 * used by the link test. Built against <infiniband/verbs.h> for the types only: no link-time
 * dependency, so liborchard loads everywhere and reports RDMA as unavailable. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "internal.h"
#include "rdma.h"

#if defined(__has_include)
#if __has_include(<infiniband/verbs.h>) && !defined(ORCH_NO_VERBS)
#include <infiniband/verbs.h>
#define ORCH_HAVE_VERBS 1
#endif
#endif

/* ---- GID helpers and usable rules (no verbs types needed) ---- */

const char *rdma_wc_status_str(int status) {
  /* enum ibv_wc_status values, stable across rdma-core and Apple's SDK */
  static const char *const names[] = {
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "work request flushed", "memory window bind error", "bad response",
      "local access error", "remote invalid request", "remote access error", "remote operation error",
      "transport retry counter exceeded (peer gone?)", "receiver-not-ready retry counter exceeded",
      "local RDD violation", "remote invalid RD request", "remote aborted", "invalid EE context number",
      "invalid EE context state", "fatal error", "response timeout", "general error"};
  return status >= 0 && status < (int)(sizeof names / sizeof names[0]) ? names[status] : "unknown status";
}

const char *gid_kind(const uint8_t g[16], char *ipv4, size_t cap) {
  static const uint8_t zero[16] = {0};
  if (cap) ipv4[0] = '\0';
  if (memcmp(g, zero, 16) == 0) return "zero";
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(g, mapped, 12) == 0) {
    if (cap) snprintf(ipv4, cap, "%u.%u.%u.%u", g[12], g[13], g[14], g[15]);
    return "ipv4-mapped";
  }
  if (g[0] == 0xfe && (g[1] & 0xc0) == 0x80) return "link-local";
  return "other";
}

void gid_format(const uint8_t g[16], char *out, size_t cap) {
  char tmp[INET6_ADDRSTRLEN];
  if (!inet_ntop(AF_INET6, g, tmp, sizeof tmp)) tmp[0] = '\0';
  orch_copy(out, cap, tmp);
}

bool port_usable(const port_facts *f, int *gid_index, char *reason, size_t cap) {
  *gid_index = -1;
  if (f->rdma_ctl && strcmp(f->rdma_ctl, "disabled") == 0) {
    snprintf(reason, cap, "RDMA is disabled: run `rdma_ctl enable` from macOS Recovery, then reboot");
    return false;
  }
  if (f->state != 4 /* IBV_PORT_ACTIVE */) {
    snprintf(reason, cap, "port is not active (state %d): check the cable and that the peer is up", f->state);
    return false;
  }
  const char *ifname = f->device && strncmp(f->device, "rdma_", 5) == 0 ? f->device + 5 : NULL;
  if (f->apple || f->link_layer == 2 /* IBV_LINK_LAYER_ETHERNET */) {
    if (f->ipv4_gid_index < 0) {
      if (ifname) {
        snprintf(reason, cap, "no IPv4-mapped GID: give %s its own IPv4 address or remove it from the Thunderbolt bridge",
                 ifname);
      } else {
        snprintf(reason, cap, "no IPv4-mapped GID: give the port's network interface an IPv4 address (RoCEv2)");
      }
      return false;
    }
    *gid_index = f->ipv4_gid_index;
    reason[0] = '\0';
    return true;
  }
  if (f->lid == 0) {
    snprintf(reason, cap, "InfiniBand port has no LID: is a subnet manager running?");
    return false;
  }
  *gid_index = f->any_gid_index >= 0 ? f->any_gid_index : 0;
  reason[0] = '\0';
  return true;
}

#ifndef ORCH_HAVE_VERBS

bool verbs_probe(jbuf *b, const char *rdma_ctl, uint32_t timeout_ms, probe_err *e) {
  (void)e;
  (void)timeout_ms;
  jb_key(b, "library");
  jb_obj_open(b);
  jb_key(b, "status"); jb_str(b, "missing");
  jb_key(b, "path"); jb_null(b);
  jb_key(b, "source"); jb_null(b);
  jb_key(b, "reason"); jb_str(b, "liborchard was built without <infiniband/verbs.h>");
  jb_obj_close(b);
  jb_key(b, "rdma_ctl"); jb_str(b, rdma_ctl);
  jb_key(b, "available"); jb_bool(b, false);
  jb_key(b, "usable"); jb_bool(b, false);
  jb_key(b, "reason"); jb_str(b, "built without verbs support");
  jb_key(b, "devices"); jb_arr_open(b); jb_arr_close(b);
  return true;
}

bool rdma_find_port(const char *device, char *dev_out, size_t dev_cap, char *reason, size_t cap) {
  (void)device;
  orch_copy(dev_out, dev_cap, "");
  snprintf(reason, cap, "liborchard was built without verbs support");
  return false;
}

int32_t rdma_ep_open(const char *device, int gid_index, uint32_t slot_bytes, uint32_t depth, rdma_ep **out,
                     char *err, size_t cap) {
  (void)device, (void)gid_index, (void)slot_bytes, (void)depth;
  *out = NULL;
  snprintf(err, cap, "liborchard was built without verbs support");
  return ORCH_ERR_UNAVAILABLE;
}
void rdma_ep_local(const rdma_ep *ep, rdma_info *out) { (void)ep, memset(out, 0, sizeof *out); }
int32_t rdma_ep_connect(rdma_ep *ep, const rdma_info *r, char *err, size_t cap) {
  (void)ep, (void)r, snprintf(err, cap, "unavailable");
  return ORCH_ERR_UNAVAILABLE;
}
int32_t rdma_ep_post_recv(rdma_ep *ep, uint32_t slot, uint32_t len) {
  (void)ep, (void)slot, (void)len;
  return ORCH_ERR_UNAVAILABLE;
}
int32_t rdma_ep_post_send(rdma_ep *ep, uint32_t slot, uint32_t len) {
  (void)ep, (void)slot, (void)len;
  return ORCH_ERR_UNAVAILABLE;
}
int rdma_ep_poll(rdma_ep *ep, rdma_completion *o, int max) { (void)ep, (void)o, (void)max; return ORCH_ERR_UNAVAILABLE; }
uint8_t *rdma_ep_buf(rdma_ep *ep, bool send, uint32_t slot) { (void)ep, (void)send, (void)slot; return NULL; }
uint32_t rdma_ep_depth(const rdma_ep *ep) { (void)ep; return 0; }
const char *rdma_ep_device(const rdma_ep *ep) { (void)ep; return ""; }
int rdma_ep_gid_index(const rdma_ep *ep) { (void)ep; return -1; }
void rdma_ep_close(rdma_ep *ep) { (void)ep; }

#else /* ORCH_HAVE_VERBS */

/* ---- run-time loader ---- */

typedef struct verbs_fns {
  struct ibv_device **(*get_device_list)(int *);
  void (*free_device_list)(struct ibv_device **);
  const char *(*get_device_name)(struct ibv_device *);
  struct ibv_context *(*open_device)(struct ibv_device *);
  int (*close_device)(struct ibv_context *);
  int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
  int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
  int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
  /* link test only (optional for the probe) */
  struct ibv_pd *(*alloc_pd)(struct ibv_context *);
  int (*dealloc_pd)(struct ibv_pd *);
  struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
  int (*destroy_cq)(struct ibv_cq *);
  struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
  int (*destroy_qp)(struct ibv_qp *);
  int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
  int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
  int (*dereg_mr)(struct ibv_mr *);
} verbs_fns;

typedef struct verbs_lib {
  bool loaded;
  bool link_capable; /* every symbol the link test needs is present */
  bool apple;
  char path[512];
  char source[64];
  char reason[640];
  verbs_fns f;
} verbs_lib;

static pthread_mutex_t g_lib_lock = PTHREAD_MUTEX_INITIALIZER;
static verbs_lib *g_lib; /* never freed: threads abandoned on timeout may still use it */

/* Loads (once per path) the verbs library; ORCHARD_VERBS_LIB selects a test double. */
static const verbs_lib *verbs_load(void) {
  const char *env = getenv("ORCHARD_VERBS_LIB");
#if defined(__APPLE__)
  const char *defaults[] = {"/usr/lib/librdma.dylib", "librdma.dylib", NULL};
#else
  const char *defaults[] = {"libibverbs.so.1", NULL};
#endif
  pthread_mutex_lock(&g_lib_lock);
  const char *want = env && env[0] ? env : defaults[0];
  if (g_lib && strcmp(g_lib->source, env && env[0] ? "env ORCHARD_VERBS_LIB" : "default") == 0 &&
      (!(env && env[0]) || strcmp(g_lib->path, want) == 0)) {
    verbs_lib *l = g_lib;
    pthread_mutex_unlock(&g_lib_lock);
    return l;
  }
  verbs_lib *l = calloc(1, sizeof *l);
  if (!l) {
    pthread_mutex_unlock(&g_lib_lock);
    return NULL;
  }
  void *h = NULL;
  if (env && env[0]) {
    orch_copy(l->source, sizeof l->source, "env ORCHARD_VERBS_LIB");
    orch_copy(l->path, sizeof l->path, env);
    h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
  } else {
    orch_copy(l->source, sizeof l->source, "default");
    for (size_t i = 0; defaults[i] && !h; i++) {
      orch_copy(l->path, sizeof l->path, defaults[i]);
      h = dlopen(defaults[i], RTLD_NOW | RTLD_LOCAL);
    }
  }
  if (!h) {
    const char *why = dlerror();
    snprintf(l->reason, sizeof l->reason, "%s", why ? why : "dlopen failed");
  } else {
#define SYM(field, name) (*(void **)(&l->f.field) = dlsym(h, name))
    bool ok = SYM(get_device_list, "ibv_get_device_list") && SYM(free_device_list, "ibv_free_device_list") &&
              SYM(get_device_name, "ibv_get_device_name") && SYM(open_device, "ibv_open_device") &&
              SYM(close_device, "ibv_close_device") && SYM(query_device, "ibv_query_device") &&
              SYM(query_port, "ibv_query_port") && SYM(query_gid, "ibv_query_gid");
    bool link = SYM(alloc_pd, "ibv_alloc_pd") && SYM(dealloc_pd, "ibv_dealloc_pd") &&
                SYM(create_cq, "ibv_create_cq") && SYM(destroy_cq, "ibv_destroy_cq") &&
                SYM(create_qp, "ibv_create_qp") && SYM(destroy_qp, "ibv_destroy_qp") &&
                SYM(modify_qp, "ibv_modify_qp") && SYM(query_qp, "ibv_query_qp") && SYM(reg_mr, "ibv_reg_mr") &&
                SYM(dereg_mr, "ibv_dereg_mr");
#undef SYM
    l->loaded = ok;
    l->link_capable = ok && link;
    l->apple = strstr(l->path, "librdma") != NULL;
    if (!ok) snprintf(l->reason, sizeof l->reason, "%s lacks a required ibv_* symbol", l->path);
  }
  g_lib = l; /* the previous one (if any) is intentionally leaked: see g_lib */
  pthread_mutex_unlock(&g_lib_lock);
  return l;
}

static const char *port_state_name(int s) {
  switch (s) {
    case 1: return "DOWN";
    case 2: return "INIT";
    case 3: return "ARMED";
    case 4: return "ACTIVE";
    case 5: return "ACTIVE_DEFER";
    default: return "NOP";
  }
}

static const char *link_layer_name(int l) {
  return l == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand" : l == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "unspecified";
}

static const char *transport_name(int t) {
  switch (t) {
    case 0: return "InfiniBand";
    case 1: return "iWARP";
    case 2: return "usNIC";
    case 3: return "usNIC UDP";
    case 100: return "Apple Thunderbolt";
    default: return "unknown";
  }
}

static int mtu_bytes(int m) { return m >= 1 && m <= 5 ? 128 << m : 0; }

/* Per-lane Gb/s for ibv_port_attr.active_speed, 0 when unknown. */
static double speed_lane_gbps(int s) {
  switch (s) {
    case 1: return 2.5;
    case 2: return 5.0;
    case 4: case 8: return 10.0;
    case 16: return 14.0625;
    case 32: return 25.78125;
    case 64: return 50.0;
    case 128: return 100.0;
    case 256: return 200.0;
    default: return 0;
  }
}

static int width_lanes(int w) {
  switch (w) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 0;
  }
}

#define MAX_GIDS 16

static void write_port(jbuf *b, const verbs_lib *l, struct ibv_context *ctx, const char *dev, bool apple, uint8_t pn,
                       const char *rdma_ctl, bool *any_usable) {
  struct ibv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  jb_obj_open(b);
  jb_key(b, "port"); jb_uint(b, pn);
  if (l->f.query_port(ctx, pn, &pa) != 0) {
    jb_key(b, "error"); jb_strf(b, "ibv_query_port failed (errno %d)", errno);
    jb_key(b, "usable"); jb_bool(b, false);
    jb_key(b, "reason"); jb_str(b, "ibv_query_port failed");
    jb_obj_close(b);
    return;
  }
  double lane = speed_lane_gbps(pa.active_speed);
  int lanes = width_lanes(pa.active_width);
  jb_key(b, "state"); jb_str(b, port_state_name(pa.state));
  jb_key(b, "state_code"); jb_int(b, pa.state);
  jb_key(b, "phys_state"); jb_int(b, pa.phys_state);
  jb_key(b, "link_layer"); jb_str(b, link_layer_name(pa.link_layer));
  jb_key(b, "active_mtu"); jb_int(b, mtu_bytes(pa.active_mtu));
  jb_key(b, "max_mtu"); jb_int(b, mtu_bytes(pa.max_mtu));
  jb_key(b, "active_speed"); jb_int(b, pa.active_speed);
  jb_key(b, "active_width"); jb_int(b, pa.active_width);
  jb_key(b, "speed_gbps"); if (lane > 0 && lanes > 0) jb_num(b, lane * lanes); else jb_null(b);
  jb_key(b, "lid"); jb_uint(b, pa.lid);
  jb_key(b, "gid_tbl_len"); jb_int(b, pa.gid_tbl_len);
  port_facts f = {.device = dev, .apple = apple, .state = pa.state, .link_layer = pa.link_layer, .lid = pa.lid,
                  .ipv4_gid_index = -1, .any_gid_index = -1, .rdma_ctl = rdma_ctl};
  jb_key(b, "gids");
  jb_arr_open(b);
  int n = pa.gid_tbl_len < MAX_GIDS ? pa.gid_tbl_len : MAX_GIDS;
  for (int i = 0; i < n; i++) {
    union ibv_gid g;
    memset(&g, 0, sizeof g);
    if (l->f.query_gid(ctx, pn, i, &g) != 0) continue;
    char ip4[16], text[64];
    const char *kind = gid_kind(g.raw, ip4, sizeof ip4);
    if (strcmp(kind, "zero") == 0) continue;
    if (f.any_gid_index < 0) f.any_gid_index = i;
    if (f.ipv4_gid_index < 0 && strcmp(kind, "ipv4-mapped") == 0) f.ipv4_gid_index = i;
    gid_format(g.raw, text, sizeof text);
    jb_obj_open(b);
    jb_key(b, "index"); jb_int(b, i);
    jb_key(b, "gid"); jb_str(b, text);
    jb_key(b, "kind"); jb_str(b, kind);
    jb_key(b, "ipv4"); jb_str(b, ip4[0] ? ip4 : NULL);
    jb_obj_close(b);
  }
  jb_arr_close(b);
  char reason[256];
  int gid_index;
  bool usable = port_usable(&f, &gid_index, reason, sizeof reason);
  *any_usable = *any_usable || usable;
  jb_key(b, "usable"); jb_bool(b, usable);
  jb_key(b, "reason"); jb_str(b, usable ? NULL : reason);
  jb_key(b, "gid_index"); if (gid_index >= 0) jb_int(b, gid_index); else jb_null(b);
  jb_obj_close(b);
}

static void write_device(jbuf *b, const verbs_lib *l, struct ibv_device *d, const char *rdma_ctl, bool *any_usable) {
  const char *name = l->f.get_device_name(d);
  name = name ? name : "?";
  const char *ifname = strncmp(name, "rdma_", 5) == 0 ? name + 5 : NULL;
  bool apple = l->apple || (int)d->transport_type == 100;
  jb_obj_open(b);
  jb_key(b, "name"); jb_str(b, name);
  jb_key(b, "interface"); jb_str(b, ifname);
  char ip4[64];
  jb_key(b, "interface_ipv4"); jb_str(b, ifname && net_iface_ipv4(ifname, ip4, sizeof ip4) ? ip4 : NULL);
  jb_key(b, "transport"); jb_int(b, (int)d->transport_type);
  jb_key(b, "transport_name"); jb_str(b, transport_name((int)d->transport_type));
  jb_key(b, "qp_type"); jb_str(b, apple ? "UC" : "RC");
  struct ibv_context *ctx = l->f.open_device(d);
  if (!ctx) {
    jb_key(b, "error"); jb_strf(b, "ibv_open_device failed (errno %d)", errno);
    jb_key(b, "ports"); jb_arr_open(b); jb_arr_close(b);
    jb_obj_close(b);
    return;
  }
  struct ibv_device_attr da;
  memset(&da, 0, sizeof da);
  if (l->f.query_device(ctx, &da) != 0) {
    jb_key(b, "error"); jb_strf(b, "ibv_query_device failed (errno %d)", errno);
    jb_key(b, "ports"); jb_arr_open(b); jb_arr_close(b);
    l->f.close_device(ctx);
    jb_obj_close(b);
    return;
  }
  jb_key(b, "fw_ver"); jb_str(b, da.fw_ver);
  jb_key(b, "vendor_id"); jb_uint(b, da.vendor_id);
  jb_key(b, "vendor_part_id"); jb_uint(b, da.vendor_part_id);
  jb_key(b, "hw_ver"); jb_uint(b, da.hw_ver);
  jb_key(b, "limits");
  jb_obj_open(b);
  jb_key(b, "max_qp"); jb_int(b, da.max_qp);
  jb_key(b, "max_qp_wr"); jb_int(b, da.max_qp_wr);
  jb_key(b, "max_cq"); jb_int(b, da.max_cq);
  jb_key(b, "max_cqe"); jb_int(b, da.max_cqe);
  jb_key(b, "max_mr"); jb_int(b, da.max_mr);
  jb_key(b, "max_mr_size"); jb_uint(b, da.max_mr_size);
  jb_key(b, "max_sge"); jb_int(b, da.max_sge);
  jb_key(b, "max_pd"); jb_int(b, da.max_pd);
  jb_obj_close(b);
  jb_key(b, "phys_port_cnt"); jb_uint(b, da.phys_port_cnt);
  jb_key(b, "ports");
  jb_arr_open(b);
  for (uint8_t p = 1; p <= da.phys_port_cnt && p <= 8; p++) write_port(b, l, ctx, name, apple, p, rdma_ctl, any_usable);
  jb_arr_close(b);
  l->f.close_device(ctx);
  jb_obj_close(b);
}

/* Shared between the caller and the worker; the last one out frees it. */
typedef struct probe_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  bool done;
  char rdma_ctl[16];
  bool has_ctl;
  char *json; /* fields of the rdma object, without braces */
} probe_job;

static void job_release(probe_job *j) {
  pthread_mutex_lock(&j->mu);
  bool last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j->json);
  free(j);
}

static void *probe_worker(void *arg) {
  probe_job *j = arg;
  const char *ctl = j->has_ctl ? j->rdma_ctl : NULL;
  jbuf b;
  jb_init(&b);
  const verbs_lib *l = verbs_load();
  jb_key(&b, "library");
  jb_obj_open(&b);
  jb_key(&b, "status"); jb_str(&b, !l ? "missing" : l->loaded ? "loaded" : "missing");
  jb_key(&b, "path"); jb_str(&b, l ? l->path : NULL);
  jb_key(&b, "source"); jb_str(&b, l ? l->source : NULL);
  jb_key(&b, "reason"); jb_str(&b, l && !l->loaded ? l->reason : NULL);
  jb_key(&b, "link_test_capable"); jb_bool(&b, l && l->link_capable);
  jb_obj_close(&b);
  jb_key(&b, "rdma_ctl"); jb_str(&b, ctl);
  int n = 0;
  struct ibv_device **list = NULL;
  int list_errno = 0;
  if (l && l->loaded) {
    list = l->f.get_device_list(&n);
    list_errno = list ? 0 : errno;
  }
  bool any_usable = false;
  jbuf devs;
  jb_init(&devs);
  jb_arr_open(&devs);
  for (int i = 0; list && i < n; i++) write_device(&devs, l, list[i], ctl, &any_usable);
  jb_arr_close(&devs);
  if (list) l->f.free_device_list(list);
  bool available = l && l->loaded && n > 0;
  jb_key(&b, "available"); jb_bool(&b, available);
  jb_key(&b, "usable"); jb_bool(&b, any_usable);
  jb_key(&b, "reason");
  if (!l || !l->loaded) jb_strf(&b, "RDMA library unavailable: %s", l ? l->reason : "out of memory");
  else if (!list) jb_strf(&b, "no RDMA devices (ibv_get_device_list: %s)", strerror(list_errno));
  else if (n == 0) jb_str(&b, "no RDMA devices");
  else if (!any_usable) jb_str(&b, "no usable RDMA port: see each port's reason");
  else jb_null(&b);
  jb_key(&b, "devices");
  char *d = jb_take(&devs);
  jb_json(&b, d ? d : "[]");
  free(d);
  char *out = jb_take(&b);
  pthread_mutex_lock(&j->mu);
  j->json = out;
  j->done = true;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  job_release(j);
  return NULL;
}

bool verbs_probe(jbuf *b, const char *rdma_ctl, uint32_t timeout_ms, probe_err *e) {
  probe_job *j = calloc(1, sizeof *j);
  if (!j) {
    snprintf(e->message, sizeof e->message, "out of memory");
    return false;
  }
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->refs = 2;
  if (rdma_ctl) {
    j->has_ctl = true;
    orch_copy(j->rdma_ctl, sizeof j->rdma_ctl, rdma_ctl);
  }
  pthread_t t;
  if (pthread_create(&t, NULL, probe_worker, j) != 0) {
    j->refs = 1;
    job_release(j);
    snprintf(e->message, sizeof e->message, "cannot start the verbs probe thread");
    return false;
  }
  pthread_detach(t);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)(timeout_ms % 1000) * 1000000ull;
  ts.tv_sec += (time_t)(timeout_ms / 1000 + ns / 1000000000ull);
  ts.tv_nsec = (long)(ns % 1000000000ull);
  pthread_mutex_lock(&j->mu);
  while (!j->done) {
    if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) break;
  }
  bool done = j->done;
  char *json = j->json;
  j->json = NULL;
  pthread_mutex_unlock(&j->mu);
  job_release(j);
  if (!done) {
    orch_copy(e->code, sizeof e->code, "timeout");
    snprintf(e->message, sizeof e->message,
             "verbs enumeration did not finish in %u ms (a hung verbs call; the provider may be wedged)", timeout_ms);
    return false;
  }
  if (!json) {
    snprintf(e->message, sizeof e->message, "out of memory");
    return false;
  }
  jb_raw(b, json, strlen(json));
  b->need_sep = true;
  free(json);
  return true;
}

/* ---- RDMA endpoint for the link test ---- */

struct rdma_ep {
  const verbs_lib *l;
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  /* depth send slots then depth recv slots; mmap'ed, not malloc'ed: over
   * Thunderbolt, macOS's ibv_reg_mr is reported to accept only mmap'ed
   * memory (posix_memalign buffers fail to register) */
  uint8_t *mem;
  size_t mem_bytes;
  uint32_t slot_bytes;
  uint32_t depth;
  uint8_t port;
  int gid_index;
  uint16_t lid;
  uint8_t gid[16];
  uint8_t mtu;
  bool uc;
  uint32_t psn;
  char device[64];
};

/* Finds the named (or first) device with a usable port: out port number and gid index. */
static bool find_usable(const verbs_lib *l, const char *want, char *dev_out, size_t dev_cap, uint8_t *port_out,
                        int *gid_out, char *reason, size_t cap) {
  int n = 0;
  struct ibv_device **list = l->f.get_device_list(&n);
  if (!list || n == 0) {
    if (list) l->f.free_device_list(list);
    snprintf(reason, cap, "no RDMA devices");
    return false;
  }
  bool found = false;
  snprintf(reason, cap, want ? "device %s not found" : "no usable RDMA port", want ? want : "");
  for (int i = 0; i < n && !found; i++) {
    const char *name = l->f.get_device_name(list[i]);
    if (!name || (want && strcmp(want, name) != 0)) continue;
    struct ibv_context *ctx = l->f.open_device(list[i]);
    if (!ctx) continue;
    struct ibv_device_attr da;
    if (l->f.query_device(ctx, &da) == 0) {
      for (uint8_t p = 1; p <= da.phys_port_cnt && !found; p++) {
        struct ibv_port_attr pa;
        memset(&pa, 0, sizeof pa);
        if (l->f.query_port(ctx, p, &pa) != 0) continue;
        port_facts f = {.device = name, .apple = l->apple || (int)list[i]->transport_type == 100,
                        .state = pa.state, .link_layer = pa.link_layer, .lid = pa.lid, .ipv4_gid_index = -1,
                        .any_gid_index = -1, .rdma_ctl = NULL};
        int ng = pa.gid_tbl_len < MAX_GIDS ? pa.gid_tbl_len : MAX_GIDS;
        for (int g = 0; g < ng; g++) {
          union ibv_gid gid;
          if (l->f.query_gid(ctx, p, g, &gid) != 0) continue;
          char ip4[16];
          const char *kind = gid_kind(gid.raw, ip4, sizeof ip4);
          if (strcmp(kind, "zero") != 0 && f.any_gid_index < 0) f.any_gid_index = g;
          if (strcmp(kind, "ipv4-mapped") == 0 && f.ipv4_gid_index < 0) f.ipv4_gid_index = g;
        }
        int gi;
        char why[256];
        if (port_usable(&f, &gi, why, sizeof why)) {
          found = true;
          orch_copy(dev_out, dev_cap, name);
          *port_out = p;
          *gid_out = gi;
        } else {
          snprintf(reason, cap, "%s port %u: %s", name, p, why);
        }
      }
    }
    l->f.close_device(ctx);
  }
  l->f.free_device_list(list);
  return found;
}

bool rdma_find_port(const char *device, char *dev_out, size_t dev_cap, char *reason, size_t cap) {
  const verbs_lib *l = verbs_load();
  if (!l || !l->loaded) {
    snprintf(reason, cap, "RDMA library unavailable: %s", l ? l->reason : "out of memory");
    return false;
  }
  if (!l->link_capable) {
    snprintf(reason, cap, "%s lacks the queue-pair symbols the link test needs", l->path);
    return false;
  }
  uint8_t port;
  int gi;
  return find_usable(l, device, dev_out, dev_cap, &port, &gi, reason, cap);
}

void rdma_ep_close(rdma_ep *ep) {
  if (!ep) return;
  const verbs_lib *l = ep->l;
  if (ep->qp) l->f.destroy_qp(ep->qp);
  if (ep->mr) l->f.dereg_mr(ep->mr);
  if (ep->cq) l->f.destroy_cq(ep->cq);
  if (ep->pd) l->f.dealloc_pd(ep->pd);
  if (ep->ctx) l->f.close_device(ep->ctx);
  if (ep->mem) munmap(ep->mem, ep->mem_bytes);
  free(ep);
}

int32_t rdma_ep_open(const char *device, int gid_index, uint32_t slot_bytes, uint32_t depth, rdma_ep **out,
                     char *err, size_t cap) {
  *out = NULL;
  const verbs_lib *l = verbs_load();
  if (!l || !l->loaded || !l->link_capable) {
    snprintf(err, cap, "RDMA library unavailable or incomplete");
    return ORCH_ERR_UNAVAILABLE;
  }
  rdma_ep *ep = calloc(1, sizeof *ep);
  if (!ep) return ORCH_ERR_NO_MEMORY;
  ep->l = l;
  int auto_gid = -1;
  if (!find_usable(l, device, ep->device, sizeof ep->device, &ep->port, &auto_gid, err, cap)) {
    free(ep);
    return ORCH_ERR_UNAVAILABLE;
  }
  ep->gid_index = gid_index >= 0 ? gid_index : auto_gid;
  int n = 0;
  struct ibv_device **list = l->f.get_device_list(&n);
  for (int i = 0; list && i < n && !ep->ctx; i++) {
    const char *name = l->f.get_device_name(list[i]);
    if (name && strcmp(name, ep->device) == 0) {
      ep->ctx = l->f.open_device(list[i]);
      ep->uc = l->apple || (int)list[i]->transport_type == 100;
    }
  }
  if (list) l->f.free_device_list(list);
  int32_t rc = ORCH_ERR_IO;
#define FAIL(...)                     \
  do {                                \
    snprintf(err, cap, __VA_ARGS__);  \
    goto fail;                        \
  } while (0)
  if (!ep->ctx) FAIL("ibv_open_device(%s) failed", ep->device);
  struct ibv_port_attr pa;
  memset(&pa, 0, sizeof pa);
  if (l->f.query_port(ep->ctx, ep->port, &pa) != 0) FAIL("ibv_query_port failed");
  ep->lid = pa.lid;
  /* Apple: 1024 is the MTU known to work; elsewhere the port's active MTU. */
  ep->mtu = ep->uc ? (uint8_t)(pa.active_mtu < IBV_MTU_1024 ? pa.active_mtu : IBV_MTU_1024) : (uint8_t)pa.active_mtu;
  union ibv_gid g;
  memset(&g, 0, sizeof g);
  if (l->f.query_gid(ep->ctx, ep->port, ep->gid_index, &g) != 0) FAIL("ibv_query_gid(%d) failed", ep->gid_index);
  memcpy(ep->gid, g.raw, 16);
  ep->slot_bytes = slot_bytes;
  ep->depth = depth;
  size_t total = (size_t)slot_bytes * depth * 2;
  /* anonymous mappings are page-aligned (16 KiB on Apple Silicon) and zeroed */
  void *mem = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON, -1, 0);
  if (mem == MAP_FAILED) {
    rc = ORCH_ERR_NO_MEMORY;
    FAIL("cannot map %zu bytes of buffers (errno %d)", total, errno);
  }
  ep->mem = mem;
  ep->mem_bytes = total;
  if (!(ep->pd = l->f.alloc_pd(ep->ctx))) FAIL("ibv_alloc_pd failed (errno %d)", errno);
  if (!(ep->cq = l->f.create_cq(ep->ctx, (int)depth * 2 + 4, NULL, NULL, 0))) FAIL("ibv_create_cq failed (errno %d)", errno);
  /* Messages that reach the peer travel in a 128-byte field of the control protocol: keep them short. */
  if (!(ep->mr = l->f.reg_mr(ep->pd, ep->mem, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE))) {
    int e = errno;
    if (e == ENOMEM || e == EBUSY)
      FAIL("RDMA unusable on %s: memory-region limit reached (errno %d); Exo/MLX on this port share its ~100 MRs", ep->device, e);
    FAIL("ibv_reg_mr failed on %s (errno %d): the provider refused the mmap'ed buffers", ep->device, e);
  }
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = ep->cq;
  ia.recv_cq = ep->cq;
  ia.qp_type = ep->uc ? IBV_QPT_UC : IBV_QPT_RC;
  ia.cap.max_send_wr = depth;
  ia.cap.max_recv_wr = depth;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  if (!(ep->qp = l->f.create_qp(ep->pd, &ia))) {
    int e = errno;
    if (e == EBUSY || e == ENOMEM)
      FAIL("RDMA unusable on %s: queue-pair limit reached (%s); Exo/MLX on this port share its ~10 QPs: stop them or reboot", ep->device,
           e == EBUSY ? "EBUSY" : "ENOMEM");
    FAIL("ibv_create_qp failed on %s (errno %d)", ep->device, e);
  }
  /* Depths may be adjusted by the provider (Apple counts 4 KiB frames): read them back. */
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  memset(&qa, 0, sizeof qa);
  memset(&qi, 0, sizeof qi);
  if (l->f.query_qp(ep->qp, &qa, IBV_QP_CAP, &qi) == 0) {
    uint32_t got = qi.cap.max_recv_wr < qi.cap.max_send_wr ? qi.cap.max_recv_wr : qi.cap.max_send_wr;
    if (got > 0 && got < ep->depth) ep->depth = got;
  }
  memset(&qa, 0, sizeof qa);
  qa.qp_state = IBV_QPS_INIT;
  qa.pkey_index = 0;
  qa.port_num = ep->port;
  qa.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (l->f.modify_qp(ep->qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
    FAIL("ibv_modify_qp(INIT) failed (errno %d)", errno);
  ep->psn = (uint32_t)(orch_now_ns() & 0xffffff);
#undef FAIL
  *out = ep;
  return ORCH_OK;
fail:
  rdma_ep_close(ep);
  return rc;
}

void rdma_ep_local(const rdma_ep *ep, rdma_info *out) {
  memset(out, 0, sizeof *out);
  out->qpn = ep->qp->qp_num;
  out->psn = ep->psn;
  out->lid = ep->lid;
  memcpy(out->gid, ep->gid, 16);
  out->mtu = ep->mtu;
  out->uc = ep->uc ? 1 : 0;
  out->depth = ep->depth;
  out->slot_bytes = ep->slot_bytes;
}

int32_t rdma_ep_connect(rdma_ep *ep, const rdma_info *r, char *err, size_t cap) {
  const verbs_lib *l = ep->l;
  if (r->uc != (ep->uc ? 1 : 0)) {
    snprintf(err, cap, "peer uses %s queue pairs, this node %s", r->uc ? "UC" : "RC", ep->uc ? "UC" : "RC");
    return ORCH_ERR_PROTOCOL;
  }
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = (enum ibv_mtu)(r->mtu < ep->mtu ? r->mtu : ep->mtu);
  a.dest_qp_num = r->qpn;
  a.rq_psn = r->psn;
  a.ah_attr.dlid = r->lid;
  a.ah_attr.sl = 0;
  a.ah_attr.src_path_bits = 0;
  a.ah_attr.port_num = ep->port;
  static const uint8_t zero[16] = {0};
  if (memcmp(r->gid, zero, 16) != 0) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)ep->gid_index;
    a.ah_attr.grh.hop_limit = 1;
  }
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (!ep->uc) {
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  if (l->f.modify_qp(ep->qp, &a, mask) != 0) {
    int e = errno;
    if (e == EINVAL && ep->uc)
      snprintf(err, cap, "RTR transition failed (errno 22): known macOS issue until reboot; reboot this Mac, then test again");
    else
      snprintf(err, cap, "ibv_modify_qp(RTR) failed (errno %d); not retried", e);
    return ORCH_ERR_IO;
  }
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = ep->psn;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (!ep->uc) {
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  if (l->f.modify_qp(ep->qp, &a, mask) != 0) {
    snprintf(err, cap, "ibv_modify_qp(RTS) failed (errno %d)", errno);
    return ORCH_ERR_IO;
  }
  return ORCH_OK;
}

uint8_t *rdma_ep_buf(rdma_ep *ep, bool send, uint32_t slot) {
  return ep->mem + ((size_t)(send ? 0 : ep->depth) + slot) * ep->slot_bytes;
}

uint32_t rdma_ep_depth(const rdma_ep *ep) { return ep->depth; }
const char *rdma_ep_device(const rdma_ep *ep) { return ep->device; }
int rdma_ep_gid_index(const rdma_ep *ep) { return ep->gid_index; }

/* post_send, post_recv and poll_cq are inline in verbs.h (context->ops) on both rdma-core
 * and Apple's SDK, so they need no dlsym. */
/* len must equal the peer's send length: Apple's provider needs matching 4 KiB frame counts. */
int32_t rdma_ep_post_recv(rdma_ep *ep, uint32_t slot, uint32_t len) {
  if (len > ep->slot_bytes) return ORCH_ERR_INVALID_ARG;
  struct ibv_sge sge = {.addr = (uintptr_t)rdma_ep_buf(ep, false, slot), .length = len, .lkey = ep->mr->lkey};
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = ((uint64_t)1 << 32) | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(ep->qp, &wr, &bad) == 0 ? ORCH_OK : ORCH_ERR_IO;
}

int32_t rdma_ep_post_send(rdma_ep *ep, uint32_t slot, uint32_t len) {
  struct ibv_sge sge = {.addr = (uintptr_t)rdma_ep_buf(ep, true, slot), .length = len, .lkey = ep->mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(ep->qp, &wr, &bad) == 0 ? ORCH_OK : ORCH_ERR_IO;
}

int rdma_ep_poll(rdma_ep *ep, rdma_completion *out, int max) {
  struct ibv_wc wc[16];
  if (max > 16) max = 16;
  int n = ibv_poll_cq(ep->cq, max, wc);
  if (n < 0) return ORCH_ERR_IO;
  for (int i = 0; i < n; i++) {
    out[i].slot = (uint32_t)(wc[i].wr_id & 0xffffffffu);
    out[i].is_recv = (wc[i].wr_id >> 32) != 0;
    out[i].bytes = wc[i].byte_len;
    out[i].ok = wc[i].status == IBV_WC_SUCCESS;
    out[i].status = (int)wc[i].status;
  }
  return n;
}

#endif /* ORCH_HAVE_VERBS */
