/* Checks of the fake verbs provider (the test double, argv[1]) and of how liborchard's RDMA
 * endpoint meets its rules: ceilings, the mmap-only rule, Apple's QP rules, the data path and
 * the injected faults. Run by native/native_test.ts; prints "PASS n" or "FAIL n/m". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../src/internal.h"
#include "../src/rdma.h"

#undef ibv_reg_mr
#undef ibv_get_device_list

static int checks, failures;

#define CHECK(cond, name)                                    \
  do {                                                       \
    checks++;                                                \
    if (cond) {                                              \
      printf("ok   %s\n", name);                             \
    } else {                                                 \
      failures++;                                            \
      printf("FAIL %s (%s:%d)\n", name, __FILE__, __LINE__); \
    }                                                        \
  } while (0)

static struct {
  struct ibv_device **(*get_device_list)(int *);
  struct ibv_context *(*open_device)(struct ibv_device *);
  int (*close_device)(struct ibv_context *);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *);
  int (*dealloc_pd)(struct ibv_pd *);
  struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
  int (*destroy_cq)(struct ibv_cq *);
  struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
  int (*destroy_qp)(struct ibv_qp *);
  int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
  int (*dereg_mr)(struct ibv_mr *);
} v;

static void *map(size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* ---- through liborchard's endpoint (what the link test does) ---- */

static void test_ceilings(void) {
  rdma_ep *eps[11] = {0};
  char err[256] = "";
  int opened = 0;
  for (int i = 0; i < 10; i++) opened += rdma_ep_open("rdma_en3", -1, 4096, 64, &eps[i], err, sizeof err) == ORCH_OK;
  CHECK(opened == 10, "ten endpoints (one QP and one MR each) open on one device");
  CHECK(eps[0] && rdma_ep_depth(eps[0]) == 32, "the depth the provider granted is read back (asked 64, got 32)");
  CHECK(rdma_ep_open("rdma_en3", -1, 4096, 64, &eps[10], err, sizeof err) == ORCH_ERR_IO && !eps[10],
        "the 11th queue pair is refused");
  CHECK(strstr(err, "RDMA unusable on rdma_en3: queue-pair limit reached (EBUSY)") && strstr(err, "Exo/MLX"),
        "the 11th says: queue-pair limit reached (EBUSY), shared with Exo/MLX");
  CHECK(strlen(err) < 128, "the QP-limit message fits the control protocol's reason field");
  for (int i = 0; i < 10; i++) rdma_ep_close(eps[i]);
  CHECK(rdma_ep_open("rdma_en3", -1, 4096, 64, &eps[0], err, sizeof err) == ORCH_OK,
        "closing the endpoints frees the device's queue pairs");
  rdma_ep_close(eps[0]);

  setenv("ORCHARD_FAKE_VERBS_HELD_QPS", "10", 1);
  eps[0] = NULL;
  CHECK(rdma_ep_open("rdma_en3", -1, 4096, 64, &eps[0], err, sizeof err) == ORCH_ERR_IO &&
            strstr(err, "queue-pair limit reached (EBUSY)"),
        "QPs held by another program (Exo/MLX) count against the same ceiling");
  unsetenv("ORCHARD_FAKE_VERBS_HELD_QPS");
  setenv("ORCHARD_FAKE_VERBS_HELD_MRS", "100", 1);
  CHECK(rdma_ep_open("rdma_en3", -1, 4096, 64, &eps[0], err, sizeof err) == ORCH_ERR_IO &&
            strstr(err, "RDMA unusable on rdma_en3: memory-region limit reached") && strlen(err) < 128,
        "the memory-region ceiling is named");
  unsetenv("ORCHARD_FAKE_VERBS_HELD_MRS");
}

