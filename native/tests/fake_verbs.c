/* TEST DOUBLE: a fake verbs provider standing in for hardware CI cannot have. Built only for
 * tests (`build:native --tests`) and loaded only when env ORCHARD_VERBS_LIB points at it;
 * nothing in the product selects it. It reports three Thunderbolt-like devices:
 *   rdma_en2: active, only fe80:: GIDs          -> unusable (no IPv4-mapped GID)
 *   rdma_en3: active, IPv4-mapped GID at index 1 -> usable, gid_index 1
 *   rdma_en4: port down                          -> unusable (not active)
 * and emulates their data path between processes on one host: queue pairs, memory
 * regions, SEND/RECV, RDMA WRITE (with immediate) and completion queues. Underneath, a state
 * file mapped by every process (QP and MR tables; the per-device ceilings count across
 * processes, as Exo/MLX and Orchard share a Mac's ports) and one inbound ring file per QP
 * that the peer's sends are copied into; the receiver moves them into its posted receive
 * buffers when it polls its CQ (so an RDMA WRITE lands when the target polls, a simplification).
 *
 * Profiles (env ORCHARD_FAKE_VERBS_PROFILE):
 *   apple (default): transport 100, UC queue pairs only, path MTU at most 1024, the RTR's
 *     source GID index must name an IPv4-mapped GID, receives must match the send's 4 KiB
 *     frame count, and ibv_reg_mr accepts only memory that starts an mmap'ed mapping.
 *   rc: transport InfiniBand over an Ethernet link layer (RoCE-like): RC and UC.
 * Semantics: UC drops a message that finds no posted receive (or a vanished peer) and the
 * sender still sees success; RC reports IBV_WC_RETRY_EXC_ERR for a vanished peer and
 * IBV_WC_REM_ACCESS_ERR for a bad rkey. Dead processes' QPs and MRs are reclaimed.
 *
 * Configuration and injectable faults (env):
 *   ORCHARD_FAKE_VERBS_DIR          state directory shared by the processes of one "host"
 *                                   (default /dev/shm or $TMPDIR + /orchard-fake-verbs-<uid>)
 *   ORCHARD_FAKE_VERBS_MAX_QP / _MAX_MR   device ceilings (default 10 / 100)
 *   ORCHARD_FAKE_VERBS_HELD_QPS / _HELD_MRS   QPs/MRs another program (Exo, MLX) holds on
 *                                   every device: the ceiling is reached sooner (EBUSY / ENOMEM)
 *   ORCHARD_FAKE_VERBS_MMAP_ONLY    1/0: enforce the mmap-only rule (default: on in apple)
 *   ORCHARD_FAKE_VERBS_RTR_ERRNO    e.g. 22: the RTR transition fails with this errno, and keeps
 *                                   failing on that device for every process until the state
 *                                   directory is removed (macOS: until a reboot)
 *   ORCHARD_FAKE_VERBS_EXIT_AFTER_SENDS  N: the process vanishes (_exit(137), as with kill -9)
 *                                   at its Nth ibv_post_send: a peer that disappears mid-test */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#undef ibv_query_port
#undef ibv_get_device_list
#undef ibv_reg_mr

#define EXPORT __attribute__((visibility("default")))
#define NDEV 3
#define QP_SLOTS 64
#define MR_SLOTS 512
#define RING 32              /* inbound messages per QP */
#define MAX_MSG (64u * 1024u) /* largest message (liborchard's RDMA_MAX_SLOT) */
#define MAX_WR 32u           /* queue depth the provider grants (asked 64: read back) */
#define MAGIC 0x46564231u    /* "FVB1" */
#define FRAME 4096u

/* ---- shared state (one file per emulated host) ---- */

typedef struct fq_slot {
  uint32_t qpn; /* 0: free */
  int32_t pid;
  uint32_t dev;
  uint32_t type;
  _Atomic uint32_t state;  /* enum ibv_qp_state */
  _Atomic int32_t posted;  /* receives posted and not yet claimed by a sender (UC) */
} fq_slot;

