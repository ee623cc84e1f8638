/* TEST DOUBLE: a library exporting liborchard's symbols with a different ABI version, so the
 * binding's version check can be tested. Built only for tests. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT uint32_t orch_abi_version(void) { return 999; }
EXPORT const char *orch_version(void) { return "9.9.9"; }
EXPORT const char *orch_status_str(int32_t s) { (void)s; return "mismatch"; }
EXPORT void orch_free(void *p) { free(p); }
EXPORT int32_t orch_json_escape(const char *in, char *out, size_t cap, size_t *needed) {
  (void)in, (void)out, (void)cap, (void)needed;
  return -1;
}
EXPORT char *orch_probe_json(uint32_t flags, uint32_t timeout_ms) {
  (void)flags, (void)timeout_ms;
  return NULL;
}
