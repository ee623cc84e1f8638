/* Internal declarations shared by liborchard's translation units. Not part of the ABI. */
#ifndef ORCH_INTERNAL_H
#define ORCH_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/orchard.h"

#define ORCH_VERSION_STRING "0.1.0"

/* ---- growable JSON writer (json.c) ---- */
typedef struct jbuf {
  char *data;
  size_t len;
  size_t cap;
  bool oom;      /* sticky: set when an allocation failed */
  bool need_sep; /* a value was written at the current nesting level */
} jbuf;

void jb_init(jbuf *b);
void jb_free(jbuf *b);
char *jb_take(jbuf *b); /* returns the NUL-terminated text (caller frees) or NULL on OOM */
void jb_raw(jbuf *b, const char *s, size_t n);
void jb_obj_open(jbuf *b);
void jb_obj_close(jbuf *b);
void jb_arr_open(jbuf *b);
void jb_arr_close(jbuf *b);
void jb_key(jbuf *b, const char *key);          /* writes "key": inside an object */
void jb_str(jbuf *b, const char *s);            /* s NULL writes null */
void jb_strf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void jb_int(jbuf *b, int64_t v);
void jb_uint(jbuf *b, uint64_t v);
void jb_num(jbuf *b, double v);                 /* non-finite writes null */
void jb_bool(jbuf *b, bool v);
void jb_null(jbuf *b);
void jb_json(jbuf *b, const char *json);        /* splices a complete JSON value */
/* Escapes s into out (cap bytes); returns bytes needed including NUL. */
size_t json_escape_into(const char *s, char *out, size_t cap);

/* ---- time (util.c) ---- */
uint64_t orch_now_ns(void);   /* monotonic */
uint64_t orch_wall_ms(void);  /* epoch ms */
void orch_copy(char *dst, size_t cap, const char *src); /* bounded, always NUL-terminated */

/* Runs argv[0] (absolute path) with a deadline, capturing up to cap-1 bytes of stdout.
 * Kills the child on timeout. Returns ORCH_OK, ORCH_ERR_TIMEOUT or ORCH_ERR_IO. */
int32_t orch_run_cmd(const char *const argv[], uint32_t timeout_ms, char *out, size_t cap, int *exit_code);

/* ---- probe sections (platform files) ---- */
/* Each writer appends one value for its section; on failure it returns false after writing
 * nothing and fills err with a short message. */
typedef struct probe_err {
  char section[24];
  char code[16];  /* "unsupported" | "failed" | "timeout" */
  char message[256];
} probe_err;

bool sys_probe_os(jbuf *b, probe_err *e);
bool sys_probe_machine(jbuf *b, probe_err *e);
bool sys_probe_cpu(jbuf *b, probe_err *e);
bool sys_probe_memory(jbuf *b, probe_err *e);
bool sys_probe_thermal(jbuf *b, probe_err *e);
/* rdma_ctl state on macOS: "enabled" | "disabled" | NULL (not applicable / failed, see e). */
const char *sys_rdma_ctl_state(uint32_t timeout_ms, probe_err *e);
bool gpu_probe(jbuf *b, probe_err *e); /* gpu_metal.m on macOS, gpu_none.c elsewhere */
bool net_probe_interfaces(jbuf *b, probe_err *e);
/* Looks up the first IPv4 address of interface ifname into out; false when none. */
bool net_iface_ipv4(const char *ifname, char *out, size_t cap);

/* ---- verbs (verbs.c) ---- */
/* Writes the "rdma" section body fields (library, devices, usable) into an open object.
 * rdma_ctl is the macOS state or NULL. Bounded by timeout_ms; returns false with e on timeout. */
bool verbs_probe(jbuf *b, const char *rdma_ctl, uint32_t timeout_ms, probe_err *e);

/* Classifies a raw 16-byte GID: "ipv4-mapped", "link-local", "zero" or "other";
 * writes the dotted IPv4 for ipv4-mapped into ipv4 (cap >= 16). */
const char *gid_kind(const uint8_t gid[16], char *ipv4, size_t cap);
/* Formats a GID as IPv6 text. */
void gid_format(const uint8_t gid[16], char *out, size_t cap);

/* Decides whether a port can carry the link test and why not. */
typedef struct port_facts {
  const char *device;       /* rdma_en2 */
  bool apple;               /* transport 100 / librdma */
  int state;                /* ibv_port_state */
  int link_layer;           /* IBV_LINK_LAYER_* */
  uint16_t lid;
  int ipv4_gid_index;       /* -1 when none */
  int any_gid_index;        /* first non-zero GID, -1 when none */
  const char *rdma_ctl;     /* "enabled" | "disabled" | NULL */
} port_facts;
bool port_usable(const port_facts *f, int *gid_index, char *reason, size_t cap);

#endif