typedef struct fq_mr {
  uint32_t key; /* 0: free; lkey == rkey */
  int32_t pid;
  uint32_t dev;
  uint32_t access;
  uint64_t addr, len;
} fq_mr;

typedef struct fq_shared {
  uint32_t magic;
  uint32_t next_qpn;
  uint32_t next_key;
  uint32_t wedged[NDEV]; /* RTR errno that sticks until "reboot", 0 = none */
  fq_slot qp[QP_SLOTS];
  fq_mr mr[MR_SLOTS];
} fq_shared;

enum { M_SEND = 1, M_SEND_IMM, M_WRITE, M_WRITE_IMM };

typedef struct fq_msg {
  uint32_t kind, len, imm, src_qpn, rkey, pad;
  uint64_t raddr;
  uint8_t data[MAX_MSG];
} fq_msg;

typedef struct fq_ring {
  _Atomic uint64_t head; /* advanced by the sender */
  _Atomic uint64_t tail; /* advanced by the receiver */
  fq_msg m[RING];
} fq_ring;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static fq_shared *g_sh;
static int g_fd = -1;
static char g_dir[512];

static const char *env(const char *k) {
  const char *v = getenv(k);
  return v && v[0] ? v : NULL;
}
static long env_long(const char *k, long dflt) {
  const char *v = env(k);
  return v ? strtol(v, NULL, 10) : dflt;
}
static bool apple(void) {
  const char *p = env("ORCHARD_FAKE_VERBS_PROFILE");
  return !p || strcmp(p, "rc") != 0;
}

static bool shared_open(void) {
  pthread_mutex_lock(&g_mu);
  if (g_sh) {
    pthread_mutex_unlock(&g_mu);
    return true;
  }
  const char *d = env("ORCHARD_FAKE_VERBS_DIR");
  if (d) {
    snprintf(g_dir, sizeof g_dir, "%s", d);
  } else {
    struct stat st;
    const char *base = stat("/dev/shm", &st) == 0 ? "/dev/shm" : env("TMPDIR") ? env("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/orchard-fake-verbs-%u", base, (unsigned)getuid());
  }
  mkdir(g_dir, 0700);
  char path[600];
  snprintf(path, sizeof path, "%s/state", g_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) goto fail;
  flock(fd, LOCK_EX);
  struct stat st;
  if (fstat(fd, &st) != 0 || ((size_t)st.st_size < sizeof(fq_shared) && ftruncate(fd, sizeof(fq_shared)) != 0)) {
    flock(fd, LOCK_UN);
    close(fd);
    goto fail;
  }
  fq_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (sh == MAP_FAILED) {
    flock(fd, LOCK_UN);
    close(fd);
    goto fail;
  }
  if (sh->magic != MAGIC) {
    memset(sh, 0, sizeof *sh);
    sh->next_qpn = 0x100;
    sh->next_key = 0x1000;
    sh->magic = MAGIC;
  }
  flock(fd, LOCK_UN);
  g_sh = sh, g_fd = fd;
  pthread_mutex_unlock(&g_mu);
  return true;
fail:
  pthread_mutex_unlock(&g_mu);
  return false;
}

static void lock(void) { flock(g_fd, LOCK_EX); }
static void unlock(void) { flock(g_fd, LOCK_UN); }

static bool alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

static fq_slot *slot_of(uint32_t qpn) {
  for (int i = 0; i < QP_SLOTS; i++) {
    if (g_sh->qp[i].qpn == qpn) return &g_sh->qp[i];
  }
  return NULL;
}

static void ring_path(char *out, size_t cap, uint32_t qpn) { snprintf(out, cap, "%s/qp-%u", g_dir, qpn); }

/* Under lock: frees what dead processes left (a sane kernel reclaims on exit). */
static void reclaim(void) {
  for (int i = 0; i < QP_SLOTS; i++) {
    fq_slot *s = &g_sh->qp[i];
    if (s->qpn && !alive(s->pid)) {
      char p[600];
      ring_path(p, sizeof p, s->qpn);
      unlink(p);
      s->qpn = 0;
    }
  }
  for (int i = 0; i < MR_SLOTS; i++) {
    if (g_sh->mr[i].key && !alive(g_sh->mr[i].pid)) g_sh->mr[i].key = 0;
  }
}

