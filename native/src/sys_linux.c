/* Linux probe sections: /etc/os-release, /proc and /sys. Compiled on non-Apple platforms. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "internal.h"

static bool read_line_file(const char *path, char *out, size_t cap) {
  FILE *f = fopen(path, "re");
  if (!f) return false;
  bool ok = fgets(out, (int)cap, f) != NULL;
  fclose(f);
  if (!ok) return false;
  out[strcspn(out, "\r\n")] = '\0';
  return true;
}

/* Reads KEY=value (optionally quoted) from /etc/os-release. */
static bool os_release(const char *key, char *out, size_t cap) {
  FILE *f = fopen("/etc/os-release", "re");
  if (!f) f = fopen("/usr/lib/os-release", "re");
  if (!f) return false;
  char line[512];
  size_t klen = strlen(key);
  bool found = false;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, klen) != 0 || line[klen] != '=') continue;
    char *v = line + klen + 1;
    v[strcspn(v, "\r\n")] = '\0';
    size_t n = strlen(v);
    if (n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0]) {
      v[n - 1] = '\0';
      v++;
    }
    orch_copy(out, cap, v);
    found = true;
    break;
  }
  fclose(f);
  return found;
}

bool sys_probe_os(jbuf *b, probe_err *e) {
  struct utsname u;
  if (uname(&u) != 0) {
    snprintf(e->message, sizeof e->message, "uname failed");
    return false;
  }
  char version[128] = "", pretty[256] = "";
  bool hv = os_release("VERSION_ID", version, sizeof version);
  bool hp = os_release("PRETTY_NAME", pretty, sizeof pretty);
  jb_obj_open(b);
  jb_key(b, "name"); jb_str(b, "Linux");
  jb_key(b, "version"); jb_str(b, hv ? version : NULL);
  jb_key(b, "pretty_name"); jb_str(b, hp ? pretty : NULL);
  jb_key(b, "build"); jb_null(b);
  jb_key(b, "kernel"); jb_str(b, u.release);
  jb_key(b, "arch"); jb_str(b, u.machine);
  jb_key(b, "hostname"); jb_str(b, u.nodename);
  jb_obj_close(b);
  return true;
}

bool sys_probe_machine(jbuf *b, probe_err *e) {
  (void)e;
  char model[256] = "", vendor[256] = "";
  bool hm = read_line_file("/sys/class/dmi/id/product_name", model, sizeof model) ||
            read_line_file("/proc/device-tree/model", model, sizeof model);
  bool hv = read_line_file("/sys/class/dmi/id/sys_vendor", vendor, sizeof vendor);
  jb_obj_open(b);
  jb_key(b, "model"); jb_str(b, hm && model[0] ? model : NULL);
  jb_key(b, "vendor"); jb_str(b, hv && vendor[0] ? vendor : NULL);
  jb_obj_close(b);
  return true;
}

/* Counts CPUs in a cpulist file such as "0-7,16-23"; -1 when absent. */
static int cpulist_count(const char *path) {
  char line[512];
  if (!read_line_file(path, line, sizeof line)) return -1;
  int count = 0;
  for (char *tok = strtok(line, ","); tok; tok = strtok(NULL, ",")) {
    int a, c;
    if (sscanf(tok, "%d-%d", &a, &c) == 2 && c >= a) count += c - a + 1;
    else if (sscanf(tok, "%d", &a) == 1) count += 1;
  }
  return count;
}

