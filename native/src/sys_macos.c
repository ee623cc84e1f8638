/* macOS probe sections: sysctl, Mach VM statistics and rdma_ctl. Compiled only on Apple
 * platforms (thermal state and the GPU live in apple.m). Not compiled in Linux CI: verify on
 * a Mac with the checklist in native/README.md. */
#include <mach/mach.h>
#include <stdio.h>
#include <string.h>
#include <sys/sysctl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "internal.h"

static bool sysctl_str(const char *name, char *out, size_t cap) {
  size_t len = cap;
  if (sysctlbyname(name, out, &len, NULL, 0) != 0 || len == 0) return false;
  out[len < cap ? len : cap - 1] = '\0';
  return true;
}

static bool sysctl_i64(const char *name, int64_t *out) {
  int64_t v64 = 0;
  size_t len = sizeof v64;
  if (sysctlbyname(name, &v64, &len, NULL, 0) != 0) return false;
  if (len == sizeof(int32_t)) {
    int32_t v32;
    memcpy(&v32, &v64, sizeof v32);
    *out = v32;
  } else {
    *out = v64;
  }
  return true;
}

bool sys_probe_os(jbuf *b, probe_err *e) {
  struct utsname u;
  if (uname(&u) != 0) {
    snprintf(e->message, sizeof e->message, "uname failed");
    return false;
  }
  char version[64], build[64];
  bool hv = sysctl_str("kern.osproductversion", version, sizeof version);
  bool hb = sysctl_str("kern.osversion", build, sizeof build);
  jb_obj_open(b);
  jb_key(b, "name"); jb_str(b, "macOS");
  jb_key(b, "version"); jb_str(b, hv ? version : NULL);
  jb_key(b, "pretty_name"); if (hv) jb_strf(b, "macOS %s", version); else jb_null(b);
  jb_key(b, "build"); jb_str(b, hb ? build : NULL);
  jb_key(b, "kernel"); jb_str(b, u.release);
  jb_key(b, "arch"); jb_str(b, u.machine);
  jb_key(b, "hostname"); jb_str(b, u.nodename);
  jb_obj_close(b);
  return true;
}

bool sys_probe_machine(jbuf *b, probe_err *e) {
  char model[128];
  if (!sysctl_str("hw.model", model, sizeof model)) {
    snprintf(e->message, sizeof e->message, "sysctl hw.model failed");
    return false;
  }
  jb_obj_open(b);
  jb_key(b, "model"); jb_str(b, model);
  jb_key(b, "vendor"); jb_str(b, "Apple");
  jb_obj_close(b);
  return true;
}

bool sys_probe_cpu(jbuf *b, probe_err *e) {
  (void)e;
  char brand[256];
  bool hb = sysctl_str("machdep.cpu.brand_string", brand, sizeof brand);
  int64_t logical = 0, physical = 0, levels = 0, perf = 0, eff = 0;
  bool hl = sysctl_i64("hw.logicalcpu", &logical);
  bool hp = sysctl_i64("hw.physicalcpu", &physical);
  bool hn = sysctl_i64("hw.nperflevels", &levels);
  /* perflevel0 = performance cores, perflevel1 = efficiency cores (Apple silicon). */
  bool hpf = sysctl_i64("hw.perflevel0.logicalcpu", &perf);
  bool hef = hn && levels > 1 && sysctl_i64("hw.perflevel1.logicalcpu", &eff);
  jb_obj_open(b);
  jb_key(b, "brand"); jb_str(b, hb ? brand : NULL);
  jb_key(b, "logical_cores"); if (hl) jb_int(b, logical); else jb_null(b);
  jb_key(b, "physical_cores"); if (hp) jb_int(b, physical); else jb_null(b);
  jb_key(b, "performance_cores"); if (hpf) jb_int(b, perf); else jb_null(b);
  jb_key(b, "efficiency_cores"); if (hef) jb_int(b, eff); else if (hn && levels == 1) jb_int(b, 0); else jb_null(b);
  jb_obj_close(b);
  return true;
}

bool sys_probe_memory(jbuf *b, probe_err *e) {
  int64_t total = 0;
  if (!sysctl_i64("hw.memsize", &total)) {
    snprintf(e->message, sizeof e->message, "sysctl hw.memsize failed");
    return false;
  }
  vm_statistics64_data_t vm;
  mach_msg_type_number_t count = HOST_VM_INFO64_COUNT;
  mach_port_t host = mach_host_self();
  kern_return_t kr = host_statistics64(host, HOST_VM_INFO64, (host_info64_t)&vm, &count);
  mach_port_deallocate(mach_task_self(), host);
  vm_size_t page = 0;
  host_page_size(mach_host_self(), &page);
  int64_t level = 0;
  bool hl = sysctl_i64("kern.memorystatus_vm_pressure_level", &level);
  const char *pressure = !hl ? "unknown" : level <= 1 ? "normal" : level == 2 ? "warning" : "critical";
  jb_obj_open(b);
  jb_key(b, "total_bytes"); jb_uint(b, (uint64_t)total);
  jb_key(b, "available_bytes");
  if (kr == KERN_SUCCESS && page) {
    /* Roughly what Activity Monitor treats as reclaimable without swapping. */
    uint64_t pages = (uint64_t)vm.free_count + vm.inactive_count + vm.purgeable_count + vm.speculative_count;
    jb_uint(b, pages * (uint64_t)page);
  } else {
    jb_null(b);
  }
  jb_key(b, "pressure"); jb_str(b, pressure);
  jb_key(b, "pressure_source"); jb_str(b, hl ? "kern.memorystatus_vm_pressure_level" : NULL);
  jb_key(b, "pressure_value"); if (hl) jb_int(b, level); else jb_null(b);
  jb_obj_close(b);
  return true;
}

const char *sys_rdma_ctl_state(uint32_t timeout_ms, probe_err *e) {
  static const char *paths[] = {"/usr/bin/rdma_ctl", "/usr/sbin/rdma_ctl"};
  const char *path = NULL;
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    if (access(paths[i], X_OK) == 0) {
      path = paths[i];
      break;
    }
  }
  if (!path) {
    orch_copy(e->code, sizeof e->code, "unsupported");
    snprintf(e->message, sizeof e->message, "rdma_ctl not found: Thunderbolt RDMA needs macOS 26.2 or later");
    return NULL;
  }
  const char *argv[] = {path, "status", NULL};
  char out[256];
  int code = -1;
  int32_t rc = orch_run_cmd(argv, timeout_ms, out, sizeof out, &code);
  if (rc != ORCH_OK) {
    orch_copy(e->code, sizeof e->code, rc == ORCH_ERR_TIMEOUT ? "timeout" : "failed");
    snprintf(e->message, sizeof e->message, "rdma_ctl status: %s", orch_status_str(rc));
    return NULL;
  }
  if (strstr(out, "disabled")) return "disabled";
  if (strstr(out, "enabled")) return "enabled";
  orch_copy(e->code, sizeof e->code, "failed");
  snprintf(e->message, sizeof e->message, "rdma_ctl status printed neither enabled nor disabled (exit %d)", code);
  return NULL;
}
