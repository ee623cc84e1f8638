/* orch_probe_json: assembles orchard.probe/1 from the platform sections. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define MAX_ERRS 16

typedef struct probe_ctx {
  jbuf *b;
  probe_err errs[MAX_ERRS];
  size_t nerrs;
} probe_ctx;

static void add_err(probe_ctx *c, const char *section, const probe_err *e) {
  if (c->nerrs >= MAX_ERRS) return;
  probe_err *d = &c->errs[c->nerrs++];
  orch_copy(d->section, sizeof d->section, section);
  orch_copy(d->code, sizeof d->code, e->code[0] ? e->code : "failed");
  orch_copy(d->message, sizeof d->message, e->message[0] ? e->message : "unknown failure");
}

/* Runs one section writer; on failure rolls back partial output, writes null and records it. */
static void section(probe_ctx *c, const char *key, bool (*fn)(jbuf *, probe_err *)) {
  jb_key(c->b, key);
  size_t mark = c->b->len;
  probe_err e;
  memset(&e, 0, sizeof e);
  if (fn(c->b, &e)) return;
  c->b->len = mark;
  if (c->b->data) c->b->data[mark] = '\0';
  c->b->need_sep = false;
  jb_null(c->b);
  add_err(c, key, &e);
}

ORCH_API char *orch_probe_json(uint32_t flags, uint32_t timeout_ms) {
  if (timeout_ms == 0) timeout_ms = 5000;
  uint64_t t0 = orch_now_ns();
  uint64_t deadline = t0 + (uint64_t)timeout_ms * 1000000ull;
  jbuf b;
  jb_init(&b);
  probe_ctx c = {.b = &b, .nerrs = 0};
  jb_obj_open(&b);
  jb_key(&b, "schema"); jb_str(&b, "orchard.probe/1");
  jb_key(&b, "liborchard");
  jb_obj_open(&b);
  jb_key(&b, "version"); jb_str(&b, ORCH_VERSION_STRING);
  jb_key(&b, "abi"); jb_uint(&b, ORCH_ABI_VERSION);
  jb_obj_close(&b);
  jb_key(&b, "taken_at_ms"); jb_uint(&b, orch_wall_ms());
  section(&c, "os", sys_probe_os);
  section(&c, "machine", sys_probe_machine);
  section(&c, "cpu", sys_probe_cpu);
  section(&c, "memory", sys_probe_memory);
  if (flags & ORCH_PROBE_SKIP_GPU) {
    jb_key(&b, "gpu"); jb_null(&b);
    probe_err e = {.code = "skipped", .message = "GPU probe skipped by flag"};
    add_err(&c, "gpu", &e);
  } else {
    section(&c, "gpu", gpu_probe);
  }
  section(&c, "thermal", sys_probe_thermal);

  /* RDMA: the slow, hang-prone part; it gets what is left of the budget. */
  jb_key(&b, "rdma");
  if (flags & ORCH_PROBE_SKIP_RDMA) {
    jb_null(&b);
    probe_err e = {.code = "skipped", .message = "RDMA probe skipped by flag"};
    add_err(&c, "rdma", &e);
  } else {
    uint64_t now = orch_now_ns();
    uint32_t left = now < deadline ? (uint32_t)((deadline - now) / 1000000ull) : 0;
    if (left < 50) left = 50;
    probe_err ctl_err;
    memset(&ctl_err, 0, sizeof ctl_err);
    const char *ctl = sys_rdma_ctl_state(left / 2, &ctl_err);
    if (!ctl && ctl_err.code[0]) add_err(&c, "rdma_ctl", &ctl_err);
    now = orch_now_ns();
    left = now < deadline ? (uint32_t)((deadline - now) / 1000000ull) : 0;
    if (left < 50) left = 50;
    size_t mark = b.len;
    probe_err e;
    memset(&e, 0, sizeof e);
    jb_obj_open(&b);
    if (verbs_probe(&b, ctl, left, &e)) {
      jb_obj_close(&b);
    } else {
      b.len = mark;
      if (b.data) b.data[mark] = '\0';
      b.need_sep = false;
      jb_null(&b);
      add_err(&c, "rdma", &e);
    }
  }
  section(&c, "interfaces", net_probe_interfaces);

  jb_key(&b, "duration_ms"); jb_num(&b, (double)(orch_now_ns() - t0) / 1e6);
  jb_key(&b, "errors");
  jb_arr_open(&b);
  for (size_t i = 0; i < c.nerrs; i++) {
    jb_obj_open(&b);
    jb_key(&b, "section"); jb_str(&b, c.errs[i].section);
    jb_key(&b, "code"); jb_str(&b, c.errs[i].code);
    jb_key(&b, "message"); jb_str(&b, c.errs[i].message);
    jb_obj_close(&b);
  }
  jb_arr_close(&b);
  jb_obj_close(&b);
  return jb_take(&b);
}