/* ---- devices ---- */

static struct ibv_device devs[NDEV];
static struct ibv_device *list[NDEV + 1];

typedef struct fctx {
  struct ibv_context c; /* first: liborchard sees an ibv_context */
  int dev;
} fctx;

typedef struct fwr {
  uint64_t wr_id, addr;
  uint32_t len, lkey;
} fwr;

struct fcq;

typedef struct fqp {
  struct ibv_qp qp;
  int dev;
  fq_slot *slot;
  fq_ring *in;      /* our inbound ring (mapped from our file) */
  fq_ring *out;     /* the peer's inbound ring, mapped at the first send */
  uint32_t out_qpn; /* dest_qp_num from RTR */
  uint32_t max_send, max_recv;
  uint8_t mtu;
  bool sig_all;
  fwr rq[MAX_WR];
  uint32_t rq_head, rq_n;
  struct fqp *next_on_cq;
} fqp;

typedef struct fcq {
  struct ibv_cq cq;
  struct ibv_wc *pend;
  int cap, head, n;
  fqp *qps;
} fcq;

typedef struct fmr {
  struct ibv_mr mr;
  fq_mr *slot;
} fmr;

static long g_sends;

static int ctx_dev(struct ibv_context *c) { return ((fctx *)c)->dev; }

EXPORT struct ibv_device **ibv_get_device_list(int *num) {
  static const char *names[NDEV] = {"rdma_en2", "rdma_en3", "rdma_en4"};
  for (int i = 0; i < NDEV; i++) {
    memset(&devs[i], 0, sizeof devs[i]);
    devs[i].node_type = IBV_NODE_CA;
    devs[i].transport_type = apple() ? (enum ibv_transport_type)100 /* Apple's value */ : IBV_TRANSPORT_IB;
    strncpy(devs[i].name, names[i], sizeof devs[i].name - 1);
    list[i] = &devs[i];
  }
  list[NDEV] = NULL;
  if (num) *num = NDEV;
  return list;
}

EXPORT void ibv_free_device_list(struct ibv_device **l) { (void)l; }

EXPORT const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *d) {
  fctx *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->c.device = d;
  c->dev = (int)(d - devs);
  c->c.ops.post_send = fake_post_send;
  c->c.ops.post_recv = fake_post_recv;
  c->c.ops.poll_cq = fake_poll_cq;
  return &c->c;
}

EXPORT int ibv_close_device(struct ibv_context *c) {
  free(c);
  return 0;
}

static int max_qp(void) { return (int)env_long("ORCHARD_FAKE_VERBS_MAX_QP", 10); }
static int max_mr(void) { return (int)env_long("ORCHARD_FAKE_VERBS_MAX_MR", 100); }

EXPORT int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) {
  (void)c;
  memset(a, 0, sizeof *a);
  strcpy(a->fw_ver, "fake-26.2");
  a->vendor_id = 0x05ac;
  a->vendor_part_id = 0x5;
  a->max_qp = max_qp();
  a->max_qp_wr = MAX_WR;
  a->max_cq = 10;
  a->max_cqe = 512;
  a->max_mr = max_mr();
  a->max_mr_size = 1ull << 32;
  a->max_sge = 1;
  a->max_pd = 10;
  a->phys_port_cnt = 1;
  return 0;
}

static bool port_active(int dev) { return dev != 2; }

/* The exported rdma-core symbol takes the compat struct, a prefix of ibv_port_attr. */
EXPORT int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *compat) {
  struct ibv_port_attr *a = (struct ibv_port_attr *)compat;
  if (port != 1) return EINVAL;
  int d = ctx_dev(c);
  memset(a, 0, sizeof *a); /* liborchard passes a full ibv_port_attr */
  a->state = port_active(d) ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a->phys_state = port_active(d) ? 5 : 3;
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
  a->active_mtu = IBV_MTU_1024;
  a->max_mtu = IBV_MTU_4096;
  a->gid_tbl_len = 4;
  return 0;
}