static void test_rtr_errno(void) {
  rdma_ep *a = NULL, *b = NULL;
  char err[256] = "";
  rdma_ep_open("rdma_en3", -1, 4096, 16, &a, err, sizeof err);
  rdma_ep_open("rdma_en3", -1, 4096, 16, &b, err, sizeof err);
  CHECK(a && b, "two endpoints for the RTR check");
  if (!a || !b) return;
  rdma_info ia, ib;
  rdma_ep_local(a, &ia);
  rdma_ep_local(b, &ib);
  CHECK(ia.uc == 1 && ia.mtu == IBV_MTU_1024 && rdma_ep_gid_index(a) == 1, "UC, MTU 1024, the IPv4-mapped GID index");
  setenv("ORCHARD_FAKE_VERBS_RTR_ERRNO", "22", 1);
  CHECK(rdma_ep_connect(a, &ib, err, sizeof err) == ORCH_ERR_IO, "an RTR transition failing with errno 22 fails");
  CHECK(strstr(err, "RTR transition failed (errno 22): known macOS issue until reboot") != NULL,
        "it says: RTR transition failed (errno 22): known macOS issue until reboot");
  unsetenv("ORCHARD_FAKE_VERBS_RTR_ERRNO");
  CHECK(rdma_ep_connect(b, &ia, err, sizeof err) == ORCH_ERR_IO && strstr(err, "errno 22"),
        "and keeps failing on that device until a reboot (the state directory removed)");
  rdma_ep_close(a);
  rdma_ep_close(b);
}

/* ---- the provider's rules, straight through verbs ---- */

typedef struct dev {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
} dev;

static dev open_dev(int index) {
  int n = 0;
  struct ibv_device **l = v.get_device_list(&n);
  dev d = {0};
  d.ctx = v.open_device(l[index]);
  d.pd = v.alloc_pd(d.ctx);
  d.cq = v.create_cq(d.ctx, 64, NULL, NULL, 0);
  return d;
}

static void close_dev(dev *d) {
  v.destroy_cq(d->cq);
  v.dealloc_pd(d->pd);
  v.close_device(d->ctx);
}

static struct ibv_qp *qp_new(dev *d, enum ibv_qp_type t) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = ia.recv_cq = d->cq;
  ia.qp_type = t;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  return v.create_qp(d->pd, &ia);
}

static int to_init(struct ibv_qp *q) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT, a.port_num = 1, a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  return v.modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *q, uint32_t dest, int sgid, enum ibv_mtu mtu) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR, a.path_mtu = mtu, a.dest_qp_num = dest, a.ah_attr.port_num = 1;
  a.ah_attr.is_global = 1, a.ah_attr.grh.sgid_index = (uint8_t)sgid, a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xff, a.ah_attr.grh.dgid.raw[12] = 10;
  a.max_dest_rd_atomic = 1, a.min_rnr_timer = 12;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (q->qp_type == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return v.modify_qp(q, &a, mask);
}

static int to_rts(struct ibv_qp *q) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS, a.timeout = 14, a.retry_cnt = 7, a.rnr_retry = 7, a.max_rd_atomic = 1;
  int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (q->qp_type == IBV_QPT_RC) mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  return v.modify_qp(q, &a, mask);
}

static int post(struct ibv_qp *q, enum ibv_wr_opcode op, struct ibv_mr *mr, void *buf, uint32_t len, uint64_t raddr,
                uint32_t rkey, uint64_t id) {
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id, wr.sg_list = &sge, wr.num_sge = 1, wr.opcode = op, wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = 0x1234, wr.wr.rdma.remote_addr = raddr, wr.wr.rdma.rkey = rkey;
  return ibv_post_send(q, &wr, &bad);
}

static int post_recv1(struct ibv_qp *q, struct ibv_mr *mr, void *buf, uint32_t len, uint64_t id) {
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = mr->lkey};
  struct ibv_recv_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id, wr.sg_list = &sge, wr.num_sge = 1;
  return ibv_post_recv(q, &wr, &bad);
}

static struct ibv_wc stash[64];
static int stashed;

/* Polls until a completion with wr_id arrives (or 100 polls pass); keeps the others. */
static bool wait_wc(struct ibv_cq *cq, uint64_t id, struct ibv_wc *out) {
  for (int i = 0; i < 100; i++) {
    struct ibv_wc wc[8];
    int n = ibv_poll_cq(cq, 8, wc);
    for (int j = 0; j < n && stashed < 64; j++) stash[stashed++] = wc[j];
    for (int j = 0; j < stashed; j++) {
      if (stash[j].wr_id == id) {
        *out = stash[j];
        stash[j] = stash[--stashed];
        return true;
      }
    }
  }
  return false;
}