bool sys_probe_cpu(jbuf *b, probe_err *e) {
  (void)e;
  char brand[256] = "";
  int physical = 0;
  FILE *f = fopen("/proc/cpuinfo", "re");
  if (f) {
    char line[512];
    /* physical cores = distinct (physical id, core id) pairs */
    int ids[1024][2];
    int nids = 0, phys = 0;
    while (fgets(line, sizeof line, f)) {
      char *colon = strchr(line, ':');
      if (!colon) continue;
      char *v = colon + 1;
      while (*v == ' ') v++;
      v[strcspn(v, "\n")] = '\0';
      if (!brand[0] && (strncmp(line, "model name", 10) == 0 || strncmp(line, "Model", 5) == 0)) {
        orch_copy(brand, sizeof brand, v);
      } else if (strncmp(line, "physical id", 11) == 0) {
        phys = atoi(v);
      } else if (strncmp(line, "core id", 7) == 0) {
        int core = atoi(v);
        bool seen = false;
        for (int i = 0; i < nids; i++) seen = seen || (ids[i][0] == phys && ids[i][1] == core);
        if (!seen && nids < 1024) {
          ids[nids][0] = phys;
          ids[nids][1] = core;
          nids++;
        }
      }
    }
    fclose(f);
    physical = nids;
  }
  long logical = sysconf(_SC_NPROCESSORS_ONLN);
  int perf = cpulist_count("/sys/devices/cpu_core/cpus");  /* Intel hybrid P-cores */
  int eff = cpulist_count("/sys/devices/cpu_atom/cpus");   /* Intel hybrid E-cores */
  jb_obj_open(b);
  jb_key(b, "brand"); jb_str(b, brand[0] ? brand : NULL);
  jb_key(b, "logical_cores"); if (logical > 0) jb_int(b, logical); else jb_null(b);
  jb_key(b, "physical_cores"); if (physical > 0) jb_int(b, physical); else jb_null(b);
  jb_key(b, "performance_cores"); if (perf > 0) jb_int(b, perf); else jb_null(b);
  jb_key(b, "efficiency_cores"); if (eff > 0) jb_int(b, eff); else jb_null(b);
  jb_obj_close(b);
  return true;
}

bool sys_probe_memory(jbuf *b, probe_err *e) {
  FILE *f = fopen("/proc/meminfo", "re");
  if (!f) {
    snprintf(e->message, sizeof e->message, "cannot read /proc/meminfo");
    return false;
  }
  unsigned long long total = 0, avail = 0;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    unsigned long long kb;
    if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) total = kb * 1024ull;
    else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = kb * 1024ull;
  }
  fclose(f);
  if (!total) {
    snprintf(e->message, sizeof e->message, "MemTotal missing from /proc/meminfo");
    return false;
  }
  /* PSI: share of time some task stalled on memory over the last 10 s. */
  double some10 = -1;
  char psi[256];
  if (read_line_file("/proc/pressure/memory", psi, sizeof psi)) {
    if (sscanf(psi, "some avg10=%lf", &some10) != 1) some10 = -1;
  }
  const char *level = some10 < 0 ? "unknown" : some10 < 10 ? "normal" : some10 < 40 ? "warning" : "critical";
  jb_obj_open(b);
  jb_key(b, "total_bytes"); jb_uint(b, total);
  jb_key(b, "available_bytes"); jb_uint(b, avail);
  jb_key(b, "pressure"); jb_str(b, level);
  jb_key(b, "pressure_source"); jb_str(b, some10 < 0 ? NULL : "/proc/pressure/memory some avg10");
  jb_key(b, "pressure_value"); if (some10 < 0) jb_null(b); else jb_num(b, some10);
  jb_obj_close(b);
  return true;
}

bool sys_probe_thermal(jbuf *b, probe_err *e) {
  (void)e;
  double max_c = -1000;
  DIR *d = opendir("/sys/class/thermal");
  if (d) {
    struct dirent *de;
    while ((de = readdir(d))) {
      if (strncmp(de->d_name, "thermal_zone", 12) != 0) continue;
      char path[512], line[64];
      snprintf(path, sizeof path, "/sys/class/thermal/%s/temp", de->d_name);
      if (read_line_file(path, line, sizeof line)) {
        double c = atof(line) / 1000.0;
        if (c > max_c) max_c = c;
      }
    }
    closedir(d);
  }
  jb_obj_open(b);
  jb_key(b, "state"); jb_str(b, "unknown");
  jb_key(b, "source"); jb_str(b, max_c > -1000 ? "sysfs thermal zones" : NULL);
  jb_key(b, "max_zone_celsius"); if (max_c > -1000) jb_num(b, max_c); else jb_null(b);
  jb_obj_close(b);
  return true;
}

const char *sys_rdma_ctl_state(uint32_t timeout_ms, probe_err *e) {
  (void)timeout_ms;
  e->code[0] = '\0'; /* not applicable on Linux: no error */
  return NULL;
}