static void gid_of(int d, int index, union ibv_gid *gid) {
  memset(gid, 0, sizeof *gid);
  if (index == 0 || (index == 1 && d != 1)) {
    gid->raw[0] = 0xfe, gid->raw[1] = 0x80, gid->raw[15] = (uint8_t)(d * 16 + index + 1);
  } else if (index == 1 && d == 1) {
    gid->raw[10] = 0xff, gid->raw[11] = 0xff, gid->raw[12] = 10, gid->raw[15] = 2; /* ::ffff:10.0.0.2 */
  }
}

static bool gid_ipv4_mapped(const uint8_t *g) {
  static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g, pre, 12) == 0;
}

EXPORT int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid) {
  if (port != 1 || index < 0 || index >= 4) return EINVAL;
  gid_of(ctx_dev(c), index, gid);
  return 0;
}

/* ---- PD, CQ, MR ---- */

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) {
  struct ibv_pd *pd = calloc(1, sizeof *pd);
  if (!pd) {
    errno = ENOMEM;
    return NULL;
  }
  pd->context = c;
  return pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd) {
  free(pd);
  return 0;
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *user, struct ibv_comp_channel *ch, int vec) {
  (void)vec;
  if (cqe < 1 || cqe > 512) {
    errno = EINVAL;
    return NULL;
  }
  fcq *q = calloc(1, sizeof *q);
  if (q) q->pend = calloc((size_t)cqe, sizeof *q->pend);
  if (!q || !q->pend) {
    if (q) free(q);
    errno = ENOMEM;
    return NULL;
  }
  q->cq.context = c, q->cq.cq_context = user, q->cq.channel = ch, q->cq.cqe = cqe;
  q->cap = cqe;
  return &q->cq;
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq) {
  fcq *q = (fcq *)cq;
  if (q->qps) return EBUSY;
  free(q->pend);
  free(q);
  return 0;
}

#if defined(__linux__)
/* The mmap-only rule: the region must start a mapping (an mmap'ed buffer); heap memory, even
 * glibc's own mmap'ed chunks behind posix_memalign, starts inside one. */
static bool starts_mapping(uintptr_t addr, size_t len) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return true;
  char line[512];
  bool ok = false;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    if (lo == addr) {
      ok = addr + len <= hi;
      break;
    }
  }
  fclose(f);
  return ok;
}
#else
static bool starts_mapping(uintptr_t addr, size_t len) {
  (void)len;
  return addr % (uintptr_t)getpagesize() == 0;
}
#endif

EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
  if (!shared_open()) {
    errno = EIO;
    return NULL;
  }
  if (!addr || len == 0 || len > (1ull << 32)) {
    errno = EINVAL;
    return NULL;
  }
  if (env_long("ORCHARD_FAKE_VERBS_MMAP_ONLY", apple() ? 1 : 0) && !starts_mapping((uintptr_t)addr, len)) {
    errno = EFAULT;
    return NULL;
  }
  int dev = ctx_dev(pd->context);
  fmr *m = calloc(1, sizeof *m);
  if (!m) {
    errno = ENOMEM;
    return NULL;
  }
  lock();
  reclaim();
  int used = (int)env_long("ORCHARD_FAKE_VERBS_HELD_MRS", 0);
  fq_mr *free_slot = NULL;
  for (int i = 0; i < MR_SLOTS; i++) {
    fq_mr *s = &g_sh->mr[i];
    if (s->key && s->dev == (uint32_t)dev) used++;
    if (!s->key && !free_slot) free_slot = s;
  }
  if (used >= max_mr() || !free_slot) {
    unlock();
    free(m);
    errno = ENOMEM;
    return NULL;
  }
  free_slot->key = g_sh->next_key++;
  free_slot->pid = (int32_t)getpid();
  free_slot->dev = (uint32_t)dev;
  free_slot->access = (uint32_t)access;
  free_slot->addr = (uintptr_t)addr;
  free_slot->len = len;
  unlock();
  m->slot = free_slot;
  m->mr.context = pd->context, m->mr.pd = pd, m->mr.addr = addr, m->mr.length = len;
  m->mr.lkey = m->mr.rkey = free_slot->key;
  return &m->mr;
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr) {
  fmr *m = (fmr *)mr;
  lock();
  m->slot->key = 0;
  unlock();
  free(m);
  return 0;
}