static void test_rules(void) {
  dev d = open_dev(1); /* rdma_en3 */
  size_t n = 1 << 16;
  void *heap = NULL;
  CHECK(posix_memalign(&heap, 4096, n) == 0, "posix_memalign buffer");
  errno = 0;
  CHECK(v.reg_mr(d.pd, heap, n, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EFAULT,
        "the mmap-only rule refuses posix_memalign memory (EFAULT)");
  setenv("ORCHARD_FAKE_VERBS_MMAP_ONLY", "0", 1);
  struct ibv_mr *hm = v.reg_mr(d.pd, heap, n, IBV_ACCESS_LOCAL_WRITE);
  CHECK(hm != NULL, "with ORCHARD_FAKE_VERBS_MMAP_ONLY=0 it is accepted");
  if (hm) v.dereg_mr(hm);
  unsetenv("ORCHARD_FAKE_VERBS_MMAP_ONLY");
  free(heap);
  uint8_t *mem = map(n * 2);
  struct ibv_mr *mr = v.reg_mr(d.pd, mem, n * 2, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(mr != NULL, "mmap'ed memory registers");

  errno = 0;
  CHECK(qp_new(&d, IBV_QPT_RC) == NULL && errno == EINVAL, "the Apple profile refuses RC queue pairs (UC only)");
  struct ibv_qp *a = qp_new(&d, IBV_QPT_UC), *b = qp_new(&d, IBV_QPT_UC);
  CHECK(a && b, "UC queue pairs are created");
  if (!mr || !a || !b) return;
  CHECK(to_rtr(a, b->qp_num, 1, IBV_MTU_1024) == EINVAL, "RESET to RTR is refused (INIT first)");
  CHECK(to_init(a) == 0 && to_init(b) == 0, "RESET to INIT");
  CHECK(post(a, IBV_WR_SEND, mr, mem, 8, 0, 0, 1) == EINVAL, "posting a send before RTS is refused");
  CHECK(to_rtr(a, b->qp_num, 0, IBV_MTU_1024) == EINVAL, "an RTR whose source GID index is not IPv4-mapped fails");
  CHECK(to_rtr(a, b->qp_num, 1, IBV_MTU_2048) == EINVAL, "an RTR with a path MTU above 1024 fails");
  CHECK(to_rtr(a, b->qp_num, 1, IBV_MTU_1024) == 0 && to_rtr(b, a->qp_num, 1, IBV_MTU_1024) == 0, "INIT to RTR");
  CHECK(to_rts(a) == 0 && to_rts(b) == 0, "RTR to RTS");

  struct ibv_wc wc;
  uint8_t *src = mem, *dst = mem + n;
  memcpy(src, "hello, mesh", 12);
  CHECK(post_recv1(b, mr, dst, 12, 10) == 0 && post(a, IBV_WR_SEND, mr, src, 12, 0, 0, 11) == 0, "send and receive post");
  CHECK(wait_wc(d.cq, 11, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "send completes");
  CHECK(wait_wc(d.cq, 10, &wc) && wc.status == IBV_WC_SUCCESS && wc.byte_len == 12 && wc.opcode == IBV_WC_RECV &&
            memcmp(dst, "hello, mesh", 12) == 0,
        "the receive completes with the bytes");
  CHECK(post(a, IBV_WR_SEND, mr, src, 12, 0, 0, 12) == 0 && wait_wc(d.cq, 12, &wc) && wc.status == IBV_WC_SUCCESS &&
            post_recv1(b, mr, dst + 64, 0, 13) == 0 && !wait_wc(d.cq, 13, &wc),
        "UC: a send with no posted receive succeeds at the sender and is dropped");
  memset(dst, 0, 64);
  memcpy(src, "written", 8);
  CHECK(post(a, IBV_WR_RDMA_WRITE, mr, src, 8, (uintptr_t)dst, mr->rkey, 14) == 0 && wait_wc(d.cq, 14, &wc) &&
            wc.opcode == IBV_WC_RDMA_WRITE && memcmp(dst, "written", 8) == 0,
        "RDMA WRITE lands in the peer's registered memory");
  CHECK(post(a, IBV_WR_RDMA_WRITE_WITH_IMM, mr, src, 8, (uintptr_t)dst + 32, mr->rkey, 16) == 0 &&
            wait_wc(d.cq, 13, &wc) && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc.wc_flags & IBV_WC_WITH_IMM) &&
            wc.imm_data == 0x1234 && memcmp(dst + 32, "written", 8) == 0,
        "RDMA WRITE with immediate consumes a receive and reports the immediate");
  CHECK(post_recv1(b, mr, dst, 8192, 17) == 0 && post(a, IBV_WR_SEND, mr, src, 12, 0, 0, 18) == 0 &&
            wait_wc(d.cq, 17, &wc) && wc.status == IBV_WC_LOC_LEN_ERR,
        "Apple: a receive whose 4 KiB frame count differs from the send's fails (local length error)");
  CHECK(strcmp(rdma_wc_status_str(IBV_WC_LOC_LEN_ERR), "local length error") == 0 &&
            strstr(rdma_wc_status_str(IBV_WC_RETRY_EXC_ERR), "retry counter exceeded"),
        "completion statuses in words");
  stashed = 0;
  v.destroy_qp(a);
  v.destroy_qp(b);
  v.dereg_mr(mr);
  munmap(mem, n * 2);
  close_dev(&d);
}

static void test_rc_profile(void) {
  setenv("ORCHARD_FAKE_VERBS_PROFILE", "rc", 1);
  dev d = open_dev(1);
  uint8_t *mem = map(8192);
  struct ibv_mr *mr = v.reg_mr(d.pd, mem, 8192, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_qp *a = qp_new(&d, IBV_QPT_RC), *b = qp_new(&d, IBV_QPT_RC);
  CHECK(mr && a && b, "the rc profile creates RC queue pairs");
  if (!mr || !a || !b) return;
  to_init(a), to_init(b);
  CHECK(to_rtr(a, b->qp_num, 1, IBV_MTU_4096) == 0 && to_rtr(b, a->qp_num, 1, IBV_MTU_4096) == 0 && to_rts(a) == 0,
        "RC: INIT, RTR (MTU 4096 allowed), RTS");
  struct ibv_wc wc;
  CHECK(post(a, IBV_WR_RDMA_WRITE, mr, mem, 8, (uintptr_t)mem + 4096, mr->rkey, 1) == 0 && wait_wc(d.cq, 1, &wc) &&
            wc.status == IBV_WC_REM_ACCESS_ERR,
        "RC: a write to memory registered without remote write fails (remote access error)");
  CHECK(to_rts(b) == 0 && v.destroy_qp(b) == 0, "the peer QP goes away");
  struct ibv_qp_attr at;
  memset(&at, 0, sizeof at);
  at.qp_state = IBV_QPS_RESET;
  v.modify_qp(a, &at, IBV_QP_STATE);
  to_init(a), to_rtr(a, 0x7fffff, 1, IBV_MTU_1024), to_rts(a);
  CHECK(post(a, IBV_WR_SEND, mr, mem, 8, 0, 0, 2) == 0 && wait_wc(d.cq, 2, &wc) && wc.status == IBV_WC_RETRY_EXC_ERR,
        "RC: a send to a vanished peer fails (retry counter exceeded)");
  stashed = 0;
  v.destroy_qp(a);
  v.dereg_mr(mr);
  munmap(mem, 8192);
  close_dev(&d);
  unsetenv("ORCHARD_FAKE_VERBS_PROFILE");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fake_verbs_test PATH_OF_FAKE_VERBS\n");
    return 2;
  }
  char dir[] = "/tmp/orchard-fake-verbs-test-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  setenv("ORCHARD_FAKE_VERBS_DIR", dir, 1);
  setenv("ORCHARD_VERBS_LIB", argv[1], 1);
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
#define SYM(f, name) (*(void **)(&v.f) = dlsym(h, name))
  SYM(get_device_list, "ibv_get_device_list"), SYM(open_device, "ibv_open_device");
  SYM(close_device, "ibv_close_device"), SYM(alloc_pd, "ibv_alloc_pd"), SYM(dealloc_pd, "ibv_dealloc_pd");
  SYM(create_cq, "ibv_create_cq"), SYM(destroy_cq, "ibv_destroy_cq"), SYM(create_qp, "ibv_create_qp");
  SYM(destroy_qp, "ibv_destroy_qp"), SYM(modify_qp, "ibv_modify_qp"), SYM(reg_mr, "ibv_reg_mr");
  SYM(dereg_mr, "ibv_dereg_mr");
#undef SYM
  test_ceilings();
  test_rules();
  test_rc_profile();
  test_rtr_errno(); /* last: it wedges rdma_en3 until the state directory goes */
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  if (failures) {
    printf("FAIL %d/%d\n", failures, checks);
    return 1;
  }
  printf("PASS %d\n", checks);
  return 0;
}