/* Our own MR covering [addr, addr+len) with key; needs remote write access when remote. */
static bool mr_covers(uint32_t key, int32_t pid, uint64_t addr, uint64_t len, bool remote) {
  for (int i = 0; i < MR_SLOTS; i++) {
    const fq_mr *s = &g_sh->mr[i];
    if (s->key != key || s->pid != pid) continue;
    if (remote && !(s->access & IBV_ACCESS_REMOTE_WRITE)) return false;
    return addr >= s->addr && addr + len <= s->addr + s->len;
  }
  return false;
}

/* ---- QPs ---- */

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
  if (!shared_open()) {
    errno = EIO;
    return NULL;
  }
  if (!a->send_cq || !a->recv_cq || a->srq || a->cap.max_send_sge > 1 || a->cap.max_recv_sge > 1 ||
      (a->qp_type != IBV_QPT_UC && a->qp_type != IBV_QPT_RC) || (apple() && a->qp_type != IBV_QPT_UC)) {
    errno = EINVAL; /* Apple: UC only */
    return NULL;
  }
  int dev = ctx_dev(pd->context);
  fqp *q = calloc(1, sizeof *q);
  if (!q) {
    errno = ENOMEM;
    return NULL;
  }
  lock();
  reclaim();
  int used = (int)env_long("ORCHARD_FAKE_VERBS_HELD_QPS", 0);
  fq_slot *free_slot = NULL;
  for (int i = 0; i < QP_SLOTS; i++) {
    fq_slot *s = &g_sh->qp[i];
    if (s->qpn && s->dev == (uint32_t)dev) used++;
    if (!s->qpn && !free_slot) free_slot = s;
  }
  if (used >= max_qp() || !free_slot) {
    unlock();
    free(q);
    errno = EBUSY; /* the reported Thunderbolt behaviour at the 11th QP */
    return NULL;
  }
  uint32_t qpn = g_sh->next_qpn++;
  char path[600];
  ring_path(path, sizeof path, qpn);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  void *ring = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, sizeof(fq_ring)) == 0) {
    ring = mmap(NULL, sizeof(fq_ring), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (fd >= 0) close(fd);
  if (ring == MAP_FAILED) {
    unlink(path);
    unlock();
    free(q);
    errno = ENOMEM;
    return NULL;
  }
  free_slot->qpn = qpn;
  free_slot->pid = (int32_t)getpid();
  free_slot->dev = (uint32_t)dev;
  free_slot->type = a->qp_type;
  atomic_store(&free_slot->state, IBV_QPS_RESET);
  atomic_store(&free_slot->posted, 0);
  unlock();
  q->slot = free_slot;
  q->dev = dev;
  q->in = ring;
  q->max_send = a->cap.max_send_wr < MAX_WR ? a->cap.max_send_wr : MAX_WR;
  q->max_recv = a->cap.max_recv_wr < MAX_WR ? a->cap.max_recv_wr : MAX_WR;
  a->cap.max_send_wr = q->max_send, a->cap.max_recv_wr = q->max_recv; /* what was granted */
  q->sig_all = a->sq_sig_all != 0;
  q->qp.context = pd->context, q->qp.pd = pd, q->qp.send_cq = a->send_cq, q->qp.recv_cq = a->recv_cq;
  q->qp.qp_context = a->qp_context, q->qp.qp_num = qpn, q->qp.qp_type = a->qp_type, q->qp.state = IBV_QPS_RESET;
  fcq *rc = (fcq *)a->recv_cq;
  q->next_on_cq = rc->qps;
  rc->qps = q;
  return &q->qp;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp) {
  fqp *q = (fqp *)qp;
  fcq *rc = (fcq *)qp->recv_cq;
  for (fqp **p = &rc->qps; *p; p = &(*p)->next_on_cq) {
    if (*p == q) {
      *p = q->next_on_cq;
      break;
    }
  }
  char path[600];
  lock();
  ring_path(path, sizeof path, qp->qp_num);
  unlink(path);
  q->slot->qpn = 0;
  unlock();
  munmap(q->in, sizeof(fq_ring));
  if (q->out) munmap(q->out, sizeof(fq_ring));
  free(q);
  return 0;
}

EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init) {
  (void)mask;
  fqp *q = (fqp *)qp;
  memset(a, 0, sizeof *a);
  a->qp_state = (enum ibv_qp_state)atomic_load(&q->slot->state);
  a->path_mtu = (enum ibv_mtu)q->mtu;
  a->cap.max_send_wr = q->max_send, a->cap.max_recv_wr = q->max_recv;
  a->cap.max_send_sge = a->cap.max_recv_sge = 1;
  if (init) {
    memset(init, 0, sizeof *init);
    init->send_cq = qp->send_cq, init->recv_cq = qp->recv_cq, init->qp_type = qp->qp_type;
    init->cap = a->cap;
  }
  return 0;
}

static int fail(int e) {
  errno = e;
  return e;
}

static bool has(int mask, int need) { return (mask & need) == need; }

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
  fqp *q = (fqp *)qp;
  if (!(mask & IBV_QP_STATE)) return fail(EINVAL);
  uint32_t cur = atomic_load(&q->slot->state), to = a->qp_state;
  bool rc = qp->qp_type == IBV_QPT_RC;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
    if (to == IBV_QPS_RESET) q->rq_n = 0, atomic_store(&q->slot->posted, 0);
  } else if (cur == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    if (!has(mask, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return fail(EINVAL);
    if (a->port_num != 1 || !port_active(q->dev)) return fail(EINVAL);
  } else if (cur == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    int need = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (rc) need |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    if (!has(mask, need)) return fail(EINVAL);
    long stick = env_long("ORCHARD_FAKE_VERBS_RTR_ERRNO", 0);
    if (stick > 0) g_sh->wedged[q->dev] = (uint32_t)stick;
    if (g_sh->wedged[q->dev]) return fail((int)g_sh->wedged[q->dev]);
    /* a GRH is required (Ethernet-like link): its source GID index must name an IPv4-mapped GID */
    if (!a->ah_attr.is_global || a->ah_attr.grh.sgid_index >= 4) return fail(EINVAL);
    union ibv_gid g;
    gid_of(q->dev, a->ah_attr.grh.sgid_index, &g);
    if (!gid_ipv4_mapped(g.raw) || !gid_ipv4_mapped(a->ah_attr.grh.dgid.raw)) return fail(EINVAL);
    if (a->path_mtu < IBV_MTU_256 || a->path_mtu > (apple() ? IBV_MTU_1024 : IBV_MTU_4096)) return fail(EINVAL);
    q->mtu = (uint8_t)a->path_mtu;
    q->out_qpn = a->dest_qp_num;
  } else if (cur == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    int need = IBV_QP_SQ_PSN;
    if (rc) need |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    if (!has(mask, need)) return fail(EINVAL);
  } else {
    return fail(EINVAL);
  }
  atomic_store(&q->slot->state, to);
  qp->state = (enum ibv_qp_state)to;
  return 0;
}

/* ---- data path ---- */

static void complete(fcq *c, uint64_t wr_id, enum ibv_wc_status st, enum ibv_wc_opcode op, uint32_t len,
                     uint32_t qpn) {
  if (c->n >= c->cap) return; /* overrun: a real CQ raises an async error; liborchard sizes it */
  struct ibv_wc *w = &c->pend[(c->head + c->n++) % c->cap];
  memset(w, 0, sizeof *w);
  w->wr_id = wr_id, w->status = st, w->opcode = op, w->byte_len = len, w->qp_num = qpn;
}

static fq_ring *peer_ring(fqp *q) {
  if (q->out) return q->out;
  char path[600];
  ring_path(path, sizeof path, q->out_qpn);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return NULL;
  void *r = mmap(NULL, sizeof(fq_ring), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return r == MAP_FAILED ? NULL : (q->out = r);
}

/* Delivers one message; the status the sender's completion gets. */
static enum ibv_wc_status deliver(fqp *q, uint32_t kind, const void *src, uint32_t len, uint32_t imm, uint64_t raddr,
                                  uint32_t rkey) {
  bool rc = q->qp.qp_type == IBV_QPT_RC;
  fq_slot *d = slot_of(q->out_qpn);
  uint32_t st = d ? atomic_load(&d->state) : 0;
  if (!d || !alive(d->pid) || (st != IBV_QPS_RTR && st != IBV_QPS_RTS)) {
    return rc ? IBV_WC_RETRY_EXC_ERR : IBV_WC_SUCCESS; /* UC: lost on the wire */
  }
  if ((kind == M_WRITE || kind == M_WRITE_IMM) && !mr_covers(rkey, d->pid, raddr, len, true)) {
    return rc ? IBV_WC_REM_ACCESS_ERR : IBV_WC_SUCCESS;
  }
  if (kind != M_WRITE && !rc) { /* UC: a message with no posted receive is dropped */
    int32_t p = atomic_load(&d->posted);
    do {
      if (p <= 0) return IBV_WC_SUCCESS;
    } while (!atomic_compare_exchange_weak(&d->posted, &p, p - 1));
  }
  fq_ring *r = peer_ring(q);
  if (!r) return rc ? IBV_WC_RETRY_EXC_ERR : IBV_WC_SUCCESS;
  uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
  if (h - atomic_load_explicit(&r->tail, memory_order_acquire) >= RING) {
    return rc ? IBV_WC_RNR_RETRY_EXC_ERR : IBV_WC_SUCCESS;
  }
  fq_msg *m = &r->m[h % RING];
  m->kind = kind, m->len = len, m->imm = imm, m->src_qpn = q->qp.qp_num, m->raddr = raddr, m->rkey = rkey;
  if (len) memcpy(m->data, src, len);
  atomic_store_explicit(&r->head, h + 1, memory_order_release);
  return IBV_WC_SUCCESS;
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  fqp *q = (fqp *)qp;
  fcq *c = (fcq *)qp->send_cq;
  long vanish = env_long("ORCHARD_FAKE_VERBS_EXIT_AFTER_SENDS", 0);
  for (; wr; wr = wr->next) {
    if (atomic_load(&q->slot->state) != IBV_QPS_RTS || wr->num_sge > 1 ||
        (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM && wr->opcode != IBV_WR_RDMA_WRITE &&
         wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM)) {
      *bad = wr;
      return EINVAL;
    }
    if (vanish > 0 && ++g_sends >= vanish) _exit(137);
    uint32_t len = wr->num_sge ? wr->sg_list[0].length : 0;
    const void *src = wr->num_sge ? (const void *)(uintptr_t)wr->sg_list[0].addr : NULL;
    enum ibv_wc_status st = IBV_WC_SUCCESS;
    bool write = wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (len > MAX_MSG) st = IBV_WC_LOC_LEN_ERR;
    else if (len && !mr_covers(wr->sg_list[0].lkey, (int32_t)getpid(), (uintptr_t)src, len, false)) {
      st = IBV_WC_LOC_PROT_ERR;
    } else {
      uint32_t kind = wr->opcode == IBV_WR_SEND ? M_SEND
                      : wr->opcode == IBV_WR_SEND_WITH_IMM ? M_SEND_IMM
                      : wr->opcode == IBV_WR_RDMA_WRITE ? M_WRITE
                                                        : M_WRITE_IMM;
      st = deliver(q, kind, src, len, wr->imm_data, write ? wr->wr.rdma.remote_addr : 0, write ? wr->wr.rdma.rkey : 0);
    }
    if (st != IBV_WC_SUCCESS) atomic_store(&q->slot->state, IBV_QPS_ERR);
    if (st != IBV_WC_SUCCESS || q->sig_all || (wr->send_flags & IBV_SEND_SIGNALED)) {
      complete(c, wr->wr_id, st, write ? IBV_WC_RDMA_WRITE : IBV_WC_SEND, len, qp->qp_num);
    }
  }
  return 0;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  fqp *q = (fqp *)qp;
  for (; wr; wr = wr->next) {
    uint32_t st = atomic_load(&q->slot->state);
    if (st == IBV_QPS_RESET || st == IBV_QPS_ERR || wr->num_sge > 1) {
      *bad = wr;
      return EINVAL;
    }
    if (q->rq_n >= q->max_recv) {
      *bad = wr;
      return ENOMEM;
    }
    fwr *r = &q->rq[(q->rq_head + q->rq_n++) % MAX_WR];
    r->wr_id = wr->wr_id;
    r->addr = wr->num_sge ? wr->sg_list[0].addr : 0;
    r->len = wr->num_sge ? wr->sg_list[0].length : 0;
    r->lkey = wr->num_sge ? wr->sg_list[0].lkey : 0;
    atomic_fetch_add(&q->slot->posted, 1);
  }
  return 0;
}

static uint32_t frames(uint32_t n) { return (n + FRAME - 1) / FRAME; }

/* Moves arrived messages into posted receives (and applies RDMA writes). */
static void pull(fcq *c, fqp *q) {
  fq_ring *r = q->in;
  pid_t me = getpid();
  while (c->n < c->cap) {
    uint64_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (t == atomic_load_explicit(&r->head, memory_order_acquire)) return;
    fq_msg *m = &r->m[t % RING];
    if (m->kind == M_WRITE || m->kind == M_WRITE_IMM) {
      if (mr_covers(m->rkey, me, m->raddr, m->len, true)) memcpy((void *)(uintptr_t)m->raddr, m->data, m->len);
    }
    if (m->kind != M_WRITE) {
      if (q->rq_n == 0) {
        if (q->qp.qp_type == IBV_QPT_RC) return; /* RC: waits for a receive (receiver-not-ready retries) */
        atomic_store_explicit(&r->tail, t + 1, memory_order_release); /* UC: dropped */
        continue;
      }
      fwr w = q->rq[q->rq_head];
      q->rq_head = (q->rq_head + 1) % MAX_WR, q->rq_n--;
      if (q->qp.qp_type == IBV_QPT_RC) {
        int32_t p = atomic_load(&q->slot->posted);
        while (p > 0 && !atomic_compare_exchange_weak(&q->slot->posted, &p, p - 1)) {
        }
      }
      enum ibv_wc_status st = IBV_WC_SUCCESS;
      bool send = m->kind == M_SEND || m->kind == M_SEND_IMM;
      if (send && (m->len > w.len || (apple() && frames(m->len) != frames(w.len)))) st = IBV_WC_LOC_LEN_ERR;
      else if (send && m->len && !mr_covers(w.lkey, me, w.addr, m->len, false)) st = IBV_WC_LOC_PROT_ERR;
      else if (send && m->len) memcpy((void *)(uintptr_t)w.addr, m->data, m->len);
      complete(c, w.wr_id, st, send ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM, m->len, q->qp.qp_num);
      struct ibv_wc *done = &c->pend[(c->head + c->n - 1) % c->cap];
      done->src_qp = m->src_qpn;
      if (m->kind != M_SEND) done->wc_flags = IBV_WC_WITH_IMM, done->imm_data = m->imm;
      if (st != IBV_WC_SUCCESS) atomic_store(&q->slot->state, IBV_QPS_ERR);
    }
    atomic_store_explicit(&r->tail, t + 1, memory_order_release);
  }
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
  fcq *c = (fcq *)cq;
  for (fqp *q = c->qps; q; q = q->next_on_cq) pull(c, q);
  int k = 0;
  while (k < n && c->n > 0) {
    wc[k++] = c->pend[c->head];
    c->head = (c->head + 1) % c->cap, c->n--;
  }
  return k;
}
